"""Fuzzing the query builder the way a new user and an attacker would write queries.

Each case is drawn from a seeded generator: filters comparing columns with constants of every
type (NaN, infinities, huge and negative numbers, category names and strangers, booleans,
None, NumPy scalars), ``between`` with its bounds either way round, ``isin`` with empty,
repeated and unknown values, nested with ``& | ~``; zero to three group keys (among them a
float column, a column whose bounds are not finite, a huge integer domain, a key twice, keys
declared by the caller); one to four aggregates on any column (unknown ones and wrong dtypes
too, quantiles outside [0, 1] or NaN, repeated aliases); sometimes a top-k; any epsilon and
delta. The table has integer, float, bool and categorical columns, and subjects with several
rows; one column's bounds are made infinite in the handle, as a node would list a column
without finite bounds.

The oracles, through the real app:

- it answers: a ``QueryResult`` with one column per key and per aggregate and its scale, one
  row per public group (or the top-k's), every value finite and within what the statistic
  must respect (a mean, a quantile, min and max within the column's bounds, an integer
  column's quantiles integers, a spread within Popoviciu's bound, counts within the rows), its
  notebook view each statistic beside its error bar, and the receipts charged the epsilon
  asked (at most, with delta), one ledger row per publish;
- or it refuses with a typed ``DPNodeError`` subclass whose message names what it refuses (a
  column, an aggregate, the constant, epsilon or delta...), never a Python error leaking out
  nor a 500, and the refusal charges nothing (no new ledger row).

Every fourth case is also dry-run in mock mode (``sdk.mock``), which must answer where the
node answered and refuse alike where the SDK refused, charging nothing. NumPy's overflow
and invalid-value warnings fail a case.

``DPNODE_FUZZ_CASES`` sets the number of cases (default 200; 2,000 run in about five minutes
when hunting). A failure prints each failing case's seed and the query as written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from dpnode import sdk
from dpnode.core.engine import GraphBuilder
from dpnode.sdk import query as dq
from dpnode.sdk._handles import ColumnInfo
from dpnode.sdk._remote.graph import encode_graph
from dpnode.sdk._remote.privacy import CALLS
from dpnode.sdk.query import col
from tests.sdk.query_cases import (
    COLUMNS,
    MOCK_ROWS,
    REGIONS,
    UNBOUNDED,
    Case,
    N,
    draw,
    groups_of,
    table,
)
from tests.sdk.query_table import unbounded

CASES = int(os.environ.get("DPNODE_FUZZ_CASES", "200"))


# -- the oracles -------------------------------------------------------------------------------


def _outputs(case: Case) -> list[tuple[str, str, str | None]]:
    """(output name, kind, column) of each aggregate, as the builder names them."""
    out = []
    for kind, alias, column in case.outputs:
        if alias:
            name = alias
        elif kind == "count":
            name = "count"
        elif kind == "quantile":
            name = ""  # named by q: read from the result's columns below
        else:
            name = f"{column}_{kind}"
        out.append((name, kind, column))
    return out


def _check_answer(case: Case, result: Any, new: list[Any], mock: bool) -> str | None:
    """What is wrong with an answer (``new``: the ledger rows it added), or None."""
    if not isinstance(result, dq.QueryResult):
        return f"returned {type(result).__name__}, not a QueryResult"
    frame = result.frame
    outputs = _outputs(case)
    names = [c for c in frame.columns if c not in case.keys and not c.endswith("_scale")]
    if case.top is not None and "count" not in [n for n, _, _ in outputs]:
        outputs = [("count", "count", None), *outputs]
    if len(names) != len(outputs):
        return f"columns {list(frame.columns)} for outputs {outputs}"
    expected = [*case.keys]
    for (name, _, _), got in zip(outputs, names, strict=True):
        if name and got != name:
            return f"output {got!r} where {name!r} was expected"
        expected += [got, f"{got}_scale"]
    if list(frame.columns) != expected:
        return f"columns {list(frame.columns)}, expected {expected}"
    rows = case.groups if case.top is None else min(case.groups, int(case.top))
    if len(frame) != rows:
        return f"{len(frame)} rows for {case.groups} group(s), top_k {case.top!r}"
    for (_, kind, column), got in zip(outputs, names, strict=True):
        values, scales = frame[got].to_numpy(float), frame[f"{got}_scale"].to_numpy(float)
        if not (np.isfinite(values).all() and np.isfinite(scales).all() and (scales >= 0).all()):
            return f"{got}: values {values} scales {scales}: not finite (or a negative scale)"
        wrong = _outside(kind, column, values, MOCK_ROWS if mock else N)
        if wrong:
            return f"{got}: {wrong}"
    html = result._repr_html_()  # a notebook's view: each statistic beside its error bar
    bars = [b for n in names for b in result.error_bars[n]]
    noise_bars = bool(re.search(r"<td>[^<(]+ ± [^<]+</td>", html))
    if "_scale</th>" in html or noise_bars != any(b and not b.rank for b in bars):
        return f"a notebook shows {html}"
    asked = float(case.epsilon)
    spends = result.receipt.spends
    charged = result.receipt.charged_epsilon
    if len(new) != (0 if mock else len(spends)) or result.receipt.mock != (mock and bool(spends)):
        return f"{len(new)} ledger rows for {len(spends)} publishes (mock: {mock})"
    if spends:
        # each publish's share is charged rounded down to the ledger's unit, 1e-9 (its
        # noise calibrated to that); a Gaussian one may take less than it asks
        least = asked - 1e-9 * len(spends) if case.delta is None else 0.0
        if not least <= charged <= asked:
            return f"charged epsilon {charged!r} for {asked!r} asked"
    return None


def _outside(kind: str, column: str | None, values: np.ndarray, rows: int) -> str | None:
    """What a statistic's values break of what it must respect, or None."""
    selected = kind in ("median", "quantile", "min", "max")
    if kind == "count":
        lo, hi = 0.0, float(rows)
    elif kind == "count_distinct":  # at most the rows, and a column's public keys
        ints = COLUMNS[column or ""][0][0] in "ibc"
        lo, hi = 0.0, float(min(rows, groups_of(column or "")) if ints else rows)
    elif kind == "sum":
        return None
    else:
        dt, lo, hi = COLUMNS[column or ""]
        if kind in ("var", "std"):
            lo, hi = 0.0, ((hi - lo) / 2) ** (2 if kind == "var" else 1)
        elif selected and dt.startswith("int") and not np.array_equal(values, np.round(values)):
            return f"an integer column's {kind} is not an integer: {values}"
    if (values < lo).any() or (values > hi).any():
        return f"values {values} outside [{lo:g}, {hi:g}]"
    return None


def _named(case: Case, exc: Exception) -> bool:
    """A refusal that names one of the constructs the query used."""
    message = str(exc)
    return any(w in message for w in case.words if len(w) > 1 or w in ("q", "3"))


@pytest.fixture
def fuzz_table(
    owner_client: sdk.Client, admin_client: sdk.Client, ds_client: sdk.Client
) -> sdk.DatasetHandle:
    data = table(0, N)
    owner_client.upload_dataset(
        "fuzzed",
        data,
        bounds={k: (lo, hi) for k, (dt, lo, hi) in COLUMNS.items() if dt[0] in "if"},
        categories={"region": REGIONS},
        subject_id="patient",
        mock=table(1, MOCK_ROWS),
    )
    admin_client.set_policy(
        "[roles.data_scientist]\nepsilon = 1000000.0\ndelta = 0.5\n", reason="fuzzing"
    )
    return unbounded(ds_client.dataset("fuzzed"), UNBOUNDED)


def _newest(client: sdk.Client) -> int:
    entries = client.ledger_entries(limit=1)
    return entries[0].id if entries else 0


def _one_case(ds: sdk.DatasetHandle, client: sdk.Client, case: Case, mock: bool = False) -> str:
    """``answered``, ``refused: <the error's type>``, or what went wrong. ``mock``: a dry
    run on the mock data (``sdk.mock``), which must charge nothing either."""
    before = _newest(client)
    try:
        query = ds.query()
        for step in case.build:
            query = step(query)
        with sdk.mock(ds) if mock else contextlib.nullcontext():
            result = query.publish(epsilon=case.epsilon, delta=case.delta)
    except sdk.ServerError as exc:
        return f"500: {exc!r}"
    except sdk.DPNodeError as exc:
        new = [e for e in client.ledger_entries(limit=20) if e.id > before]
        if new:
            return f"refused ({exc!r}) but charged {len(new)} ledger row(s)"
        if not _named(case, exc):
            return f"refused without naming what: {exc!r}"
        return f"refused: {type(exc).__name__}"
    except Exception as exc:
        return f"raised {exc!r}"
    new = [e for e in client.ledger_entries(limit=20) if e.id > before]
    return _check_answer(case, result, new, mock) or "answered"


def _same_in_mock(case: Case, outcome: str, mocked: str) -> bool:
    """Whether a dry run did what the node did: answered if it answered, refused alike if
    the SDK refused (the node's own refusals, of the budget say, are not dry-run). A query
    reading the column whose bounds only the handle makes infinite is dry-run on those, so
    it need only answer or refuse by name."""
    if UNBOUNDED in case.words:
        return mocked == "answered" or mocked.startswith("refused: ")
    if outcome == "answered" or not outcome.startswith("refused: "):
        return mocked == outcome
    refused = getattr(dq, outcome.removeprefix("refused: "), None)
    by_sdk = isinstance(refused, type) and issubclass(refused, dq.QueryError)
    return mocked == outcome or not by_sdk


@pytest.mark.usefixtures("sqlite_only")
@pytest.mark.filterwarnings("error:.*encountered in:RuntimeWarning")  # NumPy's overflow, NaN
def test_random_queries_answer_or_refuse_by_name_charging_nothing(
    fuzz_table: sdk.DatasetHandle, ds_client: sdk.Client
) -> None:
    """Every case through the node, and every fourth one dry-run in mock mode too."""
    outcomes: dict[str, int] = {}
    failures: list[str] = []
    for seed in range(CASES):
        case = draw(seed)
        outcome = _one_case(fuzz_table, ds_client, case)
        if outcome == "answered" or outcome.startswith("refused: "):
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        else:
            failures.append(f"{case}\n    {outcome}")
        if seed % 4 == 0:
            mocked = _one_case(fuzz_table, ds_client, case, mock=True)
            if not _same_in_mock(case, outcome, mocked):
                failures.append(f"{case}\n    {outcome}, but in mock mode {mocked}")
            outcomes[f"mock {mocked}"] = outcomes.get(f"mock {mocked}", 0) + 1
    print(sorted(outcomes.items(), key=lambda kv: -kv[1]))
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n".join(failures)
    # the fuzzer is only worth its time if a good part of what it draws is answered
    assert outcomes.get("answered", 0) >= CASES // 5, outcomes


# -- what the fuzz found, kept ---------------------------------------------------------------------


def _data() -> dict[str, np.ndarray]:
    return table(1, MOCK_ROWS)  # the mock data: what sdk.mock evaluates on


#: comparisons with constants no row can hold, or that an integer column cannot hold (an
#: OverflowError or a node's GraphError before), and the rows each must keep
EXACT: list[tuple[Any, Callable[[dict[str, np.ndarray]], np.ndarray]]] = [
    (col("big") > 10**30, lambda d: d["big"] > 10**30),
    (col("big") <= -(10**30), lambda d: d["big"] < -(2**62)),
    (col("age") < 2**63, lambda d: d["age"] >= 0),
    (col("age") != math.inf, lambda d: d["age"] >= 0),
    (col("visits") == 2.5, lambda d: d["visits"] == -1),
    (col("visits") != 2.5, lambda d: d["visits"] >= 0),
    (col("visits") > 2.5, lambda d: d["visits"] >= 3),
    (col("visits") <= 2.5, lambda d: d["visits"] <= 2),
    (col("visits") >= np.float32(2.0), lambda d: d["visits"] >= 2),
    (col("score") >= 10**30, lambda d: d["score"] > 100),
    (col("income") < 10**400, lambda d: d["income"] >= 0),
    (
        col("age").isin([2.5, 10**30, np.int64(_data()["age"][0])]),
        lambda d: d["age"] == d["age"][0],
    ),
    (col("age").between(10**30, -(10**30)), lambda d: d["age"] < 0),
    (col("smoker") > 0.5, lambda d: d["smoker"]),
]


@pytest.mark.usefixtures("sqlite_only")
def test_a_constant_beyond_the_column_compares_exactly(fuzz_table: sdk.DatasetHandle) -> None:
    with sdk.mock(fuzz_table) as m:
        for predicate, truth in EXACT:
            got = m.evaluate(predicate.mask(fuzz_table))
            assert got.numpy().tolist() == truth(_data()).tolist(), predicate


#: constants a query cannot compare a column with: the refusal's class and the words it uses
NOT_NUMBERS: list[tuple[Any, type[Exception], tuple[str, ...]]] = [
    (col("age") > True, dq.AggregateTypeError, ("'age' is int64, not bool", "(1), not True")),
    (col("bmi") <= np.bool_(False), dq.AggregateTypeError, ("'bmi' is float32", "not False")),
    (col("visits").between(True, 5), dq.AggregateTypeError, ("'visits'", "True")),
    (col("income").isin([1.0, False]), dq.AggregateTypeError, ("'income'", "False")),
    (col("age") == math.nan, dq.QueryError, ("'age'", "nan")),
    (col("bmi").isin([np.float64("nan")]), dq.QueryError, ("'bmi'", "nan")),
]


@pytest.mark.usefixtures("sqlite_only")
def test_a_constant_that_is_no_number_is_refused_by_name_charging_nothing(
    fuzz_table: sdk.DatasetHandle, ds_client: sdk.Client
) -> None:
    for predicate, error, words in NOT_NUMBERS:
        for mock in (False, True):
            with (
                sdk.mock(fuzz_table) if mock else contextlib.nullcontext(),
                pytest.raises(error) as caught,
            ):
                fuzz_table.query().filter(predicate).agg(dq.count()).publish(epsilon=1.0)
            assert all(w in str(caught.value) for w in words), (predicate, caught.value)
    # a boolean column compares with booleans, and negative zero is zero
    with sdk.mock(fuzz_table) as m:
        got = m.evaluate((col("smoker") == True).mask(fuzz_table))  # noqa: E712
        assert got.numpy().tolist() == _data()["smoker"].tolist()
        got = m.evaluate((col("age") > -0.0).mask(fuzz_table))
        assert got.numpy().tolist() == (_data()["age"] > 0).tolist()
    assert ds_client.ledger_entries() == []


#: a torch computation on a column with an integer constant the node's int64 cannot hold
#: (torch raises OverflowError for some and wraps others around: ``x > 2**63`` all true)
HUGE_INTS: list[tuple[Callable[[Any], Any], str, str]] = [
    (lambda x: x > 2**63, "torch.Tensor.gt", "9.223372036854776e+18"),
    (lambda x: x + (-(2**63) - 1), "torch.Tensor.add", "-9.223372036854776e+18"),
    (lambda x: x.clamp(max=2**64), "torch.Tensor.clamp", "1.8446744073709552e+19"),
    (lambda x: torch.where(x > 0, x, 10**400), "torch.where", "float('inf')"),
]


@pytest.mark.usefixtures("sqlite_only")
def test_an_integer_constant_beyond_int64_is_refused_by_name_charging_nothing(
    fuzz_table: sdk.DatasetHandle, ds_client: sdk.Client
) -> None:
    for compute, call, instead in HUGE_INTS:
        with pytest.raises(sdk.GraphError) as caught:
            compute(fuzz_table["age"]).sum().publish(epsilon=1.0)
        message = str(caught.value)
        assert call in message and "does not fit int64" in message and instead in message
        assert CALLS.func is None  # the refused call is not left as the one being recorded
    # the largest and smallest int64 are constants like any other
    with sdk.mock(fuzz_table) as m:
        x = fuzz_table["age"]
        assert m.evaluate((x < 2**63 - 1) & (x > -(2**63))).all()
    assert ds_client.ledger_entries() == []


def test_the_nodes_own_check_of_a_graph_raises_the_sdks_error() -> None:
    """The wire format's check runs in the SDK before a graph is sent: its refusal is the
    SDK's typed error, not the node's class."""
    b = GraphBuilder()
    x = b.input("x", "int64", (3,))
    graph = b.build([b.op("mul", x, 2**63)])
    with pytest.raises(sdk.GraphError, match="does not fit int64"):
        encode_graph(graph)


@pytest.mark.usefixtures("sqlite_only")
def test_quantiles_of_a_boolean_column_answer(fuzz_table: sdk.DatasetHandle) -> None:
    """The node's quantile takes numbers: a boolean column's reached it as bool, refused."""
    query = fuzz_table.query().group_by("region").agg(dq.min("smoker"), dq.median("smoker"))
    rows = query.publish(epsilon=1.0).rows()
    assert len(rows) == len(REGIONS)
    assert {r["smoker_min"] for r in rows} | {r["smoker_median"] for r in rows} <= {0.0, 1.0}


def _lying(ds: sdk.DatasetHandle, info: ColumnInfo) -> sdk.DatasetHandle:
    """The handle with ``info`` for one column: metadata the node does not agree with."""
    return dataclasses.replace(ds, columns={**ds.columns, info.name: info})


@pytest.mark.usefixtures("sqlite_only")
def test_a_query_the_node_refuses_any_publish_of_charges_nothing(
    fuzz_table: sdk.DatasetHandle, ds_client: sdk.Client
) -> None:
    """A query of several publishes: the node refusing one must not find another already
    charged. The noised graphs are checked free before any publish, and the selection
    (which the node checks only as it runs it) goes first. Here the node refuses a column
    the handle lists and the node does not hold."""
    ghost = _lying(fuzz_table, ColumnInfo("ghost", "float64", (), (0.0, 1.0)))
    for first, second in [
        (dq.mean("age"), dq.median("ghost")),
        (dq.median("age"), dq.mean("ghost")),
    ]:
        with pytest.raises(sdk.DPNodeError, match="ghost"):
            ghost.query().agg(first, second).publish(epsilon=1.0)
    assert len(ds_client.ledger_entries()) == 0


@pytest.mark.usefixtures("sqlite_only")
def test_a_query_on_subjects_runs_in_mock_mode(fuzz_table: sdk.DatasetHandle) -> None:
    """``ds.subjects`` had the real data's rows inside ``sdk.mock``: a query's per-subject
    clipping then met the mock's columns with another length, refused."""
    assert fuzz_table.subjects.shape == (N,)
    query = fuzz_table.query().group_by("region").agg(dq.count(), dq.mean("age"))
    with sdk.mock(fuzz_table):
        assert fuzz_table.subjects.shape == (MOCK_ROWS,)
        result = query.publish(epsilon=1.0)
    assert result.receipt.mock and len(result) == len(REGIONS)
    assert all(0 <= r["count"] <= MOCK_ROWS and 0 <= r["age_mean"] <= 120 for r in result.rows())


@pytest.mark.usefixtures("sqlite_only")
def test_a_dry_run_refused_by_the_tracker_raises_the_sdks_error(
    fuzz_table: sdk.DatasetHandle,
) -> None:
    """A count alone asks the tracker what it charges; in mock mode the tracker's refusal
    (here of a column the handle says has infinite bounds) leaked as the core's class."""
    query = fuzz_table.query().filter(col(UNBOUNDED) > 0).agg(dq.count())
    with sdk.mock(fuzz_table), pytest.raises(sdk.PrivacyTrackingError, match=UNBOUNDED):
        query.publish(epsilon=1.0)

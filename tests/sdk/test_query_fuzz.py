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
  column's quantiles integers, a spread within Popoviciu's bound, counts within the rows), and
  the receipts charged the epsilon asked (at most, with delta), one ledger row per publish;
- or it refuses with a typed ``DPNodeError`` subclass whose message names what it refuses (a
  column, an aggregate, the constant, epsilon or delta...), never a Python error leaking out
  nor a 500, and the refusal charges nothing (no new ledger row).

``DPNODE_FUZZ_CASES`` sets the number of cases (default 200). A failure prints each failing
case's seed and the query as written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from dpnode import sdk
from dpnode.sdk import query as dq
from dpnode.sdk._handles import ColumnInfo
from dpnode.sdk.query import col
from tests.sdk.query_table import unbounded

N = 64
MOCK_ROWS = 20
SUBJECTS = 24
CASES = int(os.environ.get("DPNODE_FUZZ_CASES", "200"))
REGIONS = ["north", "south", "east", "west"]
#: the huge integer domain: more keys than any group-by or count_distinct may hold
HUGE = 2**62

#: Columns: name -> (dtype, low, high) as uploaded. ``score``'s bounds are finite on the
#: node, infinite in the handle the queries are built on.
COLUMNS: dict[str, tuple[str, float, float]] = {
    "age": ("int64", 0, 120),
    "visits": ("int32", 0, 12),
    "bmi": ("float32", 10.0, 70.0),
    "income": ("float64", 0.0, 2.0e5),
    "smoker": ("bool", 0, 1),
    "region": ("category", 0, len(REGIONS) - 1),
    "score": ("float64", -50.0, 50.0),
    "big": ("int64", -HUGE, HUGE),
}
UNBOUNDED = "score"


def _table(seed: int, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {"patient": rng.integers(0, SUBJECTS, n)}
    for name, (dt, lo, hi) in COLUMNS.items():
        if dt == "bool":
            out[name] = rng.random(n) < 0.3
        elif dt == "category":
            out[name] = np.array(REGIONS, dtype=object)[rng.integers(0, len(REGIONS), n)]
        elif name == "big":
            out[name] = rng.integers(-(2**40), 2**40, n) * 1000
        elif dt.startswith("int"):
            out[name] = rng.integers(lo, hi + 1, n).astype(dt)
        else:
            out[name] = rng.uniform(lo, hi, n).astype(dt)
    return out


# -- cases: a query as written, and the words a refusal of it must use ---------------------------


@dataclass
class Case:
    """One query: how it was written (for a failure's message), the words that name its
    constructs, what it should release if answered, and the function that publishes it."""

    seed: int
    text: list[str] = field(default_factory=list)
    words: set[str] = field(default_factory=lambda: {"epsilon", "delta"})
    groups: int = 1
    keys: list[str] = field(default_factory=list)
    outputs: list[tuple[str, str, str | None]] = field(default_factory=list)
    top: int | None = None
    epsilon: Any = 1.0
    delta: Any = None
    build: list[Callable[[dq.Query], dq.Query]] = field(default_factory=list)

    def __str__(self) -> str:
        budget = f"epsilon={self.epsilon!r}, delta={self.delta!r}"
        return f"case {self.seed}: ds.query(){''.join(self.text)}.publish({budget})"


def _pick(rng: np.random.Generator, options: list[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def _odd(rng: np.random.Generator, usual: list[Any], odd: list[Any], p: float) -> Any:
    """One of ``odd`` with probability ``p``, else one of ``usual``."""
    return _pick(rng, odd if rng.random() < p else usual)


#: the columns a query usually reads, and the ones that should be refused somewhere
USUAL = ["age", "visits", "bmi", "income", "smoker", "region"]
ODD = ["score", "big", "nope"]


def _constant(rng: np.random.Generator, column: str) -> Any:
    """A constant to compare ``column`` with: mostly one of its own kind, else anything."""
    if rng.random() < 0.9:
        dt, lo, hi = COLUMNS.get(column, ("float64", 0.0, 1.0))
        if dt == "category":
            return _pick(rng, REGIONS)
        if dt == "bool":
            return _pick(rng, [True, False, 0, 1])
        if dt.startswith("int"):
            return int(rng.integers(max(lo, -1000), min(hi, 1000) + 1))
        return float(rng.uniform(lo, hi))
    return _pick(
        rng,
        [
            math.nan,
            math.inf,
            -math.inf,
            1e300,
            -1e300,
            10**30,
            -(10**30),
            10**400,
            2**63,
            -7,
            0,
            2.5,
            True,
            "north",
            "nowhere",
            "",
            None,
            np.int64(3),
            np.float32(2.5),
            np.nan,
            [1, 2],
        ],
    )


def _predicate(rng: np.random.Generator, case: Case, depth: int = 0) -> tuple[Any, str]:
    """A random predicate and its text."""
    form = int(rng.integers(7 if depth < 2 else 3))
    if form >= 3:
        left, lt = _predicate(rng, case, depth + 1)
        if form == 3:
            return ~left, f"~({lt})"
        right, rt = _predicate(rng, case, depth + 1)
        if form in (4, 5):
            return left & right, f"({lt}) & ({rt})"
        return left | right, f"({lt}) | ({rt})"
    column = _odd(rng, USUAL, ODD, 0.1)
    case.words.add(column)
    c = col(column)
    if form == 0:
        ordered = COLUMNS.get(column, ("",))[0] != "category"
        op = _odd(rng, [">", ">=", "<", "<="] if ordered else ["==", "!="], ["==", "!=", "<"], 0.2)
        value = _constant(rng, column)
        case.words.add(repr(value))
        fns: dict[str, Callable[[Any], Any]] = {
            ">": c.__gt__,
            ">=": c.__ge__,
            "<": c.__lt__,
            "<=": c.__le__,
            "==": c.__eq__,
            "!=": c.__ne__,
        }
        return fns[op](value), f"col({column!r}) {op} {value!r}"
    if form == 1:
        low, high = _constant(rng, column), _constant(rng, column)
        case.words |= {repr(low), repr(high)}
        return c.between(low, high), f"col({column!r}).between({low!r}, {high!r})"
    values = _odd(
        rng,
        [[_constant(rng, column) for _ in range(k)] for k in (1, 2, 3)],
        [
            [],
            [_constant(rng, column)],
            [_constant(rng, column)] * 2,
            [_constant(rng, column), _constant(rng, column), "nowhere"],
        ],
        0.2,
    )
    case.words |= {repr(v) for v in values}
    return c.isin(values), f"col({column!r}).isin({values!r})"


def _groups(column: str) -> int:
    """How many public keys a column has (its categories, or its integers)."""
    _, lo, hi = COLUMNS[column]
    return int(hi - lo + 1)


def _group_by(rng: np.random.Generator, case: Case) -> None:
    usual = [str(c) for c in rng.permutation(["region", "smoker", "visits", "age"])]
    by = [_odd(rng, [c], ["bmi", "score", "big", "nope"], 0.1) for c in usual]
    by = by[: int(rng.integers(1, 4))]
    if rng.random() < 0.05:
        by.append(by[0])  # a key twice
    declared: dict[str, list[Any]] = {}
    if rng.random() < 0.2:
        column = _odd(rng, by, ["age"], 0.1)
        declared[column] = _pick(
            rng,
            [
                [],
                [1.0, 2.0],
                [30, 40, 50],
                [30, 30],
                ["north", "east"],
                ["nowhere"],
                [0.5, math.nan],
                [True, False],
                [10**30],
            ],
        )
    case.words |= set(by) | {"group_by", "keys"}
    case.words |= {repr(v) for vs in declared.values() for v in vs}
    case.keys = list(by)
    case.groups = math.prod(
        len(declared[c]) if c in declared else _groups(c) if c in COLUMNS else 1 for c in by
    )
    keys = declared or None
    case.text.append(
        f".group_by({', '.join(map(repr, by))}" + (f", keys={declared!r})" if declared else ")")
    )
    case.build.append(lambda q: q.group_by(*by, keys=keys))


#: the aggregates by kind, and whether each takes a column
KINDS = ["count", "sum", "mean", "var", "std", "median", "quantile", "min", "max", "count_distinct"]


def _aggregates(rng: np.random.Generator, case: Case) -> None:
    made: list[Callable[[], dq.Aggregate]] = []
    shown: list[str] = []
    for _ in range(int(rng.integers(1, 5))):
        kind = _pick(rng, KINDS)
        case.words.add(kind)
        column: Any = None
        if kind == "count":
            make: Callable[[], dq.Aggregate] = dq.count
            text = "count()"
        else:
            if kind == "count_distinct":  # mostly of a column with public keys
                column = _odd(rng, ["region", "smoker", "visits"], USUAL, 0.2)
            else:
                column = _odd(rng, [*USUAL[:5], col("age")], [*ODD, "region", 3], 0.1)
            name = column.name if isinstance(column, dq.Column) else column
            case.words |= {str(name), repr(name)}
            if kind == "quantile":
                q = _odd(rng, [0.1, 0.5, 0.9, 0.0, 1.0, 0.25], [-0.5, 1.5, math.nan, math.inf], 0.1)
                case.words |= {"q", repr(q)}
                make = lambda c=column, q=q: dq.quantile(c, q)  # noqa: E731
                text = f"quantile({column!r}, {q!r})"
            else:
                fn = getattr(dq, kind)
                make = lambda fn=fn, c=column: fn(c)  # noqa: E731
                text = f"{kind}({column!r})"
            column = name
        alias = None
        if rng.random() < 0.15:
            alias = _odd(rng, [f"s{len(made)}"], ["x", "count", "age", "", 5], 0.3)
            case.words |= {"alias", repr(alias)}
            text += f".alias({alias!r})"
            make = lambda m=make, a=alias: m().alias(a)  # noqa: E731
        made.append(make)
        shown.append(text)
        case.outputs.append((kind, str(alias) if alias is not None else "", column))
    case.words.add("named")
    case.text.append(f".agg({', '.join(shown)})")
    case.build.append(lambda q: q.agg(*(m() for m in made)))


def _case(seed: int) -> Case:
    rng = np.random.default_rng([seed, 11])
    case = Case(seed)
    for _ in range(int(rng.integers(0, 3))):
        predicate, text = _predicate(rng, case)
        case.text.append(f".filter({text})")
        case.build.append(lambda q, p=predicate: q.filter(p))
    if rng.random() < 0.6:
        _group_by(rng, case)
    if rng.random() < 0.97:
        _aggregates(rng, case)
    else:
        case.words |= {"agg"}
    if rng.random() < 0.1:
        k = _odd(rng, [1, 3, 100], [0, -1, 2.5, True], 0.3)
        case.top = k
        case.words |= {"top_k", repr(k)}
        case.text.append(f".top_k({k!r})")
        case.build.append(lambda q: q.top_k(k))
    odd = [0, 0.0, -1.0, math.nan, math.inf, 1e300, 1e-300, None, "1"]
    case.epsilon = _odd(rng, [0.5, 1.0, 2.0, 3.7], odd, 0.08)
    if rng.random() < 0.3:
        case.delta = _odd(
            rng, [1e-6, 1e-9], [0.0, 1.0, 1.5, -1e-6, math.nan, math.inf, 1e-300], 0.2
        )
    return case


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
        lo, hi = 0.0, float(min(rows, _groups(column or "")) if ints else rows)
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
    data = _table(0, N)
    owner_client.upload_dataset(
        "fuzzed",
        data,
        bounds={k: (lo, hi) for k, (dt, lo, hi) in COLUMNS.items() if dt[0] in "if"},
        categories={"region": REGIONS},
        subject_id="patient",
        mock=_table(1, MOCK_ROWS),
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
        case = _case(seed)
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
    return _table(1, MOCK_ROWS)  # the mock data: what sdk.mock evaluates on


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

"""Queries the builder refuses: a typed error naming the construct and an alternative,
raised before any request, so nothing is charged (the ledger stays empty)."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import pytest

from dpnode import sdk
from dpnode.sdk import query as dq
from dpnode.sdk.query import col, count, mean, median
from tests.sdk.query_table import unbounded, upload


@pytest.fixture
def people(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    return upload(owner_client, ds_client)


REFUSALS: list[tuple[str, Callable[[sdk.DatasetHandle], Any], type[Exception], str]] = [
    (
        "unknown aggregate column",
        lambda ds: ds.query().agg(mean("salary")).publish(epsilon=1.0),
        dq.UnknownColumnError,
        r"no column 'salary'; its columns are",
    ),
    (
        "unknown filter column",
        lambda ds: ds.query().filter(col("salary") > 3).agg(count()).publish(epsilon=1.0),
        dq.UnknownColumnError,
        "no column 'salary'",
    ),
    (
        "unknown key column",
        lambda ds: ds.query().group_by("region").agg(count()).publish(epsilon=1.0),
        dq.UnknownColumnError,
        "no column 'region'",
    ),
    (
        "unbounded column",
        lambda ds: unbounded(ds, "income").query().agg(mean("income")).publish(epsilon=1.0),
        dq.UnboundedColumnError,
        r"mean\('income'\).*declare finite bounds",
    ),
    (
        "a float key without declared keys",
        lambda ds: ds.query().group_by("income").agg(count()).publish(epsilon=1.0),
        dq.NoPublicKeysError,
        r"float64: group by a categorical or integer column.*keys=",
    ),
    (
        "string keys for a numeric column",
        lambda ds: (
            ds.query().group_by("age", keys={"age": ["old"]}).agg(count()).publish(epsilon=1.0)
        ),
        dq.QueryError,
        "its keys are numbers",
    ),
    (
        "a key that is not a category",
        lambda ds: ds.query().filter(col("education") == "phd").agg(count()).publish(epsilon=1.0),
        dq.QueryError,
        "'phd' is not a category of column 'education'",
    ),
    (
        "too many cells",
        lambda ds: ds.query().group_by("age", "hours", "sex").agg(count()).publish(epsilon=1.0),
        dq.TooManyCellsError,
        r"121 \(age\) x 81 \(hours\) x 2 \(sex\) = 19,602 groups.*group by fewer columns",
    ),
    (
        "epsilon 0",
        lambda ds: ds.query().group_by("sex").agg(count()).publish(epsilon=0.0),
        dq.InvalidBudgetError,
        "epsilon must be a finite number > 0",
    ),
    (
        "epsilon NaN",
        lambda ds: ds.query().group_by("sex").agg(count()).publish(epsilon=math.nan),
        dq.InvalidBudgetError,
        "epsilon must be a finite number > 0",
    ),
    (
        "delta 1",
        lambda ds: ds.query().group_by("sex").agg(count()).publish(epsilon=1.0, delta=1.0),
        dq.InvalidBudgetError,
        r"delta must be a number in \(0, 1\)",
    ),
    (
        "a mean of a categorical column",
        lambda ds: ds.query().agg(mean("education")).publish(epsilon=1.0),
        dq.AggregateTypeError,
        r"categorical.*count_distinct\('education'\)",
    ),
    (
        "an order on categories",
        lambda ds: (
            ds.query().filter(col("education") > "primary").agg(count()).publish(epsilon=1.0)
        ),
        dq.AggregateTypeError,
        r"without an order: use == != or col\('education'\).isin",
    ),
    (
        "two outputs of one name",
        lambda ds: (
            ds.query().agg(mean("age"), median("age").alias("age_mean")).publish(epsilon=1.0)
        ),
        dq.QueryError,
        r"named \['age_mean'\].*\.alias",
    ),
    (
        "top_k without groups",
        lambda ds: ds.query().top_k(3).publish(epsilon=1.0),
        dq.QueryError,
        r"group_by\(...\) first",
    ),
    (
        "nothing asked",
        lambda ds: ds.query().group_by("sex").publish(epsilon=1.0),
        dq.QueryError,
        r"add aggregates with \.agg",
    ),
    (
        "a quantile's q that is not a number",
        lambda ds: ds.query().agg(dq.quantile("age", None)).publish(epsilon=1.0),
        dq.QueryError,
        r"quantile\('age', None\): q must be a number in \[0, 1\]",
    ),
    (
        "a key an integer column never holds",
        lambda ds: (
            ds.query()
            .group_by("age", keys={"age": [30, 30.5, 10**30]})
            .agg(count())
            .publish(epsilon=1.0)
        ),
        dq.QueryError,
        r"keys \[30.5, 10{30}\] of column 'age' are values it never holds \(int64 in \[0, 120\]\)",
    ),
    (
        "one key, not a list",
        lambda ds: ds.query().group_by("age", keys={"age": 30}).agg(count()).publish(epsilon=1.0),
        dq.QueryError,
        r"keys=\{'age': 30\}: give a list of keys",
    ),
    (
        "a quantile in more groups than the node selects in",
        lambda ds: ds.query().group_by("age", "hours").agg(median("income")).publish(epsilon=1.0),
        dq.TooManyCellsError,
        r"income_median: the node selects a quantile in at most 1,000 groups.*9,801",
    ),
    (
        "several publishes over the budget",
        lambda ds: ds.query().agg(mean("age"), median("age")).publish(epsilon=10.5),
        sdk.BudgetExceededError,
        "nothing was published or charged",
    ),
]


@pytest.mark.usefixtures("sqlite_only")
@pytest.mark.parametrize(
    ("build", "error", "message"),
    [r[1:] for r in REFUSALS],
    ids=[r[0] for r in REFUSALS],
)
def test_a_refused_query_charges_nothing(
    people: sdk.DatasetHandle,
    ds_client: sdk.Client,
    build: Callable[[sdk.DatasetHandle], Any],
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message) as caught:
        build(people)
    assert isinstance(caught.value, sdk.DPNodeError)
    assert len(ds_client.ledger()) == 0
    assert ds_client.budget().spent_epsilon == 0


@pytest.mark.usefixtures("sqlite_only")
def test_an_unknown_column_is_also_a_key_error(people: sdk.DatasetHandle) -> None:
    with pytest.raises(KeyError, match="no column 'nope'"):
        people.groupby("nope")


@pytest.mark.usefixtures("sqlite_only")
def test_without_pandas_the_frame_names_the_extra(
    people: sdk.DatasetHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = people.query().agg(count()).publish(epsilon=1.0)  # public: nothing published
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(sdk.DPNodeError, match=r"pip install 'dpnode\[pandas\]'"):
        result.to_pandas()
    assert result.rows() == [{"count": 600.0, "count_scale": 0.0}] and "count" in str(result)


def test_predicates_refuse_python_boolean_operators() -> None:
    with pytest.raises(TypeError, match=r"combine predicates with & \| ~"):
        bool(col("age") > 3)
    with pytest.raises(dq.QueryError, match="q must be a number in"):
        dq.quantile("age", 1.5)

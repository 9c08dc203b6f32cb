"""``client.sql(...)``: one SQL SELECT translated into the query builder's calls and published.

- translation: each construct gives the query the equivalent builder calls give (the same
  filter, keys, aggregates and top-k, and the same plan);
- end to end through the in-process app: the released table has SELECT's columns in its order,
  near the true values at a large epsilon, charged once per builder publish;
- refusals: each construct without a DP counterpart is refused by name, with an alternative,
  before any request that could charge (the ledger stays empty);
- a seeded fuzz of supported and unsupported statements: answered, or refused with a typed
  4xx error; never a 500 or an untyped exception; the ledger holds the answered ones' charges;
- with the node's noise stream seeded, SQL and the builder release the same numbers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from dpnode import sdk
from dpnode.sdk import query as dq
from dpnode.sdk.query import Query, col
from dpnode.sdk.query.sql import (
    SQLSyntaxError,
    UnknownTableError,
    UnsupportedSQLError,
    translate,
)

N = 300
EDUCATION = ["school", "college", "degree"]
BOUNDS = {"age": (0, 120), "income": (0, 100), "hours": (0, 80), "scan": (0, 1)}
CATEGORIES = {"education": EDUCATION, "sex": ["F", "M"]}


def census(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "education": rng.choice(EDUCATION, N, p=[0.2, 0.3, 0.5]),
        "sex": rng.choice(["F", "M"], N),
        "age": rng.integers(18, 90, N),
        "income": rng.uniform(0, 100, N),
        "hours": rng.uniform(0, 80, N),
        "smoker": rng.random(N) < 0.3,
        "scan": rng.uniform(0, 1, (N, 2)),
    }


@pytest.fixture
def data(
    owner_client: sdk.Client, admin_client: sdk.Client, ds_client: sdk.Client, sqlite_only: None
) -> dict[str, np.ndarray]:
    """``census`` and a second dataset named with a space, for quoted identifiers."""
    columns = census(0)
    owner_client.upload_dataset("census", columns, bounds=BOUNDS, categories=CATEGORIES)
    owner_client.upload_dataset(
        "labour survey", {"hours": columns["hours"][:50]}, bounds={"hours": (0, 80)}
    )
    admin_client.set_policy(
        "[roles.data_scientist]\nepsilon = 1000000.0\ndelta = 0.5\n", reason="sql tests"
    )
    return columns


def _shape(q: Query) -> tuple[Any, ...]:
    return (q.ds.name, repr(q.where), q.by, q.declared, q.aggregates, q.top, q.top_counts)


# -- translation -----------------------------------------------------------------------------

#: SQL -> the builder calls it stands for
TRANSLATIONS: list[tuple[str, Callable[[Query], Query]]] = [
    ("SELECT COUNT(*) FROM census", lambda q: q.agg(dq.count())),
    (
        "SELECT education, sex, COUNT(*), AVG(income) FROM census WHERE age > 30 "
        "GROUP BY education, sex",
        lambda q: (
            q.filter(col("age") > 30)
            .group_by("education", "sex")
            .agg(dq.count(), dq.mean("income"))
        ),
    ),
    (
        "SELECT SUM(income) AS total, VARIANCE(hours) v, VAR_POP(age), STDDEV(age), "
        "stddev_pop(hours) FROM census",
        lambda q: q.agg(
            dq.sum("income").alias("total"),
            dq.var("hours").alias("v"),
            dq.var("age"),
            dq.std("age"),
            dq.std("hours"),
        ),
    ),
    (
        "SELECT MEDIAN(hours), MIN(age), MAX(age), COUNT(age), COUNT(DISTINCT education) "
        "FROM census",
        lambda q: q.agg(
            dq.median("hours"),
            dq.min("age"),
            dq.max("age"),
            dq.count(),
            dq.count_distinct("education"),
        ),
    ),
    (
        "SELECT PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY hours), QUANTILE(hours, 0.25), "
        "APPROX_QUANTILE(age, 0.75), PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY age DESC) "
        "AS low FROM census",
        lambda q: q.agg(
            dq.quantile("hours", 0.9),
            dq.quantile("hours", 0.25),
            dq.quantile("age", 0.75),
            dq.quantile("age", 0.1).alias("low"),
        ),
    ),
    (
        "SELECT COUNT(*) FROM census WHERE age BETWEEN 30 AND 60 AND sex = 'F'",
        lambda q: q.filter(col("age").between(30, 60) & (col("sex") == "F")).agg(dq.count()),
    ),
    (
        "SELECT COUNT(*) FROM census WHERE education IN ('college', 'degree') OR NOT smoker",
        lambda q: q.filter(
            col("education").isin(["college", "degree"]) | ~(col("smoker") == True)  # noqa: E712
        ).agg(dq.count()),
    ),
    (
        "SELECT AVG(hours) FROM census WHERE 30 < age AND NOT (age >= 65 OR hours < 10.5) "
        "AND age <> -1 AND age NOT IN (40, 41) AND age NOT BETWEEN 1 AND 2",
        lambda q: q.filter(
            (col("age") > 30)
            & ~((col("age") >= 65) | (col("hours") < 10.5))
            & (col("age") != -1)
            & ~col("age").isin([40, 41])
            & ~col("age").between(1, 2)
        ).agg(dq.mean("hours")),
    ),
    (
        "SELECT SEX, count(*) FROM CENSUS AS c WHERE c.Age >= 18 GROUP BY 1",
        lambda q: q.filter(col("age") >= 18).group_by("sex").agg(dq.count()),
    ),
    (
        "SELECT education, COUNT(*) AS n FROM census GROUP BY education ORDER BY n DESC LIMIT 2",
        lambda q: q.group_by("education").top_k(2, counts=False).agg(dq.count().alias("n")),
    ),
    (
        "SELECT education, sex FROM census GROUP BY education, sex ORDER BY COUNT(*) DESC LIMIT 3",
        lambda q: q.group_by("education", "sex").top_k(3, counts=False),
    ),
    (  # ascending, or with an OFFSET: a sort of the whole released table, not top_k
        "SELECT education, COUNT(*) FROM census GROUP BY education ORDER BY 2 LIMIT 1 OFFSET 1",
        lambda q: q.group_by("education").agg(dq.count()),
    ),
]


def test_sql_translates_into_the_builder_calls_it_stands_for(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    census_query = ds_client.dataset("census").query()
    for sql, calls in TRANSLATIONS:  # one dataset for all: a fixture costs ~2 s
        translated = translate(sql, ds_client)
        expected = calls(census_query)
        assert _shape(translated.query) == _shape(expected), sql
        assert translated.query.plan(epsilon=1.0) == expected.plan(epsilon=1.0), sql
    assert ds_client.ledger_entries() == []  # translating and planning charge nothing


def test_from_names_a_dataset_as_the_catalog_does_quoted_if_need_be(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    translated = translate('SELECT COUNT(*), AVG("hours") FROM "labour survey"', ds_client)
    expected = ds_client.dataset("labour survey").query().agg(dq.count(), dq.mean("hours"))
    assert _shape(translated.query) == _shape(expected)
    with pytest.raises(UnknownTableError, match="'Census'.*'census', 'labour survey'"):
        translate('SELECT COUNT(*) FROM "Census"', ds_client)  # quoted: the exact name


def test_a_translation_says_what_is_done_after_release(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    plan = translate(
        "SELECT education AS e, AVG(income) m FROM census GROUP BY e ORDER BY m DESC, 1 LIMIT 2",
        ds_client,
    ).plan(epsilon=2.0)
    assert plan.splitlines()[1:] == [
        "  publish 1: noised via clipped per-row vector (m), weight 2, epsilon 2",
        "  then locally (free): columns e, m",
        "  ORDER BY m DESC, e ASC",
        "  LIMIT 2 OFFSET 0",
    ]


# -- end to end ------------------------------------------------------------------------------


def test_a_grouped_statement_releases_its_columns_in_order_near_the_truth(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    r = ds_client.sql(
        "SELECT education, sex, COUNT(*), AVG(income) FROM census WHERE age > 30 "
        "GROUP BY education, sex",
        epsilon=50.0,
    )
    assert r.columns == [
        "education",
        "sex",
        "count",
        "count_scale",
        "income_mean",
        "income_mean_scale",
    ]
    assert [(row["education"], row["sex"]) for row in r.rows()] == [
        (e, s) for e in EDUCATION for s in ("F", "M")
    ]
    for row in r.rows():
        rows = (
            (data["education"] == row["education"])
            & (data["sex"] == row["sex"])
            & (data["age"] > 30)
        )
        # Laplace of scale 0.08 on the count and on the normalised sum (4 in income) at epsilon 50
        assert row["count"] == pytest.approx(rows.sum(), abs=3)
        assert row["income_mean"] == pytest.approx(data["income"][rows].mean(), abs=5)
    assert len(ds_client.ledger_entries()) == len(r.receipt) == 1


def test_aliases_name_and_place_the_columns_and_filters_count_the_rows_they_keep(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    r = ds_client.sql(
        "SELECT COUNT(*) AS n, sex AS s, COUNT(DISTINCT education) kinds FROM census "
        "WHERE age BETWEEN 30 AND 60 AND smoker OR education IN ('school') GROUP BY sex",
        epsilon=60.0,
    )
    assert r.columns == ["n", "n_scale", "s", "kinds", "kinds_scale"]
    assert r["s"] == ["F", "M"]
    kept = ((data["age"] >= 30) & (data["age"] <= 60) & data["smoker"]) | (
        data["education"] == "school"
    )
    for row in r.rows():
        rows = kept & (data["sex"] == row["s"])
        assert row["n"] == pytest.approx(rows.sum(), abs=3)
        assert row["kinds"] == pytest.approx(len(set(data["education"][rows])), abs=1)
    assert len(ds_client.ledger_entries()) == len(r.receipt) == 2  # noised and distinct


def test_quantiles_in_each_spelling_are_selected_near_the_truth(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    r = ds_client.sql(
        "SELECT PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY hours) AS med, "
        "QUANTILE(age, 0.9), MAX(hours) FROM census WHERE NOT smoker",
        epsilon=6.0,
    )
    assert r.columns == [
        "med",
        "med_scale",
        "age_q0.9",
        "age_q0.9_scale",
        "hours_max",
        "hours_max_scale",
    ]
    rows = ~data["smoker"]
    # permute-and-flip at epsilon 2 each: a few rows from the target rank (~0.4 hours, ~0.3
    # years a row here); a larger epsilon costs delta (the samplers' finite precision)
    assert r["med"][0] == pytest.approx(np.median(data["hours"][rows]), abs=8)
    assert r["age_q0.9"][0] == pytest.approx(np.quantile(data["age"][rows], 0.9), abs=8)
    assert r["hours_max"][0] == pytest.approx(data["hours"][rows].max(), abs=8)
    assert len(ds_client.ledger_entries()) == 1  # the selected family: one publish


def test_order_by_and_limit_sort_and_cut_the_released_table(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    r = ds_client.sql(
        "SELECT education, AVG(income) AS m FROM census GROUP BY education ORDER BY m DESC LIMIT 2",
        epsilon=10.0,
    )
    assert len(r) == 2 and r["m"] == sorted(r["m"], reverse=True)
    assert len(set(r["education"])) == 2
    r = ds_client.sql(
        "SELECT sex, education, COUNT(*) FROM census GROUP BY education, sex "
        "ORDER BY 2 DESC, count LIMIT 3 OFFSET 1",
        epsilon=10.0,
    )
    # education descending (school, degree, college), then counts ascending; one row skipped
    assert [row["education"] for row in r.rows()] == ["school", "degree", "degree"]
    assert r["count"][1] <= r["count"][2]
    assert len(ds_client.ledger_entries()) == 2


def test_the_largest_groups_come_from_top_k(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    # "degree" holds about half the rows, "college" a third: far apart at this epsilon
    r = ds_client.sql(
        "SELECT education FROM census GROUP BY education ORDER BY COUNT(*) DESC LIMIT 2",
        epsilon=20.0,
    )
    assert r.columns == ["education"] and r["education"] == ["degree", "college"]
    r = ds_client.sql(
        "SELECT education, COUNT(*) AS n, AVG(hours) FROM census GROUP BY education "
        "ORDER BY n DESC LIMIT 1",
        epsilon=20.0,
    )
    assert r["education"] == ["degree"]
    assert r["n"][0] == pytest.approx((data["education"] == "degree").sum(), abs=3)
    assert len(ds_client.ledger_entries()) == 2


def test_sdk_sql_runs_on_the_last_login(
    data: dict[str, np.ndarray], ds_client: sdk.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sdk, "_last_client", ds_client)
    r = sdk.sql("SELECT COUNT(*) FROM census WHERE sex = 'F'", epsilon=20.0)
    assert r["count"][0] == pytest.approx((data["sex"] == "F").sum(), abs=3)

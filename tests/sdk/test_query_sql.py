"""``client.sql(...)``: one SQL SELECT translated into the query builder's calls and published.

- translation: each construct gives the query the equivalent builder calls give (the same
  filter, keys, aggregates and top-k, and the same plan);
- end to end through the in-process app: the released table has SELECT's columns in its order,
  near the true values at a large epsilon, charged once per builder publish;
- refusals: each construct without a DP counterpart is refused by name, with an alternative,
  before any request that could charge (the ledger stays empty);
- a seeded fuzz of supported and unsupported statements: answered, or refused with a typed
  4xx error; never a 500 or an untyped exception; the ledger holds the answered ones' charges;
- with the node's noise streams seeded, SQL and the builder release the same numbers: in
  tests/sdk/test_query_equivalence.py, beside the builder's own such tests.
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
    return (q.ds.name, repr(q.predicate), q.by, q.declared, q.aggregates, q.top, q.top_counts)


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
    (  # constants beyond int64 and the floats compare exactly, as the builder's do
        "SELECT COUNT(*) FROM census WHERE age > 9223372036854775808 OR age <= -1e400 "
        "OR hours BETWEEN -0.0 AND 99999999999999999999",
        lambda q: q.filter(
            (col("age") > 2**63)
            | (col("age") <= -math.inf)
            | col("hours").between(-0.0, 10**20 - 1)
        ).agg(dq.count()),
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
    with pytest.raises(UnknownTableError, match=r"'Census'.*'census', 'labour survey'"):
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


def test_sql_results_carry_the_builders_error_bars_and_render_its_table(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    sql = (
        "SELECT education, COUNT(*), AVG(income), MEDIAN(hours) FROM census WHERE age > 30 "
        "GROUP BY education"
    )
    query = (
        ds_client.dataset("census")
        .query()
        .filter(col("age") > 30)
        .group_by("education")
        .agg(dq.count(), dq.mean("income"), dq.median("hours"))
    )
    by_sql, by_builder = ds_client.sql(sql, epsilon=2.0), query.publish(epsilon=2.0)
    assert by_sql.columns == by_builder.columns
    assert (
        set(by_sql.error_bars)
        == set(by_builder.error_bars)
        == {
            "count",
            "income_mean",
            "hours_median",
        }
    )
    # a count's and a quantile's bars come from the noise scales alone, the same for the same
    # query at the same epsilon (a mean's from its noised count too: the same numbers with the
    # noise seeded, tests/sdk/test_query_equivalence.py)
    for name in ("count", "hours_median"):
        assert by_sql.error_bars[name] == by_builder.error_bars[name]
    cells = [r._repr_html_().split("<p>")[0].count("±") for r in (by_sql, by_builder)]
    assert cells == [3 * len(EDUCATION)] * 2  # every statistic of every row with its bar
    # one released table, through SQL's post-processing: the notebook table the builder shows
    assert translate(sql, ds_client).finish(by_builder)._repr_html_() == by_builder._repr_html_()
    # reordered, sorted and cut, each bar stays with its value
    ordered = translate(
        "SELECT AVG(income), education FROM census WHERE age > 30 GROUP BY education "
        "ORDER BY 1 DESC LIMIT 2",
        ds_client,
    ).finish(by_builder)
    bar = dict(zip(by_builder["education"], by_builder.error_bars["income_mean"], strict=True))
    assert len(set(bar.values())) == len(EDUCATION)  # a mean's bar is its group's own
    assert ordered.columns == ["income_mean", "income_mean_scale", "education"]
    assert ordered["income_mean"] == sorted(by_builder["income_mean"], reverse=True)[:2]
    assert ordered.error_bars == {"income_mean": [bar[e] for e in ordered["education"]]}
    assert ordered._repr_html_().split("<p>")[0].count("±") == 2


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


# -- refusals --------------------------------------------------------------------------------

#: a statement, the error it gets, and words its message must hold (the construct, and what
#: to do instead)
REFUSALS: list[tuple[str, type[Exception], tuple[str, ...]]] = [
    ("SELECT * FROM census", UnsupportedSQLError, ("SELECT *", "never released", "ds.mock()")),
    ("SELECT age FROM census", UnsupportedSQLError, ("age outside GROUP BY", "ds.mock()")),
    (
        "SELECT c.sex, COUNT(*) FROM census c JOIN other o ON c.id = o.id GROUP BY c.sex",
        UnsupportedSQLError,
        ("JOIN", "not supported yet", "one dataset"),
    ),
    ("SELECT COUNT(*) FROM census, census", UnsupportedSQLError, ("JOIN",)),
    ("SELECT COUNT(*) FROM (SELECT * FROM census) t", UnsupportedSQLError, ("subquery",)),
    (
        "SELECT COUNT(*) FROM census WHERE age > (SELECT AVG(age) FROM census)",
        UnsupportedSQLError,
        ("subquery", "as constants"),
    ),
    ("WITH t AS (SELECT 1) SELECT COUNT(*) FROM census", UnsupportedSQLError, ("subquery",)),
    (
        "SELECT sex, AVG(income) OVER (PARTITION BY sex) FROM census",
        UnsupportedSQLError,
        ("window function", "GROUP BY"),
    ),
    (
        "SELECT sex, COUNT(*) FROM census GROUP BY sex HAVING COUNT(*) > 10",
        UnsupportedSQLError,
        ("HAVING", "r.frame["),
    ),
    (
        "SELECT SUM(income * 2) FROM census",
        UnsupportedSQLError,
        ("SUM(income * 2)", "SUM(income) * 2"),
    ),
    ("SELECT AVG(income) + 1 FROM census", UnsupportedSQLError, ("AVG(income) + 1", "afterwards")),
    ("SELECT SUM(DISTINCT age) FROM census", UnsupportedSQLError, ("DISTINCT inside",)),
    ("SELECT STRING_AGG(sex, ',') FROM census", UnsupportedSQLError, ("aggregate", "COUNT(*)")),
    (
        "SELECT COUNT(*) FROM census WHERE ABS(age) > 3",
        UnsupportedSQLError,
        ("function or arithmetic on a column in WHERE (ABS(age))", "column itself"),
    ),
    ("SELECT COUNT(*) FROM census WHERE age + 1 > 30", UnsupportedSQLError, ("age + 1",)),
    ("SELECT COUNT(*) FROM census WHERE age > hours", UnsupportedSQLError, ("two columns",)),
    ("SELECT COUNT(*) FROM census WHERE sex IS NULL", UnsupportedSQLError, ("IS", "missing")),
    ("SELECT COUNT(*) FROM census WHERE age = NULL", UnsupportedSQLError, ("NULL", "missing")),
    ("SELECT COUNT(*) FROM census WHERE sex LIKE 'F%'", UnsupportedSQLError, ("LIKE", "IN (")),
    ("SELECT COUNT(*) FROM census WHERE age", UnsupportedSQLError, ("WHERE age", "age > 0")),
    (
        "SELECT COUNT(*) FROM nowhere",
        UnknownTableError,
        ("'nowhere'", "'census'", "'labour survey'"),
    ),
    ("SELECT COUNT(*) FROM db.census", UnsupportedSQLError, ("qualified", '"a.b"')),
    ("SELECT AVG(salary) FROM census", dq.UnknownColumnError, ("'salary'", "age", "income")),
    (
        "SELECT COUNT(*) FROM census; SELECT 1",
        UnsupportedSQLError,
        ("2 statements in one call", "one SELECT"),
    ),
    (" -- nothing\n", UnsupportedSQLError, ("an empty statement",)),
    ("INSERT INTO census VALUES (1)", UnsupportedSQLError, ("INSERT statement", "read-only")),
    ("UPDATE census SET age = 1", UnsupportedSQLError, ("UPDATE statement", "read-only")),
    ("DELETE FROM census", UnsupportedSQLError, ("DELETE statement", "read-only")),
    ("DROP TABLE census", UnsupportedSQLError, ("DROP statement", "read-only")),
    ("CREATE TABLE t (a INT)", UnsupportedSQLError, ("CREATE statement",)),
    ("EXPLAIN SELECT COUNT(*) FROM census", UnsupportedSQLError, ("EXPLAIN statement",)),
    ("SELEC", UnsupportedSQLError, ("SELEC (not a statement)", "write one SELECT")),
    ("SELECT COUNT(* FROM census", SQLSyntaxError, ("line 1, column",)),
    ("SELECT COUNT(*) FROM census WHERE", SQLSyntaxError, ("line 1, column 33", "WHERE")),
    ("SELECT COUNT(*) FROM census WHERE sex = 'F", SQLSyntaxError, ("cannot parse",)),
    ("SELECT DISTINCT sex FROM census", UnsupportedSQLError, ("SELECT DISTINCT", "categories")),
    ("SELECT sex FROM census GROUP BY sex", UnsupportedSQLError, ("without an aggregate",)),
    (
        "SELECT COUNT(*) FROM census UNION SELECT COUNT(*) FROM census",
        UnsupportedSQLError,
        ("UNION", "its own client.sql"),
    ),
    ("SELECT COUNT(*) FROM census ORDER BY age", UnsupportedSQLError, ("ORDER BY age", "SELECT")),
    (
        "SELECT sex, AVG(income) FROM census GROUP BY sex ORDER BY COUNT(*)",
        UnsupportedSQLError,
        ("ORDER BY COUNT(*) without COUNT(*) in SELECT",),
    ),
    ("SELECT COUNT(*) FROM census LIMIT -1", UnsupportedSQLError, ("LIMIT -1", "whole number")),
    ("SELECT QUANTILE(hours, 1.5) FROM census", UnsupportedSQLError, ("between 0 and 1",)),
    ("SELECT COUNT(*) FROM census GROUP BY ROLLUP(sex)", UnsupportedSQLError, ("ROLLUP",)),
    ("SELECT COUNT(*), COUNT(*) FROM census", UnsupportedSQLError, ("['count']", "AS")),
    # refused by the builder, as the same calls would be
    ("SELECT AVG(education) FROM census", dq.AggregateTypeError, ("categorical",)),
    ("SELECT AVG(scan) FROM census", dq.AggregateTypeError, ("per row",)),
    ("SELECT income, COUNT(*) FROM census GROUP BY income", dq.NoPublicKeysError, ("income",)),
    ("SELECT COUNT(*) FROM census WHERE sex = 'X'", dq.QueryError, ("'X'", "categories")),
    ("SELECT COUNT(*) FROM census WHERE age > 'old'", dq.AggregateTypeError, ("number",)),
    # constants that are not numbers, where a number is compared
    (
        "SELECT COUNT(*) FROM census WHERE age > NaN",
        UnsupportedSQLError,
        ("NaN as a constant", "no value equals NaN"),
    ),
    (
        "SELECT COUNT(*) FROM census WHERE income < Infinity",
        UnsupportedSQLError,
        ("Infinity as a constant", "1e308", "leave the condition out"),
    ),
    ("SELECT COUNT(*) FROM census WHERE age > nobody", dq.UnknownColumnError, ("'nobody'",)),
    (
        "SELECT COUNT(*) FROM census WHERE age > TRUE",
        dq.AggregateTypeError,
        ("'age' is int64, not bool", "a number (1), not True"),
    ),
    (
        "SELECT COUNT(*) FROM census WHERE income BETWEEN FALSE AND 50",
        dq.AggregateTypeError,
        ("'income' is float64", "(0), not False"),
    ),
    ("SELECT COUNT(*) FROM census WHERE age IN (30, TRUE)", dq.AggregateTypeError, ("True",)),
]


def test_each_construct_without_a_dp_counterpart_is_refused_by_name_and_charges_nothing(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    wrong = []
    for sql, error, words in REFUSALS:  # one dataset for all: a fixture costs ~2 s
        try:
            ds_client.sql(sql, epsilon=1.0)
        except error as exc:
            assert isinstance(exc, dq.QueryError), (sql, exc)  # refused before any charge
            missing = [w for w in words if w not in str(exc)]
            if missing:
                wrong.append(f"{sql!r}: {exc} lacks {missing}")
        except Exception as exc:  # any other error is the finding
            wrong.append(f"{sql!r}: {type(exc).__name__}: {exc}")
        else:
            wrong.append(f"{sql!r}: answered")
    assert not wrong, "\n".join(wrong)
    assert ds_client.ledger_entries() == []
    assert ds_client.budget().spent_epsilon == 0


# -- fuzz ------------------------------------------------------------------------------------

FUZZ_CASES = 200
#: columns by what they suit, and ones that suit nothing (a tensor per row, a missing name)
NUMBERS = ["age", "income", "hours"]
KEYS = ["education", "sex", "age", "smoker"]
ODD = ["scan", "nope", "income", "education"]
#: constants each column compares with, and ones that suit none
CONSTANTS = {
    "age": ["30", "-2", "45.5", "1e2"],
    "income": ["10.5", "0", "99"],
    "hours": ["40", "0.5"],
    "education": ["'college'", "'degree'", "'school'"],
    "sex": ["'F'", "'M'"],
    "smoker": ["TRUE", "FALSE"],
}
ODD_CONSTANTS = ["'zzz'", "NULL", "(1 + 1)", "'F'", "7"]
GOOD = [
    "COUNT(*)",
    "COUNT({n})",
    "COUNT(DISTINCT {k})",
    "SUM({n})",
    "AVG({n})",
    "VARIANCE({n})",
    "VAR_POP({n})",
    "STDDEV({n})",
    "MEDIAN({n})",
    "MIN({n})",
    "MAX({n})",
    "PERCENTILE_CONT({q}) WITHIN GROUP (ORDER BY {n})",
    "QUANTILE({n}, {q})",
]
BAD = [
    "AVG({o})",
    "COUNT(DISTINCT {o})",
    "SUM({n} * 2)",
    "AVG({n}) + 1",
    "ROW_NUMBER() OVER (ORDER BY {n})",
    "STRING_AGG({k}, ',')",
    "QUANTILE({n}, 1.5)",
    "*",
    "{n}",
    "(SELECT 1)",
]


def _odd(rng: random.Random) -> bool:
    return rng.random() < 0.08


def _condition(rng: random.Random, depth: int = 0) -> str:
    if depth < 2 and rng.random() < 0.4:
        how = rng.choice(["AND", "OR", "NOT", "()"])
        if how == "NOT":
            return f"NOT {_condition(rng, depth + 1)}"
        if how == "()":
            return f"({_condition(rng, depth + 1)})"
        return f"{_condition(rng, depth + 1)} {how} {_condition(rng, depth + 1)}"
    c = rng.choice(ODD) if _odd(rng) else rng.choice(list(CONSTANTS))
    pick = lambda: rng.choice(ODD_CONSTANTS if _odd(rng) else CONSTANTS.get(c, ["1"]))  # noqa: E731
    ordered = c in NUMBERS or _odd(rng)
    op = rng.choice(["=", "<>", "<", "<=", ">", ">="] if ordered else ["=", "<>"])
    leaves = [f"{c} {op} {pick()}", f"{pick()} {op} {c}", f"{c} IN ({pick()}, {pick()})"]
    leaves += [f"{c} NOT IN ({pick()})"]
    leaves += [f"{c} BETWEEN {pick()} AND {pick()}"] if ordered else []
    leaves += ["smoker", "NOT smoker"]
    if _odd(rng):
        leaves = [f"ABS({c}) > 1", f"{c} IS NULL", f"{c} LIKE 'a%'", f"{c} > hours", c]
    return rng.choice(leaves)


def _statement(rng: random.Random) -> str:
    keys = rng.sample(KEYS, rng.choice([0, 1, 1, 2]))
    if _odd(rng):
        keys.append(rng.choice(ODD))
    items = [f"{k} AS k{i}" if rng.random() < 0.2 else k for i, k in enumerate(keys)]
    for i in range(rng.choice([0, 1, 1, 2, 3]) if keys else rng.randint(1, 3)):
        template = rng.choice(BAD) if _odd(rng) else rng.choice(GOOD)
        term = template.format(
            n=rng.choice(NUMBERS), k=rng.choice(KEYS), o=rng.choice(ODD), q=rng.random()
        )
        items.append(term + (f" AS a{i}" if rng.random() < 0.3 else ""))
    rng.shuffle(items)
    table = "census"
    if _odd(rng):
        table = rng.choice(['"labour survey"', "nowhere", "census c JOIN x ON c.a = x.a"])
    sql = f"SELECT {', '.join(items)} FROM {table}"
    if rng.random() < 0.6:
        sql += f" WHERE {_condition(rng)}"
    if keys:
        positions = {item.split(" AS ")[0]: i + 1 for i, item in enumerate(items)}
        sql += " GROUP BY " + ", ".join(rng.choice([k, str(positions[k])]) for k in keys)
    if _odd(rng):
        sql += " HAVING COUNT(*) > 1"
    if rng.random() < 0.4:
        target = rng.choice([*keys, "COUNT(*)", "1", "a0", "a1", "hours"])
        sql += f" ORDER BY {target} {rng.choice(['', 'ASC', 'DESC'])}"
    if rng.random() < 0.3:
        sql += f" LIMIT {rng.choice([0, 1, 2, 5, 5, 5, -1])}"
    if _odd(rng):
        sql = sql[: rng.randrange(len(sql))]  # cut anywhere: a parse error, most often
    elif _odd(rng):
        sql += rng.choice(["; DROP TABLE census", "; SELECT 1", " UNION SELECT 1"])
    return sql


def test_random_statements_are_answered_or_refused_by_name_never_a_500(
    data: dict[str, np.ndarray], ds_client: sdk.Client
) -> None:
    rng = random.Random(20240611)
    failures: list[str] = []
    charges = answered = 0
    refusals: dict[str, int] = {}
    for case in range(FUZZ_CASES):
        sql = _statement(rng)
        epsilon, delta = rng.choice([0.5, 1.0, 4.0]), rng.choice([None, None, 1e-6])
        try:
            result = ds_client.sql(sql, epsilon=epsilon, delta=delta)
        except sdk.ServerError as exc:
            failures.append(f"case {case} {sql!r}: a 500: {exc}")
        except sdk.DPNodeError as exc:
            refusals[type(exc).__name__] = refusals.get(type(exc).__name__, 0) + 1
            status = exc.status
            if not str(exc) or (status is not None and not 400 <= status < 500):
                failures.append(f"case {case} {sql!r}: {type(exc).__name__} {status}: {exc}")
        except Exception as exc:  # any other error is the finding
            failures.append(f"case {case} {sql!r}: {type(exc).__name__}: {exc}")
        else:
            answered += 1
            charges += len(result.receipt)
            values = [v for row in result.rows() for v in row.values() if isinstance(v, float)]
            if not all(math.isfinite(v) for v in values):
                failures.append(f"case {case} {sql!r}: a value that is not finite")
    assert not failures, "\n".join(failures)
    # both kinds are exercised, and only the answered ones were charged
    assert 30 <= answered <= FUZZ_CASES - 60, (answered, refusals)
    assert len(ds_client.ledger_entries(limit=1000)) == charges

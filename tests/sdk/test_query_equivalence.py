"""The query builder releases what the same computation written in torch releases.

The node draws its noise from fresh CSPRNG streams (dpnode.core.dp.samplers); here, in the
test process that runs the app, the streams are seeded, so that the builder's publish and
an analyst's torch code published with the same seed must give the same numbers, bit for
bit, when they compute the same values at the same sensitivity. The builder's graphs are
the ones an analyst writes (one-hots compared and summed; a per-row vector clipped), so
what the node's tracker learns applies to both.
"""

from __future__ import annotations

import pytest
import torch

from dpnode import sdk
from dpnode.sdk._per_sample import clipped_sum
from dpnode.sdk.query import col, count, count_distinct, mean, quantile
from tests.sdk.query_table import upload


@pytest.fixture
def people(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    return upload(owner_client, ds_client)


@pytest.mark.usefixtures("sqlite_only")
def test_a_count_per_key_is_the_analysts_one_hot_sum(people: sdk.DatasetHandle, seed) -> None:
    query = people.query().group_by("education").agg(count())
    assert "via one-hot partition" in query.plan()
    seed(7)
    built = query.publish(epsilon=0.5)
    seed(7)
    edu = people["education"]
    by_hand = (edu.unsqueeze(-1) == torch.arange(3)).sum(0).publish(epsilon=0.5)
    assert built.column("count") == by_hand.tolist()
    assert built.receipt.spends[0].receipt.sensitivity_l1 == by_hand.receipt.sensitivity_l1
    seed(8)  # another seed, other numbers: the comparison above can fail
    assert query.publish(epsilon=0.5).column("count") != by_hand.tolist()


@pytest.mark.usefixtures("sqlite_only")
def test_a_count_per_two_keys(people: sdk.DatasetHandle, seed) -> None:
    """The analyst's combined code and one-hot; while the node charges that graph for its
    cells (not yet as a partition), the builder clips one one-hot row per row instead,
    which the analyst can write too, and releases that."""
    query = people.query().group_by("education", "sex").agg(count())
    code = people["education"] * 2 + people["sex"]
    one_hot = code.unsqueeze(-1) == torch.arange(6)
    plain = one_hot.sum(0)
    charged = sdk.sensitivity(plain).l1
    seed(11)
    built = query.publish(epsilon=1.0)
    seed(11)
    if charged <= 2 + 1e-6:  # the node knows the partition: the analyst's graph as it is
        assert "via one-hot partition" in query.plan()
        by_hand = plain.publish(epsilon=1.0)
    else:
        assert "via clipped per-row vector" in query.plan()
        clipped = clipped_sum([one_hot.to(torch.float64)], max_norm=1 + 1e-9, ord=1)
        by_hand = clipped.publish(epsilon=1.0)
        assert by_hand.receipt.sensitivity_l1 < charged
    assert built.column("count") == by_hand.tolist()


@pytest.mark.usefixtures("sqlite_only")
def test_a_filtered_mean_is_the_analysts_clipped_sums(people: sdk.DatasetHandle, seed) -> None:
    seed(3)
    built = people.query().filter(col("age") >= 30).agg(count(), mean("income"))
    (row,) = built.publish(epsilon=1.0).rows()
    seed(3)
    weight = (people["age"] >= 30).to(torch.float64).unsqueeze(-1)
    z = ((people["income"].to(torch.float64) - 100.0) / 100.0).unsqueeze(-1)
    sums = clipped_sum([weight, z * weight], max_norm=2 * (1 + 1e-9), ord=1)
    n, s = sums.publish(epsilon=1.0).tolist()
    assert row["count"] == n
    assert row["income_mean"] == pytest.approx(100.0 + 100.0 * s / n, rel=1e-12)
    seed(3)  # where is filter under its SQL and Spark name
    where = people.query().where(col("age") >= 30).agg(count(), mean("income"))
    assert where.publish(epsilon=1.0).rows() == [row]


@pytest.mark.usefixtures("sqlite_only")
def test_sql_releases_what_the_same_builder_calls_release(
    people: sdk.DatasetHandle, ds_client: sdk.Client, seed
) -> None:
    from dpnode.sdk.query import count_distinct, median, std

    q = people.query()
    pairs = [
        (
            "SELECT education, sex, COUNT(*), AVG(income) FROM people WHERE age >= 30 "
            "GROUP BY education, sex",
            q.filter(col("age") >= 30).group_by("education", "sex").agg(count(), mean("income")),
        ),
        (
            "SELECT sex, STDDEV(hours) AS s, MEDIAN(age), COUNT(DISTINCT education) FROM people "
            "WHERE education IN ('primary', 'tertiary') AND NOT smoker GROUP BY sex",
            q.filter(col("education").isin(["primary", "tertiary"]) & ~(col("smoker") == True))  # noqa: E712
            .group_by("sex")
            .agg(std("hours").alias("s"), median("age"), count_distinct("education")),
        ),
        (  # the largest groups: the builder's top_k
            "SELECT education, COUNT(*) FROM people GROUP BY education ORDER BY COUNT(*) DESC "
            "LIMIT 2",
            q.group_by("education").top_k(2, counts=False).agg(count()),
        ),
    ]
    released = []
    for sql, built in pairs:
        seed(7)
        by_sql = ds_client.sql(sql, epsilon=1.0)
        seed(7)
        by_builder = built.publish(epsilon=1.0)
        assert by_sql.columns == by_builder.columns, sql
        assert by_sql.rows() == by_builder.rows(), sql
        # the same notebook table: each value with its error bar, what the bars mean
        assert by_sql.error_bars == by_builder.error_bars and by_sql.error_bars, sql
        table = by_sql._repr_html_().split("<pre>")[0]  # the receipts differ: two charges
        assert table == by_builder._repr_html_().split("<pre>")[0], sql
        assert "±" in table, sql
        released.append(by_sql.rows())
    seed(8)  # another seed, other numbers: the comparison above can fail
    assert ds_client.sql(pairs[0][0], epsilon=1.0).rows() != released[0]


@pytest.mark.usefixtures("sqlite_only")
@pytest.mark.parametrize(
    "written",
    [
        lambda h: torch.quantile(h.float(), 0.5),
        lambda h: torch.quantile(h.double(), 0.5),
        lambda h: h.double().median(),
    ],
    ids=["quantile-float32", "quantile-float64", "median-float64"],
)
def test_a_median_of_a_cast_integer_column_is_the_builders(
    people: sdk.DatasetHandle, seed, written
) -> None:
    """torch.quantile takes floats only: the integer column cast to a float dtype that holds
    its values keeps its integer candidates, so the analyst's torch code releases what the
    builder's integer path releases, draw for draw."""
    seed(5)
    (row,) = people.query().agg(quantile("hours", 0.5)).publish(epsilon=0.2).rows()
    seed(5)
    by_hand = written(people["hours"]).publish(epsilon=0.2)
    assert float(by_hand) == row["hours_q0.5"] and float(by_hand).is_integer()
    assert 0 <= float(by_hand) <= 80


@pytest.mark.usefixtures("sqlite_only")
def test_a_count_distinct_is_the_analysts_sdk_count(people: sdk.DatasetHandle, seed) -> None:
    seed(9)
    (row,) = people.query().agg(count_distinct("income")).publish(epsilon=0.5).rows()
    seed(9)
    by_hand = sdk.count_distinct(people["income"]).publish(epsilon=0.5)
    assert row["income_count_distinct"] == float(by_hand)
    assert by_hand.receipt.sensitivity_l1 == pytest.approx(1.0)

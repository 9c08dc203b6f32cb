"""The query builder's aggregates against the true values of a small uploaded table.

Each released value must lie within a few of the noise scales the result states beside it
(``<name>_scale``: the noise's standard deviation, or for a selected quantile the
exponential mechanism's scale in rows), with and without a filter and a group-by.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpnode import sdk
from dpnode.node.db.models import User
from dpnode.sdk.query import (
    col,
    count,
    count_distinct,
    max,
    mean,
    median,
    min,
    quantile,
    std,
    sum,
    var,
)
from dpnode.sdk.query.errorbars import ErrorBar, shown
from dpnode.sdk.query.errors import QueryError
from tests.sdk.query_table import EDUCATION, codes, table, upload

#: how many stated scales (standard deviations) an answer may be off. Gaussian noise is past 5
#: with p ~ 6e-7, but Laplace noise with p = e^(-5 sqrt 2) ~ 8.5e-4 a value: the tests of
#: Laplace releases draw their noise from a seeded stream (``seed``), so they are
#: deterministic; what they test is the query's arithmetic, the sampler's law is tests/dp's.
WITHIN = 5.0


@pytest.fixture
def people(
    owner_client: sdk.Client, ds_client: sdk.Client, admin_client: sdk.Client, scientist: User
) -> sdk.DatasetHandle:
    admin_client.grant_budget(scientist.email, epsilon=100.0, reason="the query tests")
    return upload(owner_client, ds_client)


def _close(value: float, truth: float, scale: float, slack: float = 1e-9) -> None:
    assert abs(value - truth) <= WITHIN * scale + slack, (value, truth, scale)


def _truth(kind: str, x: np.ndarray) -> float:
    if kind == "count":
        return float(x.size)
    return float({"sum": np.sum, "mean": np.mean, "var": np.var, "std": np.std}[kind](x))


@pytest.mark.usefixtures("sqlite_only")
def test_noised_aggregates_per_two_keys_under_a_filter(
    people: sdk.DatasetHandle, ds_client: sdk.Client, seed
) -> None:
    seed(1)  # 30 Laplace values at 5 s.d.: unseeded, p ~ 30 x 8.5e-4 a run
    data = table(0)
    query = people.query().filter(col("age") >= 30).group_by("education", "sex")
    result = query.agg(count(), sum("income"), mean("income"), var("income"), std("hours")).publish(
        epsilon=8.0
    )
    assert len(result) == 6 and len(ds_client.ledger()) == 1
    rows = result.rows()
    assert [(r["education"], r["sex"]) for r in rows] == [(e, s) for e in EDUCATION for s in (0, 1)]
    edu = codes(data)
    for r in rows:
        inside = (data["age"] >= 30) & (edu == EDUCATION.index(r["education"]))
        inside &= data["sex"] == r["sex"]
        _close(r["count"], inside.sum(), r["count_scale"])
        for name, kind, column in [
            ("income_sum", "sum", "income"),
            ("income_mean", "mean", "income"),
            ("income_var", "var", "income"),
            ("hours_std", "std", "hours"),
        ]:
            _close(r[name], _truth(kind, data[column][inside]), r[f"{name}_scale"], 1.0)
    # one clipped vector per row: the count, income's sum and square, hours' sum and square
    (spend,) = result.receipt.spends
    assert spend.receipt.sensitivity_l1 == pytest.approx(2 * 5, rel=1e-6)


@pytest.mark.usefixtures("sqlite_only")
def test_without_a_group_or_filter_the_count_is_public(people: sdk.DatasetHandle) -> None:
    data = table(0)
    result = (
        people.query()
        .agg(count(), mean("age"), std("age"), sum("hours"))
        .publish(epsilon=2.0, delta=1e-6)
    )
    (row,) = result.rows()
    assert row["count"] == len(data["age"]) and row["count_scale"] == 0.0
    _close(row["age_mean"], data["age"].mean(), row["age_mean_scale"])
    _close(row["age_std"], data["age"].std(), row["age_std_scale"], 0.5)
    _close(row["hours_sum"], data["hours"].sum(), row["hours_sum_scale"])
    (spend,) = result.receipt.spends
    # Gaussian: age's sum and square, hours' sum: an L2 norm of sqrt(3) per row, twice
    assert spend.receipt.mechanism == "gaussian"
    assert spend.receipt.sensitivity_l2 == pytest.approx(2 * math.sqrt(3), rel=1e-6)


@pytest.mark.usefixtures("sqlite_only")
def test_a_count_alone_needs_no_publish(people: sdk.DatasetHandle, ds_client: sdk.Client) -> None:
    result = people.query().agg(count().alias("n")).publish(epsilon=1.0)
    assert result.rows() == [{"n": 600.0, "n_scale": 0.0}] and len(result.receipt) == 0
    assert ds_client.ledger() == [] or len(ds_client.ledger()) == 0


@pytest.mark.usefixtures("sqlite_only")
def test_a_filtered_count_is_charged_as_one_row_moving(people: sdk.DatasetHandle, seed) -> None:
    seed(2)  # a Laplace count at 5 s.d.: unseeded, p ~ 8.5e-4 a run
    data = table(0)
    query = people.query().filter(col("education").isin(["secondary", "tertiary"])).agg(count())
    assert query.sensitivity()["noised"].l1 == pytest.approx(1.0, rel=1e-6)
    (row,) = query.publish(epsilon=1.0).rows()
    _close(row["count"], (codes(data) >= 1).sum(), row["count_scale"])
    assert "one-hot partition" in query.plan()


def _rank_ok(answer: float, x: np.ndarray, q: float, scale: float) -> None:
    """Permute-and-flip over m candidates is off by more than ``scale (ln m + t)`` rows with
    probability below ``e^-t``: m is 4097 here, t 17, so that a test's 9 selections are all
    within with p >= 1 - 9 e^-17 ~ 1 - 4e-7 (at t 12, 9 e^-12 ~ 5.5e-5)."""
    below, at_or_below = (x < answer).sum(), (x <= answer).sum()
    target, off = q * x.size, scale * (math.log(4097) + 17)
    assert below - off <= target <= at_or_below + off, (answer, q, scale)


@pytest.mark.usefixtures("sqlite_only")
def test_quantiles_per_group_and_under_a_filter(
    people: sdk.DatasetHandle, ds_client: sdk.Client
) -> None:
    data = table(0)
    result = (
        people.query()
        .group_by("sex")
        .agg(median("age"), quantile("income", 0.9), min("hours"), max("hours"), mean("age"))
        .publish(epsilon=8.0)
    )
    selected, noised = result.receipt.spends  # the selection first: see compile.py
    assert (selected.role, noised.role) == ("selected", "noised")
    assert selected.receipt.mechanism == "exponential"
    # weights: one part (age's sum; the count is in it) against four quantiles
    assert [s.epsilon for s in result.receipt.spends] == pytest.approx([8.0 * 4 / 6, 8.0 * 2 / 6])
    for r in result.rows():
        rows = data["sex"] == r["sex"]
        assert r["age_median"] == round(r["age_median"])  # an integer column: integers
        _rank_ok(r["age_median"], data["age"][rows], 0.5, r["age_median_scale"])
        _rank_ok(r["income_q0.9"], data["income"][rows], 0.9, r["income_q0.9_scale"])
        _rank_ok(r["hours_min"], data["hours"][rows], 0.0, r["hours_min_scale"])
        _rank_ok(r["hours_max"], data["hours"][rows], 1.0, r["hours_max_scale"])
        assert 0 <= r["hours_min"] <= r["hours_max"] <= 80
    # ungrouped under a filter: the rows outside are in no group
    (row,) = (
        people.query()
        .filter(col("education") == "tertiary")
        .agg(median("income"))
        .publish(epsilon=4.0)
    ).rows()
    tertiary = data["income"][codes(data) == 2]
    _rank_ok(row["income_median"], tertiary, 0.5, row["income_median_scale"])
    assert len(ds_client.ledger()) == 3


@pytest.mark.usefixtures("sqlite_only")
def test_the_integer_median_per_group_regression(people: sdk.DatasetHandle, seed) -> None:
    """ds.groupby("sex").median("age") on an int64 column used to send q as int64, which
    the node refused ("the quantiles must be floating point")."""
    seed(3)  # the medians' ranks within 15% of the rows are not a bound the selection proves
    data = table(0)
    medians = people.groupby("sex").median("age", epsilon=4.0)
    assert sorted(medians) == [0, 1]
    for sex, value in medians.items():
        assert value == round(value)
        lo, hi = np.quantile(data["age"][data["sex"] == sex], [0.35, 0.65])
        assert lo - 1 <= value <= hi + 1
    quartiles = people.groupby("sex").quantile("hours", [0.25, 0.75], epsilon=4.0)
    assert all(len(v) == 2 and v[0] <= v[1] + 5 for v in quartiles.values())


@pytest.mark.usefixtures("sqlite_only")
def test_count_distinct(people: sdk.DatasetHandle, seed) -> None:
    seed(4)  # 3 Laplace values at 5 s.d.: unseeded, p ~ 2.5e-3 a run
    data = table(0)
    (row,) = people.query().agg(count_distinct("education")).publish(epsilon=4.0).rows()
    _close(row["education_count_distinct"], 3, row["education_count_distinct_scale"])
    assert 0 <= row["education_count_distinct"] <= 3
    # the number of education levels is what one row changes by at most 1 (2 as the node
    # charges it today: one level may lose its last row while another gains its first)
    query = people.query().agg(count_distinct("education"))
    assert query.sensitivity()["distinct"].l1 <= 2 + 1e-6
    per_sex = people.query().filter(col("age") < 25).group_by("sex")
    result = per_sex.agg(count_distinct("education")).publish(epsilon=20.0)
    for r in result.rows():
        rows = (data["sex"] == r["sex"]) & (data["age"] < 25)
        truth = len(set(data["education"][rows]))
        _close(r["education_count_distinct"], truth, r["education_count_distinct_scale"])


@pytest.mark.usefixtures("sqlite_only")
def test_top_k_groups_by_count(people: sdk.DatasetHandle, seed) -> None:
    seed(6)  # 2 Laplace counts at 5 s.d.: unseeded, p ~ 1.7e-3 a run
    data = table(0)
    result = people.query().group_by("education").top_k(2).publish(epsilon=1.0)
    # 50% / 30% / 20% of 600 rows: far apart against a noise of scale 2
    assert [r["education"] for r in result.rows()] == ["primary", "secondary"]
    for r in result.rows():
        truth = (data["education"] == r["education"]).sum()
        _close(r["count"], truth, r["count_scale"])
    assert result.columns == ["education", "count", "count_scale"]
    keys_only = people.query().group_by("education", "sex").top_k(1, counts=False)
    (top,) = keys_only.publish(epsilon=1.0).rows()
    assert set(top) == {"education", "sex"} and top["education"] == "primary"
    # with other statistics: the same noised publish, ranked by its counts
    ranked = people.query().group_by("education").agg(mean("income")).top_k(1)
    (best,) = ranked.publish(epsilon=2.0).rows()
    assert best["education"] == "primary" and list(best)[:3] == [
        "education",
        "count",
        "count_scale",
    ]


@pytest.mark.usefixtures("sqlite_only")
def test_describe(people: sdk.DatasetHandle, ds_client: sdk.Client, seed) -> None:
    seed(5)  # the noise of one seeded stream: within the bounds below, in every run
    data = table(0)
    result = people.describe(epsilon=8.0)
    assert [r["column"] for r in result.rows()] == ["sex", "age", "income", "hours"]
    assert len(ds_client.ledger()) == 2  # one noised and one selected publish
    for r in result.rows():
        x = data[r["column"]].astype(float)
        assert r["count"] == x.size
        _close(r["mean"], x.mean(), r["mean_scale"])
        _close(r["std"], x.std(), r["std_scale"], 0.5)
        for label, q in [("min", 0.0), ("25%", 0.25), ("50%", 0.5), ("75%", 0.75), ("max", 1.0)]:
            _rank_ok(r[label], x, q, r[f"{label}_scale"])
    frame = result.frame
    assert list(frame["column"]) == ["sex", "age", "income", "hours"]


@pytest.mark.usefixtures("sqlite_only")
def test_the_result_as_frames_rows_and_text(people: sdk.DatasetHandle) -> None:
    result = people.query().group_by("sex").agg(count(), var("age").alias("v")).publish(epsilon=1.0)
    assert result.columns == ["sex", "count", "count_scale", "v", "v_scale"]
    frame = result.to_pandas()
    assert list(frame.columns) == result.columns and len(frame) == 2
    polars = result.to_polars()
    assert polars.columns == result.columns and polars.height == 2
    text = str(result)
    assert "count_scale" in text and "epsilon 1 split across 1 publish" in text
    assert result.column("sex") == [0, 1] and result["v"] == result.column("v")


@pytest.mark.usefixtures("sqlite_only")
def test_a_notebook_shows_each_statistic_beside_its_95_percent_error_bar(
    people: sdk.DatasetHandle,
) -> None:
    query = people.query().filter(col("age") > 30).group_by("sex")
    result = query.agg(count(), mean("income"), median("age")).publish(epsilon=2.0)
    html = result._repr_html_()
    assert "_scale" not in html and "<th>income_mean</th>" in html  # each scale folded in
    for r in result.rows():
        # Laplace noise: within ln(20) b = 2.12 standard deviations with probability 95%
        for name in ("count", "income_mean"):
            bar = math.log(20) / math.sqrt(2) * r[f"{name}_scale"]
            assert result.error_bars[name][r["sex"]] == ErrorBar(pytest.approx(bar))
            assert f"<td>{shown(r[name], ErrorBar(bar))}</td>" in html
        # a selection among the 121 integers of age's bounds: rows of rank
        rows = r["age_median_scale"] * (math.log(121) + math.log(20))
        assert f"<td>{r['age_median']:g} (± {rows:.0f} rows)</td>" in html
    assert "95% interval of its noise" in html and "rows of rank" in html
    assert "epsilon 2 split across 2 publish(es)" in html
    gaussian = people.query().agg(count(), mean("income")).publish(epsilon=1.0, delta=1e-6)
    (row,) = gaussian.rows()
    assert gaussian.error_bars == {
        "count": [None],  # public: exact
        "income_mean": [ErrorBar(pytest.approx(1.959964 * row["income_mean_scale"]))],
    }
    assert "<td>600</td>" in gaussian._repr_html_() and "exact (public)" in gaussian._repr_html_()


@pytest.mark.usefixtures("sqlite_only")
def test_the_error_bars_cover_95_percent(people: sdk.DatasetHandle, seed) -> None:
    """On the mock data (known here), over independently seeded dry runs: a count's bar is
    exact for Laplace noise, a mean's about right or wider, a median's rank bar a bound."""
    # the noise of one seeded stream: the count's share in [0.915, 0.985] of 360 is +-3 s.d.,
    # which an unseeded run misses with p ~ 2.8e-3 (the mean's >= 0.9: p ~ 3e-5)
    seed(7)
    data = table(1, 100)
    edu = codes(data)
    query = people.query().group_by("education").agg(count(), mean("income"), median("hours"))
    covered: dict[str, list[bool]] = {"count": [], "income_mean": [], "hours_median": []}
    for seed in range(120):
        with sdk.mock(people, seed=seed):
            result = query.publish(epsilon=1.0)
        for i, r in enumerate(result.rows()):
            rows = edu == i
            bars = {name: result.error_bars[name][i] for name in covered}
            covered["count"].append(abs(r["count"] - rows.sum()) <= bars["count"].half_width)
            truth = data["income"][rows].mean()
            covered["income_mean"].append(
                abs(r["income_mean"] - truth) <= bars["income_mean"].half_width
            )
            x, at = data["hours"][rows], r["hours_median"]
            off = bars["hours_median"].half_width
            covered["hours_median"].append(
                (x < at).sum() - off <= x.size / 2 <= (x <= at).sum() + off
            )
    share = {name: float(np.mean(c)) for name, c in covered.items()}
    # 360 draws: a binomial standard deviation of 1.1% around 95%
    assert 0.915 <= share["count"] <= 0.985, share
    # (clipped to the bounds a mean is only nearer the truth: more than 95% in small groups)
    assert share["income_mean"] >= 0.9, share
    assert share["hours_median"] >= 0.95, share


def test_a_columns_quantiles_come_back_in_order_and_never_further_from_the_truth(
    people: sdk.DatasetHandle,
) -> None:
    # At epsilon 0.1 the selections land far from their ranks, in any order; the release puts
    # each cell's quantiles of a column in the order of their q.
    labels = ["min", "25%", "50%", "75%", "max"]
    for _ in range(3):
        for r in people.describe(epsilon=0.1).rows():
            got = [r[label] for label in labels]
            assert got == sorted(got), (r["column"], got)
    result = (
        people.query()
        .group_by("sex")
        .agg(max("hours"), quantile("hours", 0.1), min("hours"), median("hours"), mean("age"))
        .publish(epsilon=0.2)
    )
    for r in result.rows():
        got = [r[k] for k in ("hours_min", "hours_q0.1", "hours_median", "hours_max")]
        assert got == sorted(got)


def test_rearranging_never_adds_to_the_summed_error() -> None:
    # the rearrangement inequality, on draws where the noise reorders the estimates
    from dpnode.sdk.query.compile import rearranged

    rng = np.random.default_rng(11)
    aggs = [min("x"), quantile("x", 0.3), median("x"), max("x")]
    moved = 0
    for _ in range(500):
        truth = np.sort(rng.uniform(0, 10, (4, 3)), axis=0)  # 3 cells, quantiles ordered
        noisy = truth + rng.laplace(0, 3, truth.shape)
        out = rearranged(aggs, {a.name: (noisy[i], np.ones(3)) for i, a in enumerate(aggs)})
        got = np.stack([out[a.name][0] for a in aggs])
        assert bool((np.diff(got, axis=0) >= 0).all())
        for p in (1, 2):
            before = (np.abs(noisy - truth) ** p).sum(axis=0)
            after = (np.abs(got - truth) ** p).sum(axis=0)
            assert bool((after <= before + 1e-9).all())
        moved += int(not np.array_equal(got, noisy))
    assert moved > 100  # the noise did reorder them, often


def test_describe_of_some_columns_shares_the_budget_among_them_alone(
    people: sdk.DatasetHandle, ds_client: sdk.Client
) -> None:
    every = people.describe(epsilon=1.0)
    some = people.describe(epsilon=1.0, columns=["income", "age"])
    assert [r["column"] for r in some.rows()] == ["income", "age"]
    scales = {r["column"]: r for r in every.rows()}
    for r in some.rows():  # two columns of four: each statistic gets twice the epsilon
        full = scales[r["column"]]
        assert r["mean_scale"] == pytest.approx(full["mean_scale"] / 2)
        assert r["50%_scale"] == pytest.approx(full["50%_scale"] / 2)
    lines = ds_client.ledger()
    for columns, words in ((["nope"], "no column 'nope'"), (["education"], "cannot be described")):
        with pytest.raises(QueryError, match=words):
            people.describe(epsilon=1.0, columns=columns)
    assert ds_client.ledger() == lines  # refused before any publish

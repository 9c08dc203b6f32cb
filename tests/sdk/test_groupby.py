"""``ds.groupby(key)``: counts, sums and means per public group, each in one publish.

A row moves from one group to another when it is replaced, so the statistics of all the
groups are released together at the sensitivity of that move; a mean is the noised sum over
the noised count (both released, divided locally) and stays within the column's bounds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpnode import sdk

N = 300


def _data(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sex = rng.integers(0, 2, N)
    return {
        "sex": sex,
        "region": rng.integers(0, 10, N),
        "bmi": np.where(sex == 1, rng.uniform(25, 40, N), rng.uniform(15, 30, N)),
    }


@pytest.fixture
def ds(owner_client: sdk.Client, ds_client: sdk.Client) -> tuple[sdk.DatasetHandle, dict]:
    data = _data(0)
    owner_client.upload_dataset(
        "cohort",
        data,
        bounds={"sex": (0, 1), "region": (0, 9), "bmi": (10, 70)},
        mock=_data(1),
    )
    return ds_client.dataset("cohort"), data


@pytest.mark.usefixtures("sqlite_only")
def test_group_means_counts_and_sums_come_from_one_publish_each(
    ds: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client
) -> None:
    handle, data = ds
    by_sex = handle.groupby("sex")
    assert by_sex.keys == [0, 1]
    means = by_sex.mean("bmi", epsilon=3.0)
    counts = by_sex.count(epsilon=3.0)
    sums = handle.groupby("region").sum("bmi", epsilon=3.0, delta=1e-7)
    assert len(ds_client.ledger()) == 3
    for g in (0, 1):
        rows = data["sex"] == g
        # Laplace of scale 4/3 on the normalised sums (30 in BMI) of ~150 rows, 2/3 on the
        # counts: a count 8 off has p = 2 e^-13.5 / (1 + e^-1.5) ~ 2.2e-6, twice 4.4e-6 a run
        assert means[g] == pytest.approx(data["bmi"][rows].mean(), abs=8.0)
        assert counts[g] == pytest.approx(rows.sum(), abs=8.0)
    for g in range(10):  # Gaussian: sigma ~4.7 on each normalised sum (~140 in BMI) and count
        assert sums[g] == pytest.approx(data["bmi"][data["region"] == g].sum(), abs=1600.0)
    # Laplace: a row's normalised value (in [-1, 1]) and its count lie in one group: a vector
    # of L1 norm 2, which a replaced row moves out of one group and into another
    assert means.receipt.sensitivity_l1 == pytest.approx(2 * 2.0, rel=1e-6)
    assert counts.receipt.sensitivity_l1 == pytest.approx(2.0, rel=1e-6)
    # Gaussian: a row's contribution is one vector of norm sqrt(2), whatever the groups
    assert sums.receipt.sensitivity_l2 == pytest.approx(2 * math.sqrt(2), rel=1e-6)


@pytest.mark.usefixtures("sqlite_only")
def test_a_group_by_costs_the_same_for_2_or_10_groups(
    ds: tuple[sdk.DatasetHandle, dict],
) -> None:
    handle, _ = ds
    few = handle.groupby("sex").mean("bmi", epsilon=1.0, delta=1e-7)
    many = handle.groupby("region").mean("bmi", epsilon=1.0, delta=1e-7)
    assert few.receipt.sensitivity_l2 == pytest.approx(many.receipt.sensitivity_l2, rel=1e-6)
    few = handle.groupby("sex").mean("bmi", epsilon=1.0)
    many = handle.groupby("region").mean("bmi", epsilon=1.0)
    assert few.receipt.sensitivity_l1 == pytest.approx(many.receipt.sensitivity_l1, rel=1e-6)
    assert many.receipt.sensitivity_l1 == pytest.approx(4.0, rel=1e-6)
    assert all(10.0 <= v <= 70.0 for v in many.values())


@pytest.mark.usefixtures("sqlite_only")
def test_a_mean_stays_within_the_bounds_even_at_a_tiny_epsilon(
    ds: tuple[sdk.DatasetHandle, dict],
) -> None:
    handle, _ = ds
    for _ in range(5):
        means = handle.groupby("region").mean("bmi", epsilon=0.01)
        assert all(10.0 <= v <= 70.0 for v in means.values())


@pytest.mark.usefixtures("sqlite_only")
def test_groupby_needs_public_groups(ds: tuple[sdk.DatasetHandle, dict]) -> None:
    handle, _ = ds
    with pytest.raises(KeyError, match="no column 'nope'"):
        handle.groupby("nope")
    with pytest.raises(sdk.DPNodeError, match="float64: group by a categorical or integer"):
        handle.groupby("bmi")
    grouped = handle.groupby("bmi", categories=[20.0, 30.0])  # explicit keys work for floats
    assert grouped.keys == [20.0, 30.0]
    with pytest.raises(KeyError, match="no column 'weight'"):
        handle.groupby("sex").mean("weight", epsilon=1.0)


@pytest.mark.usefixtures("sqlite_only")
def test_several_statistics_in_one_publish(
    ds: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, seed
) -> None:
    # a seeded noise stream: sigma is 6.18 on each normalised part, so the first group's mean
    # (137 rows, normalised mean -0.57) has s.d. 30 x 6.18 x sqrt(1 + 0.57^2) / 137 ~ 1.56 in
    # BMI and abs=6 is 3.85 s.d.: unseeded, p ~ 1.2e-4 a run
    seed(1)
    handle, data = ds
    out = handle.groupby("sex").agg(bmi="mean", region="sum", epsilon=3.0, delta=1e-7)
    assert len(ds_client.ledger()) == 1 and sorted(out) == ["bmi", "count", "region"]
    for g in (0, 1):  # Gaussian of sigma ~7 on each normalised part: at most 5 sigma off
        rows = data["sex"] == g
        assert out["bmi"][g] == pytest.approx(data["bmi"][rows].mean(), abs=6.0)
        assert out["region"][g] == pytest.approx(data["region"][rows].sum(), abs=300.0)
        assert out["count"][g] == pytest.approx(rows.sum(), abs=35.0)
    # three parts of norm at most 1 per row: sqrt(3), twice
    assert out["bmi"].receipt.sensitivity_l2 == pytest.approx(2 * math.sqrt(3), rel=1e-6)
    with pytest.raises(sdk.DPNodeError, match='a statistic is "mean", "sum", "var" or "std"'):
        handle.groupby("sex").agg(bmi="median", epsilon=1.0)
    with pytest.raises(sdk.DPNodeError, match="at least one"):
        handle.groupby("sex").agg(epsilon=1.0)


@pytest.mark.usefixtures("sqlite_only")
def test_medians_and_quantiles_per_group_are_selected(
    ds: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client
) -> None:
    handle, data = ds
    medians = handle.groupby("sex").median("bmi", epsilon=2.0)
    assert sorted(medians) == [0, 1] and len(ds_client.ledger()) == 1
    receipt = medians.receipt
    assert receipt.mechanism == "exponential" and receipt.epsilon == 2.0
    # the median: a row leaving one group and entering the other moves each score by 1/2
    assert receipt.sensitivity_l1 == 1 and receipt.noise_scale == pytest.approx(1.0)
    for g in (0, 1):  # ~150 rows per group, epsilon 2: within a few ranks of the median
        rows = data["sex"] == g
        lo, hi = np.quantile(data["bmi"][rows], [0.3, 0.7])
        assert lo - 1 <= medians[g] <= hi + 1
    quartiles = handle.groupby("region").quantile("bmi", [0.25, 0.75], epsilon=1.0)
    assert sorted(quartiles) == list(range(10))
    assert all(len(v) == 2 and all(10 <= x <= 70 for x in v) for v in quartiles.values())
    assert quartiles.receipt.noise_scale == pytest.approx(2 * 2 * 0.75 / 0.5)
    with pytest.raises(sdk.DPNodeError, match=r"q must be"):
        handle.groupby("sex").quantile("bmi", 1.5, epsilon=1.0)
    with pytest.raises(sdk.DPNodeError, match=r"\.median\(column\)"):
        handle.groupby("sex").agg(bmi="median", epsilon=1.0)
    # in mock mode: the same mechanism on the mock data, nothing charged
    with sdk.mock(handle):
        dry = handle.groupby("sex").median("bmi", epsilon=1.0)
        assert dry.receipt.mock and sorted(dry) == [0, 1]
    assert len(ds_client.ledger()) == 2


@pytest.mark.usefixtures("sqlite_only")
def test_a_quantile_at_the_end_of_the_range_is_within_the_declared_bounds(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    """The node's candidates span the column's tracked range, which was a rounding margin
    wider than its declared bounds (the lowest candidate some 1e-11 below 10). Every row at
    the lower bound, the minimum is the lowest candidate: the bound itself."""
    rng = np.random.default_rng(3)
    data = {"sex": rng.integers(0, 2, N), "bmi": np.full(N, 10.0)}
    owner_client.upload_dataset("floor", data, bounds={"sex": (0, 1), "bmi": (10, 70)})
    lowest = ds_client.dataset("floor").groupby("sex").quantile("bmi", 0.0, epsilon=8.0)
    assert lowest == {0: 10.0, 1: 10.0}

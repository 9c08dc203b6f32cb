"""Group keys discovered privately, through the real app: ``discover_keys``, a query and SQL
grouped by a column without public keys, and the refusals (docs/statistics.md, "Keys the
data holds")."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpnode import sdk
from dpnode.core.dp.keysets import threshold
from dpnode.core.engine import GraphBuilder, encode
from dpnode.sdk import BudgetExceededError, InvalidRequestError
from dpnode.sdk.query import count, mean
from dpnode.sdk.query.errors import InvalidBudgetError, NoPublicKeysError

pytestmark = pytest.mark.usefixtures("sqlite_only")

#: a policy whose delta budget pays for thresholds: half of it for deltas charged directly
POLICY = "zcdp_delta_share = 0.5\n[roles.data_scientist]\nepsilon = 50.0\ndelta = 1e-3\n"
N = 3000


def _frame(seed: int, n: int = N) -> pd.DataFrame:
    """Zip-like codes in [0, 99999]: 20 frequent ones (about 140 rows each) and 200 rare ones
    held by one row each; a category, an income."""
    rng = np.random.default_rng(seed)
    frequent = rng.choice(np.arange(10_000, 99_999, 37), 20, replace=False)
    rare = rng.choice(np.arange(1, 9_999), n // 15, replace=False)
    zips = np.concatenate([rng.choice(frequent, n - rare.size), rare])
    return pd.DataFrame(
        {
            "zip": zips,
            "sex": rng.choice(["F", "M"], n),
            "income": rng.uniform(0, 200_000, n),
            "score": rng.uniform(0, 1, n),
        }
    )


# The tests that compare the keys found with the frequent ones draw their noise from a seeded
# stream (``seed``): the table holds 200 keys of one row, each over the threshold with
# probability at most delta = 1e-6, so unseeded one of them is found with p up to 2e-4 a run.
# What they test is the discovery's plumbing; the threshold's law is tests/dp's.
@pytest.fixture
def census(
    admin_client: sdk.Client, owner_client: sdk.Client, ds_client: sdk.Client
) -> tuple[sdk.DatasetHandle, pd.DataFrame]:
    admin_client.set_policy(POLICY, reason="thresholds need a delta budget")
    data = _frame(0)
    owner_client.upload_dataset(
        "census",
        data,
        bounds={"zip": (0, 99_999), "income": (0, 200_000), "score": (0, 1)},
        categories={"sex": ["F", "M"]},
    )
    return ds_client.dataset("census"), data


def test_discovered_keys_are_the_frequent_keys(
    census: tuple[sdk.DatasetHandle, pd.DataFrame],
    ds_client: sdk.Client,
    seed,
) -> None:
    seed(1)  # a seeded noise stream: see the note above census
    ds, data = census
    before = ds_client.budget().spent_epsilon
    found = ds.query().group_by("zip").discover_keys(epsilon=1.0, delta=1e-6)
    counts = data["zip"].value_counts()
    frequent = {(int(k),) for k, c in counts.items() if c >= 60}
    assert set(found.keys) == frequent  # every frequent key, no key of one row
    assert found.threshold == threshold(1.0, 1e-6) == found.receipt.threshold
    r = found.receipt
    assert r.mechanism == "threshold" and r.asked_delta == 1e-6
    # charged: the threshold's delta as asked, and the sampler's deviation (tiny) on top
    assert r.delta == pytest.approx(1e-6, rel=1e-6) and r.delta >= 1e-6
    assert r.threshold_delta is not None and r.threshold_delta <= 1e-6
    assert r.noise_scale == pytest.approx(2.0) and r.sensitivity_l1 == pytest.approx(2.0)
    assert "keys whose noisy count is at least 27.2" in str(r)
    assert ds_client.budget().spent_epsilon == pytest.approx(before + 1.0)
    for (key,), noisy in zip(found.keys, found.counts, strict=True):
        # discrete Laplace of scale 2: 30 scales away has probability below e^-30
        assert abs(noisy - counts[key]) <= 60
    assert found.keys == sorted(found.keys)


def test_a_query_discovers_its_keys_then_releases_per_key(
    census: tuple[sdk.DatasetHandle, pd.DataFrame],
    ds_client: sdk.Client,
    seed,
) -> None:
    seed(2)  # a seeded noise stream: see the note above census
    ds, data = census
    q = ds.query().group_by("zip").agg(count(), mean("income"))
    planned = q.plan(epsilon=1.0, delta=1e-6)
    assert "publish 0: the keys of zip above a noisy threshold" in planned
    assert "epsilon 0.5, delta 1e-06" in planned and "publish 1: noised" in planned
    before = ds_client.budget().spent_epsilon
    result = q.publish(epsilon=1.0, delta=1e-6)
    spends = result.receipt.spends
    assert [s.role for s in spends] == ["keys", "noised"]
    assert spends[0].epsilon == pytest.approx(0.5) and spends[0].delta == 1e-6
    assert spends[1].delta is None and spends[1].receipt.mechanism == "laplace"
    assert ds_client.budget().spent_epsilon == pytest.approx(before + 1.0)
    truth = data.groupby("zip").agg(n=("income", "size"), m=("income", "mean"))
    rows = result.rows()
    assert {r["zip"] for r in rows} == {int(k) for k in truth.index[truth["n"] >= 60]}
    for r in rows:
        assert abs(r["count"] - truth.loc[r["zip"], "n"]) <= 30 * r["count_scale"] + 1


def test_two_columns_are_discovered_as_combinations(
    census: tuple[sdk.DatasetHandle, pd.DataFrame],
    seed,
) -> None:
    seed(3)  # a seeded noise stream: see the note above census
    ds, data = census
    found = ds.query().group_by("zip", "sex").discover_keys(epsilon=2.0, delta=1e-6)
    counts = data.groupby(["zip", "sex"]).size()
    assert all(counts[k] >= 20 for k in found.keys)  # threshold 15: no rare combination
    assert {k for k, c in counts.items() if c >= 50} <= set(found.keys)
    assert {s for _, s in found.keys} == {"F", "M"}  # categories decoded by name
    result = ds.query().group_by("zip", "sex").agg(count()).publish(epsilon=2.0, delta=1e-6)
    assert {(r["zip"], r["sex"]) for r in result.rows()} <= set(counts.index)


def test_sql_group_by_a_column_without_public_keys_discovers_them(
    census: tuple[sdk.DatasetHandle, pd.DataFrame],
    ds_client: sdk.Client,
    seed,
) -> None:
    seed(4)  # a seeded noise stream: see the note above census
    _, data = census
    result = ds_client.sql(
        "SELECT zip, COUNT(*) AS n FROM census GROUP BY zip", epsilon=1.0, delta=1e-6
    )
    frequent = {int(k) for k, c in data["zip"].value_counts().items() if c >= 60}
    assert {r["zip"] for r in result.rows()} == frequent
    with pytest.raises(NoPublicKeysError, match="delta="):
        ds_client.sql("SELECT zip, COUNT(*) AS n FROM census GROUP BY zip", epsilon=1.0)


@pytest.mark.parametrize(
    ("columns", "delta", "error", "match"),
    [
        (("zip",), None, NoPublicKeysError, "keys=.*delta="),
        (("zip",), 0.0, InvalidBudgetError, "delta"),
        (("zip",), -1e-6, InvalidBudgetError, "delta"),
        (("zip",), math.nan, InvalidBudgetError, "delta"),
        (("score",), 1e-6, NoPublicKeysError, "keys="),
    ],
)
def test_refusals_charge_nothing(
    census: tuple[sdk.DatasetHandle, pd.DataFrame],
    ds_client: sdk.Client,
    columns: tuple[str, ...],
    delta: float | None,
    error: type[Exception],
    match: str,
) -> None:
    ds, _ = census
    before = ds_client.budget().spent_epsilon
    with pytest.raises(error, match=match):
        ds.query().group_by(*columns).agg(count()).publish(epsilon=1.0, delta=delta)
    if delta is not None:
        with pytest.raises(error, match=match):
            ds.query().group_by(*columns).discover_keys(epsilon=1.0, delta=delta)
    assert ds_client.budget().spent_epsilon == before


def _keys_frame(ds: sdk.DatasetHandle, column: str, dtype: str) -> bytes:
    """A key release of one column, as a graph sent past the SDK's own checks."""
    b = GraphBuilder()
    x = b.input(f"dataset:{ds.id}/{column}", dtype, (ds.row_count,))
    return encode(b.build([b.op("key_counts", x)]))


@pytest.mark.parametrize(
    ("column", "dtype", "delta", "match"),
    [
        ("score", "float64", 1e-6, "keys="),
        ("zip", "int64", None, "delta"),
        ("zip", "int64", 0.5, "too large"),
        ("zip", "int64", -1e-6, "delta"),
        ("zip", "int64", math.nan, "delta"),
    ],
)
def test_the_node_refuses_with_a_4xx_and_charges_nothing(
    census: tuple[sdk.DatasetHandle, pd.DataFrame],
    ds_client: sdk.Client,
    column: str,
    dtype: str,
    delta: float | None,
    match: str,
) -> None:
    ds, _ = census
    before = ds_client.budget()
    with pytest.raises(InvalidRequestError, match=match):
        ds_client.publish_frame(_keys_frame(ds, column, dtype), epsilon=1.0, delta=delta)
    with pytest.raises(InvalidRequestError, match="delta must be"):
        ds_client.publish_frame(_keys_frame(ds, "zip", "int64"), epsilon=1.0, delta=0.0)
    after = ds_client.budget()
    assert (after.spent_epsilon, after.spent_delta) == (before.spent_epsilon, before.spent_delta)


def test_the_default_policy_keeps_too_little_delta_for_a_threshold(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    """As shipped, 1/1024 of a user's delta pays for deltas charged directly: a threshold at
    delta 1e-6 on the default budget (delta 1e-6) is refused, nothing charged, and the
    message says what the budget is."""
    owner_client.upload_dataset("census", _frame(0)[["zip"]], bounds={"zip": (0, 99_999)})
    ds = ds_client.dataset("census")
    with pytest.raises(BudgetExceededError, match="delta budget"):
        ds.query().group_by("zip").discover_keys(epsilon=1.0, delta=1e-6)
    assert ds_client.budget().spent_epsilon == 0


def test_the_receipt_states_epsilon_delta_and_the_threshold(
    census: tuple[sdk.DatasetHandle, pd.DataFrame], ds_client: sdk.Client
) -> None:
    ds, _ = census
    values, receipt = ds_client.publish_frame(
        _keys_frame(ds, "zip", "int64"), epsilon=0.5, delta=1e-7
    )
    assert values[0].shape == (20, 2)  # the 20 frequent zips, no rare one
    assert receipt["mechanism"] == "threshold" and receipt["epsilon"] == 0.5
    assert receipt["asked_delta"] == 1e-7 and receipt["threshold"] == threshold(0.5, 1e-7)
    assert receipt["threshold_delta"] <= 1e-7 and receipt["rows_moved"] == 1
    # the delta charged is the threshold's as asked and the sampler's deviation, tiny
    assert 0 <= receipt["sampler_delta"] < 1e-15
    assert receipt["delta"] == pytest.approx(1e-7 + receipt["sampler_delta"], abs=1e-18)


def test_more_keys_than_a_query_holds_keep_the_largest_noisy_counts(
    census: tuple[sdk.DatasetHandle, pd.DataFrame], monkeypatch: pytest.MonkeyPatch, seed
) -> None:
    """Discovered keys beyond the groups a query may hold are cut to those of the largest
    noisy counts (post-processing) rather than refused once the discovery is charged."""
    seed(5)  # a seeded noise stream: see the note above census
    ds, data = census
    monkeypatch.setattr("dpnode.sdk.query.keys.MAX_CELLS", 10)
    result = ds.query().group_by("zip").agg(count()).publish(epsilon=2.0, delta=1e-6)
    rows = result.rows()
    assert len(rows) == 10
    counts = data["zip"].value_counts()
    assert {r["zip"] for r in rows} <= {int(k) for k, c in counts.items() if c >= 60}
    assert [s.role for s in result.receipt.spends] == ["keys", "noised"]

"""The builder's releases move by no more than the node charges, on adversarial neighbours.

Run in mock mode (the node's own release, locally, on the mock data: here the data itself),
at an epsilon so large that the noise is negligible: the released sums on a table and on
the table with one row replaced must differ by at most the charged L1 sensitivity, and the
replacement below, chosen to move every part as far as it can, reaches it.
"""

from __future__ import annotations

import numpy as np
import pytest

from dpnode import sdk
from dpnode.sdk.query import col, count, count_distinct, sum
from tests.sdk.query_table import BOUNDS, EDUCATION, table

HUGE = 1e7


def _handle(owner: sdk.Client, scientist: sdk.Client, name: str, data: dict) -> sdk.DatasetHandle:
    owner.upload_dataset(name, data, bounds=BOUNDS, categories={"education": EDUCATION}, mock=data)
    return scientist.dataset(name)


def _neighbour(data: dict) -> dict:
    """One row that is in the filter, in the first group and at the lowest income, replaced
    by one in the filter, in the last group and at the highest income."""
    out = {k: v.copy() for k, v in data.items()}
    i = int(np.flatnonzero((data["age"] >= 30) & (data["education"] == "primary"))[0])
    out["education"][i], out["sex"][i], out["income"][i] = "tertiary", 1 - data["sex"][i], 0.0
    return out


def _released(ds: sdk.DatasetHandle) -> tuple[np.ndarray, float]:
    query = ds.query().filter(col("age") >= 30).group_by("education", "sex")
    with sdk.mock(ds):
        result = query.agg(count(), sum("income")).publish(epsilon=HUGE)
    c = np.array(result.column("count"))
    # the released normalised sums: (sum - middle * count) / half, middle = half = 100
    s1 = (np.array(result.column("income_sum")) - 100.0 * c) / 100.0
    return np.concatenate([c, s1]), result.receipt.spends[0].receipt.sensitivity_l1


@pytest.mark.usefixtures("sqlite_only")
def test_a_replaced_row_moves_the_noised_parts_by_at_most_what_is_charged(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    data = table(0, 200)
    data["income"][(data["age"] >= 30) & (data["education"] == "primary")] = 200.0
    here, l1 = _released(_handle(owner_client, ds_client, "here", data))
    there, l1_there = _released(_handle(owner_client, ds_client, "there", _neighbour(data)))
    assert l1 == l1_there == pytest.approx(4.0, rel=1e-6)  # count and sum: 2 parts, twice
    moved = float(np.abs(here - there).sum())
    assert 4.0 - 1e-3 <= moved <= l1 + 1e-3


@pytest.mark.usefixtures("sqlite_only")
def test_count_distinct_moves_by_at_most_what_is_charged(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    data = table(0, 200)
    data["education"][:] = "primary"
    data["education"][0] = "tertiary"  # the only tertiary row
    there = {k: v.copy() for k, v in data.items()}
    there["education"][0] = "primary"  # one level loses its last row
    values, charged = [], []
    for name, d in (("here", data), ("there", there)):
        ds = _handle(owner_client, ds_client, name, d)
        with sdk.mock(ds):
            result = ds.query().agg(count_distinct("education")).publish(epsilon=HUGE)
        values.append(result.column("education_count_distinct")[0])
        charged.append(result.receipt.spends[0].receipt.sensitivity_l1)
    assert values == pytest.approx([2.0, 1.0], abs=1e-3)
    assert abs(values[0] - values[1]) <= min(charged) + 1e-3

"""Counts are noised on the integers: the preview, the receipt and the values agree.

A count the node proves integral on every dataset gets the discrete Laplace of scale
``Δ₁ / ε`` on the integers (no grid inflation); a float sum of float data keeps the fine grid.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpnode import sdk

N = 300


@pytest.fixture
def ds(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    rng = np.random.default_rng(7)
    owner_client.upload_dataset(
        "visits",
        {"sex": rng.integers(0, 2, N), "bmi": rng.uniform(15, 40, N)},
        bounds={"sex": (0, 1), "bmi": (10, 70)},
    )
    return ds_client.dataset("visits")


@pytest.mark.usefixtures("sqlite_only")
def test_a_count_pair_is_noised_on_the_integers_at_its_own_sensitivity(
    ds: sdk.DatasetHandle,
) -> None:
    sex = ds["sex"]
    counts = torch.stack([(sex == 0).sum(), (sex == 1).sum()])
    assert counts.sensitivity().l1 == pytest.approx(2.0, rel=1e-9)
    # the preview is the release's scale, exactly: 2 / epsilon, no rounding inflation
    assert counts.noise_scale(epsilon=1.0) == 2.0
    released = counts.publish(epsilon=1.0)
    assert released.receipt.noise_scale == 2.0
    assert released.receipt.sensitivity_l1 == pytest.approx(2.0, rel=1e-9)
    values = released.numpy().astype(np.float64)
    assert np.all(values == np.rint(values))
    # a float count too (integers a float32 holds exactly)
    share = (sex == 1).float().sum()
    assert share.noise_scale(epsilon=0.5) == 2.0
    out = share.publish(epsilon=0.5)
    assert out.receipt.noise_scale == 2.0 and float(out) == round(float(out))


@pytest.mark.usefixtures("sqlite_only")
def test_a_float_sum_of_float_data_keeps_the_fine_grid(ds: sdk.DatasetHandle) -> None:
    total = ds["bmi"].sum()
    l1 = total.sensitivity().l1
    scale = total.noise_scale(epsilon=1.0)
    # the fine grid's inflation, below 0.1%, and never below the textbook scale
    assert l1 < scale <= l1 * (1 + 2.0**-10) * (1 + 1e-12)
    released = total.publish(epsilon=1.0)
    assert released.receipt.noise_scale == scale

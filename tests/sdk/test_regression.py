"""``sdk.linear_regression``: least squares from one release of noised sufficient statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpnode import sdk

N = 20_000
TRUE = np.array([2.0, -1.0, 0.5])


@pytest.fixture
def data(owner_client: sdk.Client, ds_client: sdk.Client) -> tuple[sdk.DatasetHandle, dict]:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (N, 3))
    y = np.clip(x @ TRUE + 1.0 + rng.normal(0, 0.1, N), -2, 5)
    columns = {"x": x.astype(np.float32), "y": y}
    owner_client.upload_dataset("points", columns, bounds={"x": (0.0, 1.0), "y": (-2.0, 5.0)})
    return ds_client.dataset("points"), columns


@pytest.mark.usefixtures("sqlite_only")
def test_coefficients_from_one_release_match_least_squares(
    data: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client
) -> None:
    ds, columns = data
    x, y = ds.tensors("x", "y")
    model = sdk.linear_regression(x, y, epsilon=8.0)
    assert len(ds_client.ledger()) == 1  # one publish, charged once
    z = np.c_[columns["x"].astype(np.float64), np.ones(N)]
    exact = np.linalg.lstsq(z, columns["y"], rcond=None)[0]
    fitted = np.r_[model.coef.numpy(), model.intercept]
    query = np.r_[0.5, 0.5, 0.5, 1.0]
    # The error the release's noise allows, to first order: w = (G + E + rI)^-1 (m + e) moves by
    # G^-1 (e - E w - r w); with every noise entry's standard deviation at most the receipt's
    # scale s, cov(e - E w) <= s^2 (1 + |w|^2) I, so each direction u of w moves by
    # r u.G^-1 w plus noise of standard deviation at most s sqrt(1 + |w|^2) |G^-1 u|.
    gram_inv = np.linalg.inv(z.T @ z)
    spread = model.receipt.noise_scale * math.sqrt(1 + exact @ exact)

    def allowed(u: np.ndarray) -> float:
        bias = model.ridge * abs(u @ gram_inv @ exact)
        return bias + 6 * spread * float(np.linalg.norm(gram_inv @ u)) + 1e-9

    for i in range(4):
        assert abs(fitted[i] - exact[i]) <= allowed(np.eye(4)[i]), (i, fitted, exact)
    assert model.ridge > 0  # chosen from the noise
    pred = model.predict(torch.tensor([[0.5, 0.5, 0.5]]))
    assert abs(float(pred) - query @ exact) <= allowed(query)
    # and epsilon 8 leaves a useful fit: the slopes are 2, -1 and 0.5
    assert max(allowed(np.eye(4)[i]) for i in range(4)) < 0.1
    through_origin = sdk.linear_regression(x, y, epsilon=1.0, fit_intercept=False, ridge=0.5)
    assert through_origin.intercept == 0.0 and through_origin.ridge == 0.5
    assert through_origin.coef.shape == (3,)


@pytest.mark.usefixtures("sqlite_only")
def test_bad_inputs_are_refused_before_anything_is_published(
    data: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client
) -> None:
    ds, _ = data
    x, y = ds.tensors("x", "y")
    with pytest.raises(sdk.DPNodeError, match="remote x and y"):
        sdk.linear_regression(torch.zeros(N, 3), y, epsilon=1.0)
    with pytest.raises(sdk.DPNodeError, match=r"x must be \(rows, features\)"):
        sdk.linear_regression(x[:, 0], y, epsilon=1.0)
    with pytest.raises(sdk.DPNodeError, match="ridge must be"):
        sdk.linear_regression(x, y, epsilon=1.0, ridge=-1.0)
    assert ds_client.ledger() == []

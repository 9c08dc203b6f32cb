"""``sdk.linear_regression``: least squares from one release of noised sufficient statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpnode import sdk

N = 2000
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
    np.testing.assert_allclose(model.coef.numpy(), exact[:3], atol=0.3)
    assert model.intercept == pytest.approx(exact[3], abs=0.3)
    assert model.ridge > 0  # chosen from the noise
    pred = model.predict(torch.tensor([[0.5, 0.5, 0.5]]))
    assert float(pred) == pytest.approx(float(np.r_[0.5, 0.5, 0.5, 1.0] @ exact), abs=0.3)
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

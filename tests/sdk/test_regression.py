"""``sdk.linear_regression``: least squares from one release of noised sufficient statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpnode import sdk
from dpnode.sdk._moments import choose_plan

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
    data: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, seed
) -> None:
    # a seeded noise stream: 6 first-order s.d. of a combination of Laplace noises is past
    # with p between e^-(6 sqrt 2) ~ 2e-4 (one Laplace) and 2e-9 (Gaussian), not computed
    seed(1)
    ds, columns = data
    x, y = ds.tensors("x", "y")
    model = sdk.linear_regression(x, y, epsilon=8.0)
    assert len(ds_client.ledger()) == 1  # one publish, charged once
    z = np.c_[columns["x"].astype(np.float64), np.ones(N)]
    exact = np.linalg.lstsq(z, columns["y"], rcond=None)[0]
    fitted = np.r_[model.coef.numpy(), model.intercept]
    query = np.r_[0.5, 0.5, 0.5, 1.0]
    # The error the release's noise allows, to first order: w = (G + E + R)^-1 (m + e) moves by
    # G^-1 (e - E w - R w); the noise on each released moment (scaled units) has a standard
    # deviation of at most sqrt(2) times the receipt's scale over the smallest weight, which
    # in the data's units is at most s = that times the largest product of two half-widths
    # (0.5 for x, 3.5 for y), so cov(e - E w) <= s^2 (1 + |w|^2) I, and each direction u of w
    # moves by u.G^-1 R w plus noise of standard deviation at most s sqrt(1 + |w|^2) |G^-1 u|.
    # The ridge r is on the scaled features: R = r diag(0.5^2, ..., 0) in the data's units.
    plan = choose_plan(3, target=True, epsilon=8.0, delta=None)
    # one clipped vector per row: a replaced row moves it by twice its exact norm bound
    assert model.receipt.sensitivity_l1 == pytest.approx(2 * plan.bound, rel=1e-6)
    weight = min(plan.first, plan.square, plan.cross)
    scale = math.sqrt(2) * model.receipt.noise_scale / weight * 0.5 * 3.5
    gram_inv = np.linalg.inv(z.T @ z)
    spread = scale * math.sqrt(1 + exact @ exact)
    penalty = np.diag([0.25, 0.25, 0.25, 0.0])

    def allowed(u: np.ndarray) -> float:
        bias = model.ridge * abs(u @ gram_inv @ penalty @ exact)
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


@pytest.fixture
def classes(owner_client: sdk.Client, ds_client: sdk.Client) -> tuple[sdk.DatasetHandle, dict]:
    """Two well-separated classes in a table whose features are far from centred (in [0, 10]
    and [100, 200]): the fit must find the boundary in the features' own units."""
    rng = np.random.default_rng(1)
    n = 400
    label = rng.integers(0, 2, n)
    columns = {
        "a": np.clip(3 + 4 * label + rng.normal(0, 1, n), 0, 10).astype(np.float32),
        "b": np.clip(150 + rng.normal(0, 20, n), 100, 200).astype(np.float32),  # no information
        "label": label,
    }
    owner_client.upload_dataset(
        "classes", columns, bounds={"a": (0.0, 10.0), "b": (100.0, 200.0), "label": (0, 1)}
    )
    return ds_client.dataset("classes"), columns


@pytest.mark.usefixtures("sqlite_only")
def test_logistic_regression_separates_classes_within_its_epsilon(
    classes: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client, seed
) -> None:
    ds, columns = classes
    seed(2)  # a seeded noise stream: the accuracy's tail under the noise is not computed
    x, y = ds.tensors(["a", "b"], "label")
    # the declared bounds, widened by at most the float32 cast's rounding
    scaler = sdk.bounds_scaler(x)
    assert torch.allclose(scaler.mid, torch.tensor([5.0, 150.0]), rtol=1e-6)
    assert torch.allclose(scaler.scale, torch.tensor([0.2, 0.02]), rtol=1e-6)
    fit = sdk.logistic_regression(x, y, epsilon=2.0, progress=False)
    spent = ds_client.budget().spent_epsilon
    assert 0.99 * 2.0 <= spent <= 2.0 and fit.epsilon == pytest.approx(spent)
    # every step is one ordinary clipped-gradient publish: the run's steps, nothing else
    assert fit.run.steps == len(fit.run.history) == 40
    # each a Gaussian release for 2C (and the node's float32 rounding)
    assert all(s.receipt.sensitivity_l2 == pytest.approx(1.0, rel=1e-4) for s in fit.run.history)
    local = torch.from_numpy(np.c_[columns["a"], columns["b"]])
    accuracy = float((fit.predict(local).numpy() == columns["label"]).mean())
    assert accuracy > 0.93  # the Bayes rate is 0.98; chance is 0.5
    # the boundary x0 = 5 in the features' units, the second feature nearly ignored
    assert abs(float(fit.coef[1])) < 0.2 * abs(float(fit.coef[0]))
    assert 4.0 < -fit.intercept / float(fit.coef[0]) - 150 * float(fit.coef[1] / fit.coef[0]) < 6.0
    probs = fit.predict_proba(torch.tensor([[1.0, 150.0], [9.0, 150.0]]))
    assert float(probs[0]) < 0.2 < 0.8 < float(probs[1])


@pytest.mark.usefixtures("sqlite_only")
def test_logistic_regression_refuses_bad_inputs_before_anything_is_published(
    classes: tuple[sdk.DatasetHandle, dict], ds_client: sdk.Client
) -> None:
    ds, _ = classes
    x, y = ds.tensors(["a", "b"], "label")
    with pytest.raises(sdk.DPNodeError, match="remote x and y"):
        sdk.logistic_regression(torch.zeros(400, 2), y, epsilon=1.0)
    with pytest.raises(sdk.DPNodeError, match=r"x must be \(rows, features\)"):
        sdk.logistic_regression(x[:, 0], y, epsilon=1.0)
    with pytest.raises(sdk.BudgetExceededError):
        sdk.logistic_regression(x, y, epsilon=1e6)
    assert ds_client.ledger() == []

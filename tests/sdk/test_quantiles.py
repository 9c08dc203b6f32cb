"""Medians and quantiles of private columns, from the torch calls an analyst writes, against
the node and in mock mode (the exponential mechanism: docs/remote-tensors.md, Statistics)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpnode import sdk
from tests.sdk.conftest import cohort, remote_dataset

pytestmark = pytest.mark.usefixtures("sqlite_only")


def test_median_and_quantiles_publish_by_the_exponential_mechanism(
    owner_client: sdk.Client, ds_client: sdk.Client, seed
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    seed(1)  # a seeded selection stream: the quartiles' "within 20" is no bound it proves
    data = cohort(40, 0)
    before = ds_client.budget().remaining_epsilon
    median = torch.median(ds["age"])
    assert median.shape == () and median.dtype == torch.int64  # as torch's, on metadata
    got = median.publish(epsilon=1.0)
    receipt = got.receipt
    assert receipt.mechanism == "exponential" and receipt.sensitivity_l1 == 1
    assert receipt.epsilon == 1.0 and receipt.delta < 1e-9  # the sampler's distance only
    assert ds_client.budget().remaining_epsilon == pytest.approx(before - 1.0, abs=1e-8)
    assert float(got).is_integer() and 0 <= float(got) <= 120  # an integer of the range
    assert "exponential mechanism" in str(receipt)

    q = torch.tensor([0.25, 0.5, 0.75])
    quartiles = torch.quantile(ds["bmi"], q).publish(epsilon=6.0)
    assert quartiles.shape == (3,) and quartiles.receipt.noise_scale == pytest.approx(1.0)
    assert torch.all((quartiles >= 10) & (quartiles <= 70))
    # at epsilon 2 each, 40 values: on this data each lands within the middle of the range
    # (at epsilon 1 each, a quartile once landed 24 away and failed a CI run)
    truth = np.quantile(data["bmi"], [0.25, 0.5, 0.75])
    assert np.all(np.abs(quartiles.numpy() - truth) < 20)
    for call in (
        lambda: ds["bmi"].quantile(0.9),
        lambda: torch.nanmedian(ds["bmi"]),
        lambda: ds["bmi"].nanquantile(torch.tensor(0.1)),
    ):
        assert call().publish(epsilon=0.5).receipt.mechanism == "exponential"


def test_a_quantile_is_released_on_its_own(owner_client: sdk.Client, ds_client: sdk.Client) -> None:
    ds = remote_dataset(owner_client, ds_client)
    median = torch.median(ds["bmi"])
    with pytest.raises(sdk.NotPublishableError, match="released on its own") as info:
        median * 2
    assert str(info.value).startswith("Tensor.mul on a quantile (median) of private data")
    with pytest.raises(sdk.InvalidRequestError, match="without delta"):
        median.publish(epsilon=1.0, delta=1e-6)
    spent = ds_client.budget().remaining_epsilon
    with pytest.raises(sdk.PrivacyTrackingError, match="separately"):
        sdk.publish([median, ds["bmi"].sum()], epsilon=1.0)
    assert ds_client.budget().remaining_epsilon == spent  # refused before any charge
    # torch's own checks, on metadata
    with pytest.raises(RuntimeError, match="float or double"):
        torch.quantile(ds["age"], 0.5)
    with pytest.raises(RuntimeError, match=r"\[0, 1\]"):
        torch.quantile(ds["bmi"], 1.5)
    # along a dim it stays a sort, which has no privacy rule: refused as it is recorded
    with pytest.raises(sdk.NotPublishableError, match="one column at a time"):
        torch.median(ds["scan"].reshape(40, 6), dim=0)


def test_quantiles_in_mock_mode_and_of_public_values(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    with sdk.mock(ds) as m:
        got = torch.median(ds["bmi"]).publish(epsilon=1.0)
        assert got.receipt.mock and got.receipt.mechanism == "exponential"
        # evaluate is exact, without noise: torch's own median of the mock data
        mock_bmi = torch.from_numpy(ds.mock()["bmi"])
        torch.testing.assert_close(m.evaluate(torch.median(ds["bmi"])), torch.median(mock_bmi))
        torch.testing.assert_close(
            m.evaluate(torch.quantile(ds["bmi"], torch.tensor([0.1, 0.9]))),
            torch.quantile(mock_bmi, torch.tensor([0.1, 0.9])),
        )
    w = np.array([5.0, 1.0, 4.0, 2.0, 3.0], dtype=np.float32)
    owner_client.upload_model("public-w", {"w": w}, tags=["demo"], public=True)
    state = ds_client.model("public-w").state_dict()
    assert torch.quantile(state["w"], 0.5).sensitivity().l1 == 0


def test_a_columns_quantile_is_a_point_of_its_declared_range(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    """The candidates of a column's quantile are the 4097 points of its declared bounds (the
    tracked range is a rounding margin wider: the lowest candidate was 1e-11 below them)."""
    rng = np.random.default_rng(4)
    data = {"low": np.full(60, 10.0), "high": np.full(60, 70.0), "bmi": rng.uniform(15, 60, 60)}
    bounds = {name: (10.0, 70.0) for name in data}
    ds = ds_client.dataset(owner_client.upload_dataset("ends", data, bounds=bounds).id)
    assert float(torch.quantile(ds["low"], 0.0).publish(epsilon=4.0)) == 10.0
    assert float(torch.quantile(ds["high"], 1.0).publish(epsilon=4.0)) == 70.0
    median = float(torch.median(ds["bmi"]).publish(epsilon=1.0))
    step = (median - 10.0) * 4096 / 60.0
    assert step == round(step) and 0 <= step <= 4096

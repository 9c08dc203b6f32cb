"""``sdk.bounds_scaler``: each feature mapped from its public range, the same for any values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpnode import sdk

N = 30
BOUNDS = {"age": (0, 120), "bmi": (10.0, 70.0), "image": (0.0, 16.0)}


def _columns(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "age": rng.integers(18, 90, N),
        "bmi": rng.uniform(15, 45, N).astype(np.float32),
        "image": rng.uniform(0, 16, (N, 1, 2, 3)).astype(np.float32),
    }


@pytest.fixture
def two(owner_client: sdk.Client, ds_client: sdk.Client) -> list[sdk.DatasetHandle]:
    """Two datasets with the same bounds and different values."""
    for name, seed in (("first", 0), ("second", 1)):
        owner_client.upload_dataset(name, _columns(seed), bounds=BOUNDS, mock=_columns(seed + 2))
    return [ds_client.dataset("first"), ds_client.dataset("second")]


def test_each_feature_maps_from_its_public_range_whatever_the_values(
    two: list[sdk.DatasetHandle], ds_client: sdk.Client, sqlite_only: None
) -> None:
    scalers = [sdk.bounds_scaler(ds.tensors(["age", "bmi"])) for ds in two]
    for s in scalers:
        assert torch.allclose(s.mid, torch.tensor([60.0, 40.0]), rtol=1e-6)
        assert torch.allclose(s.scale, torch.tensor([2 / 120, 2 / 60]), rtol=1e-6)
    assert torch.equal(scalers[0].mid, scalers[1].mid)  # public metadata only
    assert torch.equal(scalers[0].scale, scalers[1].scale)
    # the same numbers apply to local tensors: the ends of each range go to -1 and 1
    ends = scalers[0](torch.tensor([[0.0, 10.0], [120.0, 70.0]]))
    assert torch.allclose(ends, torch.tensor([[-1.0, -1.0], [1.0, 1.0]]), atol=1e-6)
    # and what it makes of the remote features spans [-1, 1]
    again = sdk.bounds_scaler(scalers[0](two[0].tensors(["age", "bmi"])))
    assert torch.allclose(again.mid, torch.zeros(2), atol=1e-6)
    assert torch.allclose(again.scale, torch.ones(2), rtol=1e-5)
    # an image: one range per pixel, shaped like one row; to another range
    image = sdk.bounds_scaler(two[0]["image"], feature_range=(0.0, 1.0))
    assert image.mid.shape == (1, 2, 3) and torch.allclose(image.mid, torch.full((1, 2, 3), 8.0))
    assert torch.allclose(image(torch.full((1, 1, 2, 3), 16.0)), torch.ones(1, 1, 2, 3))
    assert ds_client.budget().spent_epsilon == 0  # nothing charged


def test_mock_mode_derives_the_same_scaler_without_the_node(
    two: list[sdk.DatasetHandle], sqlite_only: None
) -> None:
    ds = two[0]
    real = sdk.bounds_scaler(ds["image"].float() / 16)
    with sdk.mock(ds):
        mocked = sdk.bounds_scaler(ds["image"].float() / 16)
    assert torch.allclose(real.mid, mocked.mid) and torch.allclose(real.scale, mocked.scale)
    assert torch.allclose(real.mid, torch.full((1, 2, 3), 0.5), atol=1e-6)


def test_what_has_no_finite_range_or_no_rows_is_refused(
    two: list[sdk.DatasetHandle], sqlite_only: None
) -> None:
    ds = two[0]
    with pytest.raises(sdk.PrivacyTrackingError, match="unbounded"):
        sdk.bounds_scaler(1 / (ds["age"] - 60))  # a range holding 0 divides to infinity
    with pytest.raises(sdk.DPNodeError, match="remote tensor with rows"):
        sdk.bounds_scaler(torch.zeros(3, 2))
    with pytest.raises(sdk.DPNodeError, match="low < high"):
        sdk.bounds_scaler(ds["bmi"], feature_range=(1.0, -1.0))

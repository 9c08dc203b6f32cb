"""A script's publish calls dry-run on mock data: the node's release, computed locally, free."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpnode import sdk
from dpnode.sdk._remote import remote_input
from tests.sdk.conftest import cohort, remote_dataset


def test_a_mean_is_released_like_the_node_would_but_charges_nothing(
    owner_client: sdk.Client, ds_client: sdk.Client, seed
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    seed(1)  # unseeded, the mean of 400 |Laplace| misses b by 20% with p ~ 8.8e-5 a run
    mock_age = cohort(30, 1)["age"].astype(np.float32)
    with sdk.mock(ds):
        mean = ds["age"].float().mean()
        released = [mean.publish(epsilon=1.0) for _ in range(400)]
    receipt = released[0].receipt
    assert receipt.mock and receipt.ledger_id is None and math.isnan(receipt.remaining_epsilon)
    assert receipt.mechanism == "laplace"
    # the bounds over the mock's rows, plus the float32 mean's last bit (2 x 2**-24 x 120)
    assert receipt.sensitivity_l1 == pytest.approx(120 / 30 + 2 * 2.0**-24 * 120, rel=1e-6)
    assert "not charged" in str(receipt)
    noise = np.array([float(r) for r in released]) - float(mock_age.mean())
    # Laplace(b): mean |noise| is b; 400 draws put the estimate within ~15%
    assert abs(np.abs(noise).mean() / receipt.noise_scale - 1) < 0.2
    assert ds_client.ledger() == [] and ds_client.budget().spent_epsilon == 0


def test_a_dp_sgd_training_loop_runs_end_to_end_in_mock_mode(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with sdk.mock(ds):
        X, y = ds.tensors(["age", "bmi"], "diabetic")
        for _ in range(3):
            loss = F.binary_cross_entropy_with_logits(model(X / 100).squeeze(1), y.float())
            loss.backward()
            receipt = sdk.publish_grads(model, epsilon=0.5, delta=1e-6, max_grad_norm=1.0)
            assert all(type(p.grad) is torch.Tensor for p in model.parameters())
            opt.step()
            opt.zero_grad()
    assert receipt.mock and receipt.mechanism == "gaussian"
    # 2C as the node would charge, plus the float32 sum's last bits
    assert receipt.sensitivity_l2 == pytest.approx(2.0, rel=1e-5)
    assert not torch.equal(model.weight.detach(), before)
    assert ds_client.ledger() == []


def test_refusals_are_the_nodes_and_free_previews_stay_on_the_node(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    with sdk.mock(ds):
        mean = ds["age"].float().mean()
        with pytest.raises(sdk.InvalidRequestError, match="epsilon"):
            mean.publish(epsilon=float("nan"))
        with pytest.raises(sdk.InvalidRequestError, match="delta"):
            mean.publish(epsilon=1.0, delta=2.0)
        with pytest.raises(sdk.DPNodeError, match=r"outside 'with sdk\.mock"):
            mean.sensitivity()
    other = owner_client.upload_dataset(
        "other", {"v": np.ones(5)}, bounds={"v": (0, 1)}, mock={"v": np.zeros(5)}
    )
    with sdk.mock(ds):
        stray = ds_client.dataset(other.id)["v"]
        with pytest.raises(sdk.DPNodeError, match="no mock values"):
            stray.sum().publish(epsilon=1.0)


def test_an_input_the_node_reads_no_data_of_has_no_mock_values(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    # the node reads 'dataset:<id>/' with an id as JSON writes it: '\d+' took '٣' for 3
    # and '03' for 3, and the mock publish failed on a KeyError instead of saying so
    ds = remote_dataset(owner_client, ds_client)
    arabic = str(ds.id).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    with sdk.mock(ds):
        for spelled in (arabic, f"0{ds.id}"):
            stray = remote_input(f"dataset:{spelled}/age", (30,), torch.int64, origin=ds_client)
            with pytest.raises(sdk.DPNodeError, match="no mock values"):
                stray.float().mean().publish(epsilon=1.0)
        assert ds["age"].float().mean().publish(epsilon=1.0).receipt.mock

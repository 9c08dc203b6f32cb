"""Quantile release plans kept by the node (dpnode.node.services.release_plans): the same
request reuses its plan, any other request is planned for itself, and every publish is
still charged and checked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpnode import sdk
from dpnode.node.context import NodeContext

pytestmark = pytest.mark.usefixtures("sqlite_only")

ROWS = 60


def _upload(owner: sdk.Client, name: str, bounds: tuple[float, float], seed: int) -> None:
    lo, hi = bounds
    values = np.random.default_rng(seed).uniform(lo, hi, ROWS)
    owner.upload_dataset(name, {"x": values}, bounds={"x": bounds})


def test_the_same_median_again_reuses_its_plan_and_is_charged_again(
    owner_client: sdk.Client, ds_client: sdk.Client, context: NodeContext
) -> None:
    _upload(owner_client, "a", (0.0, 10.0), 0)
    x = ds_client.dataset("a")["x"]
    before = ds_client.budget().spent_epsilon
    first = torch.median(x).publish(epsilon=0.5)
    assert len(context.selections.keys()) == 1
    second = torch.median(x).publish(epsilon=0.5)
    assert len(context.selections.keys()) == 1  # the same plan
    assert second.receipt.ledger_id != first.receipt.ledger_id
    assert second.receipt.noise_scale == first.receipt.noise_scale
    assert ds_client.budget().spent_epsilon == pytest.approx(before + 1.0)
    torch.median(x).publish(epsilon=0.25)  # another epsilon: planned for itself
    assert len(context.selections.keys()) == 2
    spent = ds_client.budget().spent_epsilon
    with pytest.raises(sdk.BudgetExceededError):  # a kept plan is charged and checked as ever
        torch.median(x).publish(epsilon=1e6)
    assert ds_client.budget().spent_epsilon == spent


def test_the_same_graph_on_another_dataset_selects_over_that_datasets_range(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    """Adversarial: a plan kept for one dataset's range must not serve the same graph on a
    dataset of another range (its grid would release a value outside the other's bounds, and
    its sensitivity would be another's)."""
    _upload(owner_client, "low", (0.0, 10.0), 1)
    _upload(owner_client, "high", (100.0, 200.0), 2)
    for _ in range(2):
        low = torch.median(ds_client.dataset("low")["x"]).publish(epsilon=1.0)
        high = torch.median(ds_client.dataset("high")["x"]).publish(epsilon=1.0)
        assert 0.0 <= float(low) <= 10.0
        assert 100.0 <= float(high) <= 200.0


def test_a_deleted_dataset_is_refused_though_its_plan_was_kept(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    _upload(owner_client, "gone", (0.0, 1.0), 3)
    x = ds_client.dataset("gone")["x"]
    torch.quantile(x, 0.75).publish(epsilon=0.5)
    owner_client.delete_dataset("gone")
    spent = ds_client.budget().spent_epsilon
    with pytest.raises(sdk.NotFoundError):
        torch.quantile(x, 0.75).publish(epsilon=0.5)
    assert ds_client.budget().spent_epsilon == spent

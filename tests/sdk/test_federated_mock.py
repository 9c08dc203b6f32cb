"""Mock mode across nodes whose dataset ids collide: ids are per node, so each node's mock
data stands for its own dataset only, in a federated publish as in a federated training run."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from dpnode import sdk
from tests.sdk.federation import Site, nodes

BOUNDS = {"x": (0.0, 1.0), "label": (0, 2)}
#: rows of each node's real data and of its mock data: every count differs, so that a mock
#: bound to the other node's dataset shows in the shapes as well as in the values
ROWS, MOCK_ROWS = (40, 60), (20, 35)


def _points(n: int, low: float, high: float, label: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x": rng.uniform(low, high, (n, 4)).astype(np.float32),
        "label": np.full(n, label, dtype=np.int64),
    }


@pytest.fixture
def two(sqlite_template: Path, tmp_path: Path) -> Iterator[list[Site]]:
    with nodes(sqlite_template, tmp_path, 2) as found:
        yield found


@pytest.fixture
def mocks(two: list[Site]) -> list[dict[str, np.ndarray]]:
    """Each node's first dataset (the same id on both), with mocks far apart: small x and
    label 0 on the first node, large x and label 2 on the second."""
    made = [_points(MOCK_ROWS[0], 0.0, 0.2, 0, 1), _points(MOCK_ROWS[1], 0.8, 1.0, 2, 2)]
    for k, (site, mock) in enumerate(zip(two, made, strict=True)):
        site.owner.upload_dataset(
            "points", _points(ROWS[k], 0.0, 1.0, k, 10 + k), bounds=BOUNDS, mock=mock
        )
    return made


def _handles(two: list[Site]) -> list[sdk.DatasetHandle]:
    handles = [s.scientist.dataset("points") for s in two]
    assert handles[0].id == handles[1].id  # the premise: the ids collide
    return handles


def test_a_mock_session_of_two_nodes_binds_each_nodes_mock_to_its_own_dataset(
    two: list[Site], mocks: list[dict[str, np.ndarray]]
) -> None:
    a, b = _handles(two)
    with sdk.mock(a, b) as m:
        xa, xb = a["x"], b["x"]
        assert (xa.shape[0], xb.shape[0]) == MOCK_ROWS
        assert np.array_equal(m.evaluate(xa).numpy(), mocks[0]["x"])
        assert np.array_equal(m.evaluate(xb * 1).numpy(), mocks[1]["x"])
        with pytest.raises(sdk.DPNodeError, match=rf"several nodes \({two[0].url}, {two[1].url}\)"):
            (xa.sum() + xb.sum()).publish(epsilon=1.0)  # as a publish to one node would be
    with sdk.mock(a):  # the other node's dataset of the same id is not mocked by a's mock
        xb = b["x"]
        assert xb.shape[0] == ROWS[1]
        with pytest.raises(sdk.DPNodeError, match="no mock values for 'dataset:1/x'"):
            xb.double().sum().publish(epsilon=1.0)


def test_a_federated_publish_in_mock_mode_reads_each_sites_own_mock(
    two: list[Site], mocks: list[dict[str, np.ndarray]]
) -> None:
    fed = sdk.federated(_handles(two))
    with sdk.mock(*fed.handles):
        dry = fed.publish(lambda ds: ds["x"].double().sum(), epsilon=20.0)
    assert [p.rows for p in dry.sites] == list(MOCK_ROWS)
    for part, mock in zip(dry.sites, mocks, strict=True):
        assert part.receipt is not None and part.receipt.mock
        # each part within 20 Laplace scales of its own mock's sum (P(fail) < 1e-8); the two
        # mocks' sums are over 100 scales apart, so a part of the other mock would fail
        scale = part.receipt.noise_scale
        assert abs(mock["x"].sum() - mocks[1 - dry.sites.index(part)]["x"].sum()) > 100 * scale
        assert abs(float(part.value) - float(mock["x"].astype(np.float64).sum())) < 20 * scale
    for site in two:
        assert site.scientist.ledger_entries() == [] and site.scientist.budget().spent_epsilon == 0


def test_federated_training_in_mock_mode_steps_on_each_sites_own_mock(
    two: list[Site], mocks: list[dict[str, np.ndarray]]
) -> None:
    C = 4.0
    torch.manual_seed(0)
    model, local = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    local.load_state_dict(model.state_dict())
    x = torch.from_numpy(np.concatenate([m["x"] for m in mocks]))
    y = torch.from_numpy(np.concatenate([m["label"] for m in mocks]))
    # the premise: no row's gradient reaches C, so the clipped sum is the plain sum
    for i in range(len(x)):
        local.zero_grad()
        F.cross_entropy(local(x[i : i + 1]), y[i : i + 1]).backward()
        assert math.sqrt(sum(float(p.grad.square().sum()) for p in local.parameters())) < C
    # the expected step: plain SGD at lr 1 on the two mocks pooled
    local.zero_grad()
    F.cross_entropy(local(x), y).backward()
    step = torch.cat([p.grad.flatten() for p in local.parameters()])
    want = torch.cat([p.detach().flatten() for p in local.parameters()]) - step
    handles = _handles(two)
    with sdk.mock(*handles):
        run = sdk.private_training(
            model,
            torch.optim.SGD(model.parameters(), lr=1.0),
            [ds.tensors("x", "label") for ds in handles],
            loss_fn=F.cross_entropy,
            target_epsilon=1000.0,
            steps=1,
            max_grad_norm=C,
            progress=False,
        )
        (record,) = run.fit()
    assert [s.rows for s in run.sites] == list(MOCK_ROWS)
    assert all(r.mock for r in record.receipts)
    got = torch.cat([p.detach().flatten() for p in model.parameters()])
    sd = math.sqrt(sum(r.noise_scale**2 for r in record.receipts)) / sum(MOCK_ROWS)
    assert sd < 0.05 * float(step.abs().max())  # small enough that wrong rows would show
    # every coordinate within z sd of the pooled mocks' step: false failure < 1e-5 overall
    z = float(stats.norm.isf(0.5e-5 / len(got)))
    assert float((got - want).abs().max()) < z * sd
    for site in two:
        assert site.scientist.ledger() == [] and site.scientist.budget().spent_epsilon == 0

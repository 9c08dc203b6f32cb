"""A model zoo trains three DP-SGD steps on a node and in mock mode, one model per layer type.

Each model mixes a layer whose parameters get per-example gradients (Linear, Conv1d/2d/3d,
Embedding, EmbeddingBag, LayerNorm, GroupNorm, InstanceNorm, GRU, LSTM, MultiheadAttention in a
transformer layer, with its dropout) with what may sit between them (activations, max and
average pooling, flattening). Through the real app, each step is one publish charged at
exactly 2C; in mock mode the same script runs against the mock data and charges nothing.
Per-example gradients against torch, and the node's tracking on neighbours, are
tests/sdk/test_per_sample.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpnode import sdk

N, MOCK = 12, 8
C = 1.0


def _columns(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "signal": rng.uniform(0, 1, (n, 2, 8)).astype(np.float32),
        "image": rng.uniform(0, 1, (n, 1, 6, 6)).astype(np.float32),
        "volume": rng.uniform(0, 1, (n, 1, 3, 4, 4)).astype(np.float32),
        "tokens": rng.integers(0, 7, (n, 5)),
        "sequence": rng.uniform(0, 1, (n, 5, 4)).astype(np.float32),
        "label": rng.integers(0, 3, n),
    }


BOUNDS = {
    "signal": (0.0, 1.0),
    "image": (0.0, 1.0),
    "volume": (0.0, 1.0),
    "tokens": (0, 6),
    "sequence": (0.0, 1.0),
    "label": (0, 2),
}


class _LastStep(torch.nn.Module):
    """A recurrent layer's last output step into a head."""

    def __init__(self, rnn: torch.nn.Module) -> None:
        super().__init__()
        self.rnn, self.head = rnn, torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


ZOO: dict[str, tuple[str, Callable[[], torch.nn.Module]]] = {
    "embedding_bag": (
        "tokens",
        lambda: torch.nn.Sequential(torch.nn.EmbeddingBag(7, 4), torch.nn.Linear(4, 3)),
    ),
    "gru": ("sequence", lambda: _LastStep(torch.nn.GRU(4, 6, batch_first=True))),
    "lstm": ("sequence", lambda: _LastStep(torch.nn.LSTM(4, 6, 2, batch_first=True, dropout=0.1))),
    "linear": ("sequence", lambda: torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(20, 3))),
    "conv1d": (
        "signal",
        lambda: torch.nn.Sequential(
            torch.nn.Conv1d(2, 3, 3, padding=1),
            torch.nn.Tanh(),
            torch.nn.AvgPool1d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(12, 3),
        ),
    ),
    "conv2d": (
        "image",
        lambda: torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(4, 4, 3, groups=2),
            torch.nn.Flatten(),
            torch.nn.Linear(4, 3),
        ),
    ),
    "conv3d": (
        "volume",
        lambda: torch.nn.Sequential(
            torch.nn.Conv3d(1, 2, 3, padding=1),
            torch.nn.Sigmoid(),
            torch.nn.Flatten(),
            torch.nn.Linear(96, 3),
        ),
    ),
    "embedding": (
        "tokens",
        lambda: torch.nn.Sequential(
            torch.nn.Embedding(7, 4, padding_idx=0), torch.nn.Flatten(), torch.nn.Linear(20, 3)
        ),
    ),
    "layernorm": (
        "sequence",
        lambda: torch.nn.Sequential(
            torch.nn.Linear(4, 6),
            torch.nn.LayerNorm(6),
            torch.nn.GELU(),
            torch.nn.Flatten(),
            torch.nn.Linear(30, 3),
        ),
    ),
    "groupnorm": (
        "image",
        lambda: torch.nn.Sequential(
            torch.nn.Conv2d(1, 4, 3),
            torch.nn.GroupNorm(2, 4),
            torch.nn.ReLU(),
            torch.nn.AvgPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(16, 3),
        ),
    ),
    "transformer": (
        "sequence",
        lambda: torch.nn.Sequential(
            torch.nn.Linear(4, 8),
            torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True),
            torch.nn.Flatten(),
            torch.nn.Linear(40, 3),
        ),
    ),
    "instancenorm": (
        "signal",
        lambda: torch.nn.Sequential(
            torch.nn.Conv1d(2, 2, 3),
            torch.nn.InstanceNorm1d(2, affine=True),
            torch.nn.Flatten(),
            torch.nn.Linear(12, 3),
        ),
    ),
}


def _train(
    ds: sdk.DatasetHandle, column: str, make: Callable[[], torch.nn.Module]
) -> list[sdk.Receipt]:
    torch.manual_seed(0)
    model = make()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = ds.tensors(column, "label")
    if column != "tokens":
        x = x.float()
    receipts = []
    for _ in range(3):
        F.cross_entropy(model(x), y).backward()
        receipts.append(sdk.publish_grads(model, epsilon=0.5, delta=1e-6, max_grad_norm=C))
        opt.step()
        opt.zero_grad()
    for p, q in zip(model.parameters(), before, strict=True):
        assert torch.isfinite(p).all()
        if p.requires_grad:
            assert not torch.equal(p.detach(), q)  # every parameter was stepped
    return receipts


@pytest.mark.parametrize("kind", sorted(ZOO))
def test_each_layer_trains_three_steps_on_the_node_and_in_mock_mode(
    owner_client: sdk.Client, ds_client: sdk.Client, sqlite_only: None, kind: str
) -> None:
    owner_client.upload_dataset("zoo", _columns(N, 0), bounds=BOUNDS, mock=_columns(MOCK, 1))
    ds = ds_client.dataset("zoo")
    column, make = ZOO[kind]
    receipts = _train(ds, column, make)
    for r in receipts:  # 2C as the node charged it, plus what float32 rounding may add
        assert not r.mock and r.mechanism == "gaussian"
        assert 2 * C <= r.sensitivity_l2 <= 2 * C * 1.01, (kind, r.sensitivity_l2)
    assert len(ds_client.ledger()) == 3
    with sdk.mock(ds):
        mocked = _train(ds, column, make)
    assert all(r.mock for r in mocked) and len(ds_client.ledger()) == 3

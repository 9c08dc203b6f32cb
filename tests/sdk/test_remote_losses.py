"""Cross-entropy and NLL on remote tensors: torch's values, and publishable on private labels.

torch's decomposition of ``nll_loss`` picks each row's class with ``gather`` and its backward
writes with ``scatter``, which have no privacy rule for an index that is a private label. The
SDK records both as one-hot codes against the public class list instead; the values and
gradients must be torch's, for every reduction, class weights, ignored labels, label
smoothing and a single sample, and a model trained on private labels must publish.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpnode import sdk
from dpnode.sdk._remote import evaluate, graph_for, remote_input

TOL = 1e-5
CLASSES = 4


def _case(
    reduction: str, weighted: bool, ignore: bool, smoothing: float, single: bool
) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    xv = torch.randn((CLASSES + 2,) if single else (9, CLASSES + 2), generator=gen)
    yv = torch.randint(0, CLASSES, () if single else (9,), generator=gen)
    kwargs: dict[str, Any] = {"reduction": reduction, "label_smoothing": smoothing}
    if weighted:
        kwargs["weight"] = torch.tensor([0.5, 2.0, 1.0, 3.0])
    if ignore:
        kwargs["ignore_index"] = 1  # a label inside 0 .. C-1, so rows with it must be skipped
    return kwargs, xv, yv


BATCH = [
    (reduction, weighted, ignore, smoothing, False)
    for reduction in ("mean", "sum", "none")
    for weighted in (False, True)
    for ignore in (False, True)
    for smoothing in (0.0, 0.1)
]
#: one sample (a 1-d input and a 0-d label): no label to ignore, nothing per row to keep
SINGLE = [
    (reduction, weighted, False, smoothing, True)
    for reduction in ("mean", "sum")
    for weighted in (False, True)
    for smoothing in (0.0, 0.1)
]


@pytest.mark.parametrize(("reduction", "weighted", "ignore", "smoothing", "single"), BATCH + SINGLE)
def test_cross_entropy_matches_torch_with_one_hot_codes(
    reduction: str, weighted: bool, ignore: bool, smoothing: float, single: bool
) -> None:
    kwargs, xv, yv = _case(reduction, weighted, ignore, smoothing, single)
    torch.manual_seed(0)
    remote = torch.nn.Linear(CLASSES + 2, CLASSES)
    torch.manual_seed(0)
    local = torch.nn.Linear(CLASSES + 2, CLASSES)
    x = remote_input("x", tuple(xv.shape), torch.float32)
    y = remote_input("y", tuple(yv.shape), torch.int64)
    loss = F.cross_entropy(remote(x), y, **kwargs)
    total = loss.sum() if reduction == "none" else loss
    total.backward()
    ops = {n.op for n in graph_for([loss, remote.weight.grad]).nodes}  # type: ignore[list-item]
    assert not ops & {"gather", "scatter", "scatter_add", "index_put"}, ops
    values = evaluate(
        [loss, remote.weight.grad, remote.bias.grad], {"x": xv.numpy(), "y": yv.numpy()}
    )  # type: ignore[list-item]
    ref = F.cross_entropy(local(xv), yv, **kwargs)
    (ref.sum() if reduction == "none" else ref).backward()
    torch.testing.assert_close(values[0], ref.detach(), rtol=0, atol=TOL)
    torch.testing.assert_close(values[1], local.weight.grad, rtol=0, atol=TOL)
    torch.testing.assert_close(values[2], local.bias.grad, rtol=0, atol=TOL)


def test_nll_loss_of_log_softmax_matches_torch() -> None:
    gen = torch.Generator().manual_seed(5)
    xv, yv = torch.randn(7, 3, generator=gen), torch.randint(0, 3, (7,), generator=gen)
    x = remote_input("x", (7, 3), torch.float32)
    y = remote_input("y", (7,), torch.int64)
    (got,) = evaluate([F.nll_loss(F.log_softmax(x, 1), y)], {"x": xv.numpy(), "y": yv.numpy()})
    torch.testing.assert_close(got, F.nll_loss(F.log_softmax(xv, 1), yv), rtol=0, atol=TOL)


@pytest.mark.usefixtures("sqlite_only")
def test_softmax_regression_on_private_labels_publishes(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    rng = np.random.default_rng(2)
    n = 300
    features = rng.uniform(0, 1, (n, 2)).astype(np.float32)
    label = (features[:, 0] > 0.5).astype(np.int64) + 2 * (features[:, 1] > 0.5)
    owner_client.upload_dataset(
        "classes", {"f": features, "label": label}, bounds={"f": (0, 1), "label": (0, 3)}
    )
    ds = ds_client.dataset("classes")
    X, y = ds.tensors("f", "label")
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 4)
    opt = torch.optim.SGD(model.parameters(), lr=2.0)
    for _ in range(3):
        F.cross_entropy(model(X), y, label_smoothing=0.05).backward()
        receipt = sdk.publish_grads(model, epsilon=0.5, delta=1e-6, max_grad_norm=1.0)
        assert receipt.mechanism == "gaussian"
        opt.step()
        opt.zero_grad()

"""Training through remote tensors gives torch's losses, gradients and parameters.

The remote side records forward and backward into one graph per step, which
the node's engine evaluates (here on bound arrays, and in mock mode through a
real node's mock data); the gradients then replace ``.grad`` as
``publish_grads`` will, and an ordinary torch optimizer steps. The local side
is plain torch on the same data. Both must agree within 1e-5 at every step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dpnode import sdk
from dpnode.sdk._remote import evaluate, remote_input
from tests.sdk.conftest import cohort

TOL = 1e-5


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(6, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 3),
    )


def cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(4, 6, 3, padding=1),
        torch.nn.Sigmoid(),
        torch.nn.AvgPool2d(3),
        torch.nn.Flatten(),
        torch.nn.Linear(6, 3),
    )


def _seeded(make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(7)
    return make()


OPTIMIZERS: dict[str, Callable[[torch.nn.Module], torch.optim.Optimizer]] = {
    "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
    "adam": lambda m: torch.optim.Adam(m.parameters(), lr=0.01),
}


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("arch", ["mlp", "cnn"])
def test_training_steps_match_torch(arch: str, opt_name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    shape = (24, 6) if arch == "mlp" else (12, 1, 6, 6)
    xv = torch.randn(shape, generator=gen)
    yv = torch.randint(0, 3, (shape[0],), generator=gen)
    feed = {"x": xv.numpy(), "y": yv.numpy()}
    make = mlp if arch == "mlp" else cnn
    remote, local = _seeded(make), _seeded(make)
    opt_r, opt_l = OPTIMIZERS[opt_name](remote), OPTIMIZERS[opt_name](local)
    x = remote_input("x", shape, torch.float32)
    y = remote_input("y", (shape[0],), torch.int64)
    for _step in range(4):
        loss = F.cross_entropy(remote(x), y)
        loss.backward()
        params = list(remote.parameters())
        values = evaluate([loss, *(p.grad for p in params)], feed)  # type: ignore[misc]
        for p, g in zip(params, values[1:], strict=True):
            p.grad = g
        ref = F.cross_entropy(local(xv), yv)
        ref.backward()
        torch.testing.assert_close(values[0], ref.detach(), rtol=0, atol=TOL)
        for p, q in zip(params, local.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=TOL)
        opt_r.step()
        opt_l.step()
        opt_r.zero_grad()
        opt_l.zero_grad()
        for p, q in zip(remote.parameters(), local.parameters(), strict=True):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=TOL)


def test_gradients_accumulate_over_two_backward_passes() -> None:
    xv = torch.randn(5, 6, generator=torch.Generator().manual_seed(1))
    remote, local = _seeded(mlp), _seeded(mlp)
    x = remote_input("x", (5, 6), torch.float32)
    remote(x).sum().backward()
    remote(x * 2).square().mean().backward()
    local(xv).sum().backward()
    local(xv * 2).square().mean().backward()
    params = list(remote.parameters())
    grads = evaluate([p.grad for p in params], {"x": xv.numpy()})  # type: ignore[misc]
    for g, q in zip(grads, local.parameters(), strict=True):
        torch.testing.assert_close(g, q.grad, rtol=0, atol=TOL)


@pytest.mark.usefixtures("sqlite_only")
def test_images_train_in_mock_mode_on_a_node(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    data, fake = cohort(40, 0), cohort(20, 1)
    rng = np.random.default_rng(2)
    data["image"] = rng.uniform(0, 1, (40, 1, 6, 6)).astype(np.float32)
    fake["image"] = rng.uniform(0, 1, (20, 1, 6, 6)).astype(np.float32)
    owner_client.upload_dataset(
        "images",
        data,
        bounds={"age": (0, 120), "bmi": (10, 70), "sex": (0, 1), "scan": (0, 1), "image": (0, 1)},
        mock=fake,
    )
    ds = ds_client.dataset("images")
    # a CNN (convolutions, max and average pooling) records forward and backward on the
    # private images (every prim it needs on them has a privacy rule), and in mock mode it
    # trains exactly as a local copy on the same (mock) values
    out = _seeded(cnn)(ds.tensors("image"))
    assert out.shape == (40, 3)
    out.sum().backward()
    remote, local = _seeded(cnn), _seeded(cnn)
    opt_r, opt_l = OPTIMIZERS["adam"](remote), OPTIMIZERS["adam"](local)
    xl, yl = torch.from_numpy(fake["image"]), torch.from_numpy(fake["sex"])
    with sdk.mock(ds) as m:
        x, y = ds.tensors("image", "sex")
        assert x.shape == (20, 1, 6, 6)
        for _step in range(3):
            loss = F.cross_entropy(remote(x), y)
            loss.backward()
            got = m.evaluate(loss)
            m.materialize_grads(remote)
            ref = F.cross_entropy(local(xl), yl)
            ref.backward()
            torch.testing.assert_close(got, ref.detach(), rtol=0, atol=TOL)
            for p, q in zip(remote.parameters(), local.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=TOL)
            opt_r.step()
            opt_l.step()
            opt_r.zero_grad()
            opt_l.zero_grad()


def test_batch_norm_without_running_stats_trains_and_with_them_explains() -> None:
    xv = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(0)
    remote = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, track_running_stats=False)
    )
    torch.manual_seed(0)
    local = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4, track_running_stats=False)
    )
    x = remote_input("x", (8, 3, 4, 4), torch.float32)
    loss = remote(x).square().mean()
    loss.backward()
    params = list(remote.parameters())
    got = evaluate([loss, *(p.grad for p in params)], {"x": xv.numpy()})  # type: ignore[misc]
    ref = local(xv).square().mean()
    ref.backward()
    torch.testing.assert_close(got[0], ref.detach(), rtol=0, atol=TOL)
    for g, q in zip(got[1:], local.parameters(), strict=True):
        torch.testing.assert_close(g, q.grad, rtol=0, atol=TOL)
    # running statistics would need remote values in local buffers: a clear refusal
    with pytest.raises(sdk.PrivateValueError, match="track_running_stats=False"):
        torch.nn.BatchNorm2d(3)(x)

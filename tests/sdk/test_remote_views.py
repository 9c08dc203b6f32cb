"""Views and in-place ops on remote tensors behave exactly as in torch (aliasing is kept).

Each case runs the same function on a remote tensor (evaluated by the engine) and
on a plain tensor, and every returned alias must agree in shape, dtype and value.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from dpnode.sdk._remote import evaluate, remote_input

Case = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]


def _select_mul(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x.clone()
    row = x[1]
    row.mul_(10)
    return x, row


def _transpose_slice(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x.clone()
    v = x.t()[1:3]
    v.add_(100)
    return x, v, x.view(12)


def _sibling_views(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x.clone()
    col, row = x[:, 1], x[0]
    row.fill_(-1)  # col shares x[0, 1] with row
    return x, col, row


def _setitem(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x * 2
    y[0, 1] = 5.0
    y[[2, 0]] += 1
    y[:, 3] = torch.tensor([7.0, 8.0, 9.0])
    return (y,)


def _chain(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x.clone()
    y.unsqueeze(0).squeeze(0)[..., 2:].zero_()
    z = y.reshape(2, 6)
    z[1].sub_(3)
    return y, z


def _split_and_index(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a, b = x.clone().split(2, dim=1)
    a.mul_(0)
    mask = torch.tensor([True, False, True])
    return a, b, x[[0, 2], 1:], x[mask], x[:, torch.tensor([3, -1, 0])]


def _stale_view(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x.clone()
    v = y.permute(1, 0)[::2]  # taken before the write, read after it
    y.copy_(torch.ones(4))
    y[1:, :2] = x[:2, 2:]
    return y, v


def _dtype_cast_inplace(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    i = x.long()
    i.mul_(3).add_(torch.tensor(2))
    d = x.clone()
    d.div_(3).floor_().add_(i)  # float32 += int64 stays float32
    b = x > 0
    b.logical_and_(x < 4)
    return i, d, b


def _unbind_write(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = x.clone()
    rows = y.unbind(0)
    rows[2].neg_()
    return (y, *rows)


CASES: dict[str, Case] = {
    "select_mul": _select_mul,
    "transpose_slice": _transpose_slice,
    "sibling_views": _sibling_views,
    "setitem": _setitem,
    "chain": _chain,
    "split_and_index": _split_and_index,
    "stale_view": _stale_view,
    "dtype_cast_inplace": _dtype_cast_inplace,
    "unbind_write": _unbind_write,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mutation_through_views_matches_torch(name: str) -> None:
    fn = CASES[name]
    xv = torch.arange(12.0).reshape(3, 4) - 5
    remote = remote_input("x", (3, 4), torch.float32)
    got = evaluate(list(fn(remote)), {"x": xv.numpy()})
    want = fn(xv.clone())
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert torch.equal(g, w), f"{g} != {w}"


def test_views_share_storage_and_record_functional_prims_only() -> None:
    x = remote_input("x", (3, 4), torch.float32).clone()
    v = x[1]
    assert v._storage is x._storage and v._base is x  # autograd and torch see a real view
    v.mul_(2)
    ops = {n.op for n in x.graph().nodes}
    # the write goes back into the base as slices and a cat, prims with privacy rules
    assert ops <= {"input", "slice", "squeeze", "mul", "unsqueeze", "cat"}, ops


def test_autograd_through_views_and_inplace_ops() -> None:
    xv = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    w_remote = torch.nn.Parameter(torch.linspace(-1, 1, 4))
    w_local = torch.nn.Parameter(torch.linspace(-1, 1, 4))

    def loss_of(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x * w
        h[:, 0] = h[:, 1] * 3  # a write through a view, differentiated
        h.relu_()
        return h.t()[1:].square().sum()

    loss = loss_of(remote_input("x", (3, 4), torch.float32), w_remote)
    loss.backward()
    got = evaluate([loss, w_remote.grad], {"x": xv.numpy()})  # type: ignore[list-item]
    ref = loss_of(xv, w_local)
    ref.backward()
    torch.testing.assert_close(got[0], ref.detach())
    torch.testing.assert_close(got[1], w_local.grad)

"""Pooling beyond the common case: average pooling with every option, adaptive pooling,
antialiased resampling.

``rules_nn`` records plain average pooling as one grouped convolution (fast, and its
gradient is a transposed convolution). The other forms are built here from
``pad``/``unfold``/``sum`` and public divisors (which depend only on shapes), or,
for adaptive pooling, per dimension: adaptive windows are a product of intervals, so
an adaptive average is one matmul per spatial dim with a public averaging matrix and
an adaptive max is a max over each interval, one dim after the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sdk._remote.graph import Node, constant, prim
from sdk._remote.rules import dtype_name, implements

__all__ = ["avg_pool"]

aten = torch.ops.aten


def _tup(v: Any, n: int) -> tuple[int, ...]:
    t: tuple[int, ...] = tuple(v) if isinstance(v, (list, tuple)) else (int(v),)
    return t * n if len(t) == 1 else t


def _divisors(
    insp: Sequence[int],
    outsp: Sequence[int],
    k: Sequence[int],
    s: Sequence[int],
    p: Sequence[int],
    count_include_pad: bool,
) -> torch.Tensor:
    """torch's per-window divisor: the window clipped to the padded input (or to the input)."""
    per_dim = []
    for n, o, kk, ss, pp in zip(insp, outsp, k, s, p, strict=True):
        start = torch.arange(o) * ss - pp
        end = torch.minimum(start + kk, torch.tensor(n + pp))
        size = end - start
        if not count_include_pad:
            size = torch.minimum(end, torch.tensor(n)) - torch.maximum(start, torch.tensor(0))
        per_dim.append(size)
    total = per_dim[0]
    for d in per_dim[1:]:
        total = total.unsqueeze(-1) * d
    return total


def avg_pool(
    out: torch.Tensor,
    x: Node,
    nsp: int,
    kernel: Any,
    stride: Any,
    padding: Any,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Any,
) -> Node:
    """Average pooling over the last ``nsp`` dims with torch's every option."""
    k = _tup(kernel, nsp)
    s = _tup(stride, nsp) if stride else k
    p = _tup(padding, nsp)
    shape = tuple(x.shape or ())
    insp, outsp = shape[-nsp:], tuple(out.shape[-nsp:])
    pad: list[int] = []
    for n, o, kk, ss, pp in reversed(list(zip(insp, outsp, k, s, p, strict=True))):
        extra = max(0, (o - 1) * ss + kk - (n + 2 * pp))  # ceil_mode's last partial window
        pad += [pp, pp + extra]
    y = prim("pad", x, pad=tuple(pad), value=0.0) if any(pad) else x
    nd = len(shape)
    for i, (kk, ss) in enumerate(zip(k, s, strict=True)):
        y = prim("unfold", y, dim=nd - nsp + i, size=kk, step=ss)
    integral = not out.dtype.is_floating_point
    total = prim(
        "sum",
        y,
        dims=tuple(range(nd, nd + nsp)),
        keepdim=False,
        dtype="int64" if integral else None,
    )
    if divisor_override:
        div: Any = int(divisor_override) if integral else float(divisor_override)
    else:
        d = _divisors(insp, outsp, k, s, p, count_include_pad)
        div = constant(d.to(torch.int64 if integral else out.dtype))
    if integral:  # torch divides integer sums with C++ integer division (toward zero)
        return prim(
            "convert_element_type", prim("trunc_divide", total, div), dtype=dtype_name(out.dtype)
        )
    return prim("div", total, div)


@implements(aten.avg_pool3d.default)
def _avg_pool3d(
    out: torch.Tensor,
    x: Node,
    kernel: Any,
    stride: Any = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Node:
    return avg_pool(
        out, x, 3, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


def _windows(n: int, o: int) -> list[tuple[int, int]]:
    """Adaptive pooling's windows: [floor(i n / o), ceil((i + 1) n / o))."""
    return [((i * n) // o, -((-(i + 1) * n) // o)) for i in range(o)]


def _averaging(n: int, o: int, dtype: torch.dtype) -> torch.Tensor:
    m = torch.zeros(n, o, dtype=torch.float64)
    for i, (a, b) in enumerate(_windows(n, o)):
        m[a:b, i] = 1.0 / (b - a)
    return m.to(dtype)


@implements(aten._adaptive_avg_pool3d.default, aten._adaptive_avg_pool2d.default)
def _adaptive_avg(out: torch.Tensor, x: Node, output_size: Sequence[int]) -> Node:
    shape = tuple(x.shape or ())
    nsp = len(output_size)
    nd = len(shape)
    y = x
    for i in range(nsp):
        d = nd - nsp + i
        # move dim d last, contract it with the averaging matrix, move it back
        perm = [j for j in range(nd) if j != d] + [d]
        back = list(range(nd - 1))
        back.insert(d, nd - 1)
        y = prim("permute", y, dims=tuple(perm))
        y = prim("matmul", y, constant(_averaging(shape[d], int(output_size[i]), out.dtype)))
        y = prim("permute", y, dims=tuple(back))
    return y


@implements(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def _adaptive_max(out: Any, x: Node, output_size: Sequence[int]) -> tuple[Node, Node]:
    # max and its flat index within the spatial plane, one spatial dim at a time (last first);
    # the first maximum in row-major order wins, as in torch's loop
    shape = tuple(x.shape or ())
    nsp = len(output_size)
    nd = len(shape)
    insp = shape[-nsp:]
    vals, flat = x, None
    stride = 1
    for i in reversed(range(nsp)):
        d = nd - nsp + i
        parts_v, parts_i = [], []
        for a, b in _windows(insp[i], int(output_size[i])):
            win = prim("slice", vals, dim=d, start=a, end=b, step=1)
            arg = prim("argmax", win, dim=d, keepdim=True)
            parts_v.append(prim("gather", win, arg, dim=d))
            pos = prim("mul", prim("add", arg, a), stride)
            if flat is not None:
                inner = prim("slice", flat, dim=d, start=a, end=b, step=1)
                pos = prim("add", pos, prim("gather", inner, arg, dim=d))
            parts_i.append(pos)
        vals, flat = prim("cat", *parts_v, dim=d), prim("cat", *parts_i, dim=d)
        stride *= insp[i]
    assert flat is not None
    return vals, flat


def _axis_weights(
    func: Any,
    n_in: int,
    axis: int,
    in_shape: tuple[int, int],
    args: tuple[Any, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """The (out, in) interpolation matrix of one axis of a separable resampling op.

    Running torch's own op on one-hot rows (one input index per batch entry, ones
    across the other axis) yields, for normalised filters, exactly that axis's
    weights: the matrix depends on shapes only, so it travels as a public constant.
    """
    h, w = in_shape
    basis = torch.zeros(n_in, 1, h, w, dtype=dtype)
    for k in range(n_in):
        if axis == 0:
            basis[k, 0, k, :] = 1.0
        else:
            basis[k, 0, :, k] = 1.0
    out = func(basis, *args)  # (n_in, 1, h_out, w_out)
    lines = out[:, 0, :, 0] if axis == 0 else out[:, 0, 0, :]
    # in the op's own dtype, so the weights carry torch's own rounding
    weights: torch.Tensor = lines.T.contiguous()  # (out, in)
    return weights


def _upsample_aa(func: Any) -> Any:
    def rule(out: torch.Tensor, x: Node, *args: Any) -> Node:
        # antialiased resampling is separable with normalised filters: out = A_h x A_w^T
        shape = tuple(x.shape or ())
        h, w = shape[-2:]
        a_h = _axis_weights(func, h, 0, (h, w), args, out.dtype)
        a_w = _axis_weights(func, w, 1, (h, w), args, out.dtype)
        y = prim("matmul", constant(a_h), x)  # (.., h_out, w)
        return prim("matmul", y, constant(a_w.T.contiguous()))

    return rule


for _op in (aten._upsample_bilinear2d_aa.default, aten._upsample_bicubic2d_aa.default):
    implements(_op)(_upsample_aa(_op))


def _unnormalize(g: Node, size: int, align_corners: bool) -> Node:
    """torch's grid_sampler_compute_source_index (no clipping: zero padding)."""
    if align_corners:
        return prim("mul", prim("div", prim("add", g, 1.0), 2.0), float(size - 1))
    scaled = prim("mul", prim("add", g, 1.0), float(size))
    return prim("div", prim("sub", scaled, 1.0), 2.0)


@implements(aten.grid_sampler_3d.default)
def _grid_sampler_3d(
    out: torch.Tensor,
    x: Node,
    grid: Node,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
) -> Any:
    """Trilinear sampling with zero padding, as torch's CPU kernel computes it.

    The grid is private, so the 8 corners are gathers at computed positions; each
    weight is the same product of the same differences, and the corners are added in
    torch's order (x fastest, then y, then z). Other modes are declined (unsupported).
    """
    if interpolation_mode != 0 or padding_mode != 0:
        return NotImplemented
    n, c, d, h, w = tuple(x.shape or ())
    _, do, ho, wo, _ = tuple(grid.shape or ())
    m = do * ho * wo
    flat = prim("reshape", x, shape=(n, c, d * h * w))
    sizes = (w, h, d)  # grid's last dim holds x (W), y (H), z (D)
    src = []
    for k in range(3):
        g = prim("squeeze", prim("slice", grid, dim=-1, start=k, end=k + 1, step=1), dims=(-1,))
        src.append(_unnormalize(g, sizes[k], align_corners))
    lo = [prim("floor", s) for s in src]
    hi = [prim("add", f, 1.0) for f in lo]
    result: Node | None = None
    for corner in (
        (0, 0, 0),
        (1, 0, 0),
        (0, 1, 0),
        (1, 1, 0),
        (0, 0, 1),
        (1, 0, 1),
        (0, 1, 1),
        (1, 1, 1),
    ):
        weight: Any = None
        valid: Any = None
        at = []
        for k in range(3):
            pos = hi[k] if corner[k] else lo[k]
            diff = prim("sub", src[k], lo[k]) if corner[k] else prim("sub", hi[k], src[k])
            weight = diff if weight is None else prim("mul", weight, diff)
            inside = prim("logical_and", prim("ge", pos, 0.0), prim("le", pos, float(sizes[k] - 1)))
            valid = inside if valid is None else prim("logical_and", valid, inside)
            at.append(pos)
        ix, iy, iz = (
            prim("convert_element_type", prim("where", valid, p, 0.0), dtype="int64") for p in at
        )
        lin = prim("add", prim("add", prim("mul", iz, h * w), prim("mul", iy, w)), ix)
        lin = prim("unsqueeze", prim("reshape", lin, shape=(n, m)), dim=1)
        vals = prim("gather", flat, prim("expand", lin, shape=(n, c, m)), dim=2)
        vals = prim("reshape", vals, shape=(n, c, do, ho, wo))
        term = prim("mul", vals, prim("unsqueeze", prim("where", valid, weight, 0.0), dim=1))
        result = term if result is None else prim("add", result, term)
    assert result is not None
    return result

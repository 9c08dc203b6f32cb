"""Rules for the ops of neural networks: matrix products, convolution, pooling.

Most of ``torch.nn.functional`` (softmax, losses, layer norm, dropout, the
activation backward ops) reaches the prims through torch's decomposition
table; what is here either has a prim of its own (``matmul``,
``convolution``, ``convolution_weight_grad``) or is cheaper as one
(average pooling is a grouped convolution with a constant kernel).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from dpnode.sdk._exceptions import UnsupportedOperationError
from dpnode.sdk._remote.conv_grads import per_example_weight_grad
from dpnode.sdk._remote.graph import Node, constant, prim
from dpnode.sdk._remote.rules import dtype_name, implements
from dpnode.sdk._remote.rules_pool import avg_pool

__all__: list[str] = []

aten = torch.ops.aten

for _op in (
    aten.mm.default,
    aten.bmm.default,
    aten.mv.default,
    aten.dot.default,
    aten.matmul.default,
):
    implements(_op)(lambda out, a, b: prim("matmul", a, b))


def _scaled(x: Any, s: Any) -> Any:
    return x if s == 1 else prim("mul", x, s)


@implements(aten.addmm.default)
def _addmm(out: torch.Tensor, bias: Node, a: Node, b: Node, beta: Any = 1, alpha: Any = 1) -> Node:
    if not out.dtype.is_floating_point:  # torch casts the scalars to the integer dtype
        alpha, beta = int(alpha), int(beta)
    prod = _scaled(prim("matmul", a, b), alpha)
    if beta == 0:
        return prod  # type: ignore[no-any-return]
    return prim("add", _scaled(bias, beta), prod)


def _tup(v: Any, n: int) -> tuple[int, ...]:
    t = tuple(v) if isinstance(v, (list, tuple)) else (v,)
    return t * n if len(t) == 1 else t


@implements(aten.convolution.default)
def _convolution(
    out: torch.Tensor,
    x: Node,
    w: Node,
    bias: Node | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> Node:
    nsp = len(w.shape or ()) - 2
    return prim(
        "convolution",
        x,
        w,
        bias,
        stride=_tup(stride, nsp),
        padding=_tup(padding, nsp),
        dilation=_tup(dilation, nsp),
        groups=groups,
        transposed=bool(transposed),
        output_padding=_tup(output_padding, nsp) if transposed else None,
    )


@implements(aten.convolution_backward.default)
def _convolution_backward(
    out: Any,
    grad: Node,
    x: Node,
    w: Node,
    bias_sizes: Any,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    output_mask: Sequence[bool],
) -> tuple[Node | None, Node | None, Node | None]:
    if transposed:
        raise UnsupportedOperationError(
            "the gradient of a transposed convolution is not yet decomposed into prims "
            "(see docs/remote-tensors.md)"
        )
    assert x.shape is not None and w.shape is not None and grad.shape is not None
    nsp = len(w.shape) - 2
    st, pd, dl = _tup(stride, nsp), _tup(padding, nsp), _tup(dilation, nsp)
    gx = gw = gb = None
    if output_mask[0]:
        # the input gradient is the transposed convolution of the output gradient
        insp = x.shape[-nsp:]
        outsp = grad.shape[-nsp:]
        op = tuple(
            i - ((o - 1) * s - 2 * p + d * (k - 1) + 1)
            for i, o, s, p, d, k in zip(insp, outsp, st, pd, dl, w.shape[2:], strict=True)
        )
        gx = prim(
            "convolution",
            grad,
            w,
            None,
            stride=st,
            padding=pd,
            dilation=dl,
            groups=groups,
            transposed=True,
            output_padding=op,
        )
    if output_mask[1] and (x.private or grad.private) and len(grad.shape) == nsp + 2:
        # a product of private tensors: per example, with prims that have privacy rules
        pe = per_example_weight_grad(
            x, grad, kernel=w.shape[2:], stride=st, padding=pd, dilation=dl, groups=groups
        )
        gw = prim("sum", pe, dims=(0,), keepdim=False)
    elif output_mask[1]:
        gw = prim(
            "convolution_weight_grad",
            x,
            grad,
            kernel_size=tuple(w.shape[2:]),
            stride=st,
            padding=pd,
            dilation=dl,
            groups=groups,
        )
    if output_mask[2]:
        dims = (0, *range(2, 2 + nsp)) if len(grad.shape) == nsp + 2 else tuple(range(1, 1 + nsp))
        gb = prim("sum", grad, dims=dims, keepdim=False, dtype=dtype_name(out[2].dtype))
    return gx, gw, gb


def _pool_weight(channels: int, k: tuple[int, ...], dtype: torch.dtype) -> Node:
    shape = (channels, 1, *k)
    n = 1
    for e in k:
        n *= e
    return prim("full", shape=shape, value=1.0 / n, dtype=dtype_name(dtype))


def _avg_args(
    kernel: Any,
    stride: Any,
    padding: Any,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor: Any,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    k = _tup(kernel, 2)
    s = _tup(stride, 2) if stride else k
    p = _tup(padding, 2)
    if ceil_mode or divisor is not None or (any(p) and not count_include_pad):
        raise UnsupportedOperationError(
            "avg_pool2d with ceil_mode, divisor_override or count_include_pad=False is not in the "
            "prim vocabulary (see docs/remote-tensors.md)"
        )
    return k, s, p


@implements(aten.avg_pool2d.default)
def _avg_pool2d(
    out: torch.Tensor,
    x: Node,
    kernel: Any,
    stride: Any = (),
    padding: Any = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: Any = None,
) -> Node:
    p2 = _tup(padding, 2)
    if (
        ceil_mode
        or divisor_override is not None
        or (any(p2) and not count_include_pad)
        or not out.dtype.is_floating_point
    ):
        # every other form: pad + unfold + sum over public divisors (rules_pool)
        return avg_pool(
            out, x, 2, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
        )
    k, s, p = _avg_args(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    assert x.shape is not None
    c = x.shape[-3]
    w = _pool_weight(c, k, out.dtype)
    return prim("convolution", x, w, None, stride=s, padding=p, dilation=(1, 1), groups=c)


@implements(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(
    out: torch.Tensor,
    grad: Node,
    x: Node,
    kernel: Any,
    stride: Any,
    padding: Any,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Any,
) -> Node:
    k, s, p = _avg_args(kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
    assert x.shape is not None and grad.shape is not None
    c = x.shape[-3]
    w = _pool_weight(c, k, out.dtype)
    op = tuple(
        i - ((o - 1) * st - 2 * pp + (kk - 1) + 1)
        for i, o, st, pp, kk in zip(x.shape[-2:], grad.shape[-2:], s, p, k, strict=True)
    )
    return prim(
        "convolution",
        grad,
        w,
        None,
        stride=s,
        padding=p,
        dilation=(1, 1),
        groups=c,
        transposed=True,
        output_padding=op,
    )


# -- softmax and activation gradients: direct rules (torch's decompositions are slow to trace) --


#: exp's argument in a softmax is taken at least this: below, the node's float64 kernel
#: would take a slower path (docs/privacy.md, "What an answered publish's time shows"), and
#: e^-512 (4e-223) beside the 1 of the largest term changes no probability a float can hold.
SOFTMAX_FLOOR = -512.0


def _softmax_exp(shifted: Node) -> Node:
    return prim("exp", prim("maximum", shifted, SOFTMAX_FLOOR))


def _softmax_parts(x: Node, dim: int, dtype: torch.dtype) -> tuple[Node, Node]:
    if x.dtype != dtype:
        x = prim("convert_element_type", x, dtype=dtype_name(dtype))
    shifted = prim("sub", x, prim("amax", x, dims=(dim,), keepdim=True))
    return shifted, _softmax_exp(shifted)


@implements(aten._softmax.default)
def _softmax(out: torch.Tensor, x: Node, dim: int, half_to_float: bool) -> Node:
    _, e = _softmax_parts(x, dim, out.dtype)
    return prim("div", e, prim("sum", e, dims=(dim,), keepdim=True))


@implements(aten._log_softmax.default)
def _log_softmax(out: torch.Tensor, x: Node, dim: int, half_to_float: bool) -> Node:
    shifted, e = _softmax_parts(x, dim, out.dtype)
    return prim("sub", shifted, prim("log", prim("sum", e, dims=(dim,), keepdim=True)))


@implements(aten._softmax_backward_data.default)
def _softmax_backward(
    out: torch.Tensor, grad: Node, y: Node, dim: int, input_dtype: torch.dtype
) -> Node:
    gy = prim("mul", grad, y)
    return prim("sub", gy, prim("mul", y, prim("sum", gy, dims=(dim,), keepdim=True)))


@implements(aten._log_softmax_backward_data.default)
def _log_softmax_backward(
    out: torch.Tensor, grad: Node, y: Node, dim: int, input_dtype: torch.dtype
) -> Node:
    return prim(
        "sub", grad, prim("mul", _softmax_exp(y), prim("sum", grad, dims=(dim,), keepdim=True))
    )


implements(aten.threshold_backward.default)(
    lambda out, grad, x, threshold: prim("where", prim("le", x, threshold), 0.0, grad)
)
implements(aten.sigmoid_backward.default)(
    lambda out, grad, y: prim("mul", grad, prim("mul", y, prim("sub", 1.0, y)))
)
implements(aten.tanh_backward.default)(
    lambda out, grad, y: prim("mul", grad, prim("sub", 1.0, prim("mul", y, y)))
)


# -- max pooling: the max over the kernel's taps; the backward scatters into the argmax ---------
# (torch's decomposition records the same values with a graph twice as large and slower)


def _pool_geometry(
    kernel: Any, stride: Any, padding: Any, dilation: Any
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    k = _tup(kernel, 2)
    return k, (_tup(stride, 2) if stride else k), _tup(padding, 2), _tup(dilation, 2)


def _tap_positions(
    x_shape: Sequence[int], out_hw: Sequence[int], kernel: Any, stride: Any, padding: Any,
    dilation: Any,
) -> torch.Tensor:  # fmt: skip
    """The public flat input position each output's taps read, ``[oh, ow, taps]``."""
    k, s, p, d = _pool_geometry(kernel, stride, padding, dilation)
    w = x_shape[-1]
    oh, ow = out_hw
    pos = []
    for i in range(k[0]):
        for j in range(k[1]):
            rows = torch.arange(oh) * s[0] - p[0] + i * d[0]
            cols = torch.arange(ow) * s[1] - p[1] + j * d[1]
            pos.append(rows[:, None] * w + cols[None, :])
    return torch.stack(pos, -1)


def _max_pool_taps(
    out: Any, x: Node, kernel: Any, stride: Any, padding: Any, dilation: Any
) -> tuple[Node, torch.Tensor]:
    """(taps stacked on a new last dim, public flat input position of every tap)."""
    assert x.shape is not None and x.dtype is not None
    k, s, p, d = _pool_geometry(kernel, stride, padding, dilation)
    oh, ow = out[0].shape[-2:]
    fill = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
    xp = prim("pad", x, pad=(p[1], p[1], p[0], p[0]), value=float(fill)) if any(p) else x
    nd = len(x.shape)
    taps = []
    for i in range(k[0]):
        for j in range(k[1]):
            r0, c0 = i * d[0], j * d[1]
            t = prim("slice", xp, dim=nd - 2, start=r0, end=r0 + s[0] * (oh - 1) + 1, step=s[0])
            t = prim("slice", t, dim=nd - 1, start=c0, end=c0 + s[1] * (ow - 1) + 1, step=s[1])
            taps.append(prim("unsqueeze", t, dim=nd))
    pos = _tap_positions(x.shape, (oh, ow), kernel, stride, padding, dilation)
    return prim("cat", *taps, dim=nd), pos


@implements(aten.max_pool2d_with_indices.default)
def _max_pool2d(
    out: Any,
    x: Node,
    kernel: Any,
    stride: Any = (),
    padding: Any = 0,
    dilation: Any = 1,
    ceil_mode: bool = False,
) -> Any:  # tuple[Node, Node], or NotImplemented
    from dpnode.sdk._remote.dispatch import node_of

    if ceil_mode:  # partial windows: torch's decomposition handles them
        return NotImplemented
    stacked, pos = _max_pool_taps(out, x, kernel, stride, padding, dilation)
    nd = len(x.shape or ())
    values = prim("amax", stacked, dims=(nd,), keepdim=False)
    which = prim("argmax", stacked, dim=nd, keepdim=True)
    table = prim("expand", node_of(pos), shape=(*out[0].shape, pos.shape[-1]))
    indices = prim("squeeze", prim("gather", table, which, dim=nd), dims=(nd,))
    return values, indices


@implements(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_backward(
    out: torch.Tensor,
    grad: Node,
    x: Node,
    kernel: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool,
    indices: Node,
) -> Node:
    # the indices name flat input positions whatever the window geometry, ceil_mode included
    assert x.shape is not None and grad.shape is not None
    if (grad.private or indices.private) and not ceil_mode:
        return _max_pool_backward_by_taps(out, grad, x, indices, kernel, stride, padding, dilation)
    lead, (h, w) = tuple(x.shape[:-2]), x.shape[-2:]
    flat = (*lead, h * w)
    zeros = prim("full", shape=flat, value=0.0, dtype=dtype_name(out.dtype))
    src = prim("reshape", grad, shape=(*lead, -1))
    idx = prim("reshape", indices, shape=(*lead, -1))
    summed = prim("scatter_add", zeros, idx, src, dim=len(flat) - 1)
    return prim("reshape", summed, shape=tuple(x.shape))


def _max_pool_backward_by_taps(
    out: torch.Tensor,
    grad: Node,
    x: Node,
    indices: Node,
    kernel: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
) -> Node:
    """The max pool's gradient without scattering at private positions: for every tap, the
    output's gradient where that tap was the argmax (``indices == its public position``),
    placed on the input grid where the tap reads (zeros interleaved by the stride, then
    shifted and cropped), summed over the taps as scatter_add sums overlapping windows."""
    from dpnode.sdk._remote.dispatch import node_of

    assert x.shape is not None and grad.shape is not None
    k, s, p, d = _pool_geometry(kernel, stride, padding, dilation)
    nd = len(x.shape)
    (h, w), (oh, ow) = x.shape[-2:], grad.shape[-2:]
    hp, wp = h + 2 * p[0], w + 2 * p[1]
    pos = _tap_positions(x.shape, (oh, ow), kernel, stride, padding, dilation)
    dtype = dtype_name(out.dtype)
    total: Node | None = None
    for t in range(pos.shape[-1]):
        i, j = divmod(t, k[1])
        hit = prim("eq", indices, node_of(pos[..., t].contiguous()))
        part = prim("mul", grad, prim("convert_element_type", hit, dtype=dtype))
        if s != (1, 1):  # [.., oh, ow] -> [.., oh * s0, ow * s1], each value first in its cell
            part = prim("reshape", part, shape=(*grad.shape[:-2], oh, 1, ow, 1))
            part = prim("pad", part, pad=(0, s[1] - 1, 0, 0, 0, s[0] - 1), value=0.0)
            part = prim("reshape", part, shape=(*grad.shape[:-2], oh * s[0], ow * s[1]))
        r0, c0 = i * d[0], j * d[1]  # where the tap starts on the padded grid
        grow = (max(hp - r0 - oh * s[0], 0), max(wp - c0 - ow * s[1], 0))
        part = prim("pad", part, pad=(c0, grow[1], r0, grow[0]), value=0.0)
        part = prim("slice", part, dim=nd - 2, start=p[0], end=p[0] + h, step=1)
        part = prim("slice", part, dim=nd - 1, start=p[1], end=p[1] + w, step=1)
        total = part if total is None else prim("add", total, part)
    assert total is not None
    return total


# -- embedding: the table's gradient on private ids, one-hot codes instead of index_put -------


@implements(aten.embedding_dense_backward.default)
def _embedding_dense_backward(
    out: torch.Tensor,
    grad: Node,
    indices: Node,
    num_weights: int,
    padding_idx: int,
    scale_grad_by_freq: bool,
) -> Any:  # Node, or NotImplemented
    """On private ids torch's decomposition adds each position's gradient into the table
    with index_put at a private row, which has no privacy rule; the same sum is the one-hot
    codes of the ids times the gradients, summed over the positions (zero at padding_idx).
    Scaling by the ids' frequency depends on them: left to torch (and refused)."""
    if not (indices.private or grad.private) or scale_grad_by_freq:
        return NotImplemented
    assert indices.shape is not None
    hot = prim("eq", prim("unsqueeze", indices, dim=-1), constant(torch.arange(num_weights)))
    code = prim("convert_element_type", hot, dtype=dtype_name(out.dtype))
    if padding_idx >= 0:
        keep = torch.ones(num_weights, dtype=out.dtype)
        keep[padding_idx] = 0
        code = prim("mul", code, constant(keep))
    per = prim("mul", prim("unsqueeze", code, dim=-1), prim("unsqueeze", grad, dim=-2))
    return prim("sum", per, dims=tuple(range(len(indices.shape))), keepdim=False)


# -- negative log-likelihood: one-hot codes against the class indices -------------------------
# torch's decomposition picks each row's class with gather (forward) and scatter (backward);
# on private labels neither has a privacy rule (an index chosen by a private value). A
# comparison of the label with the public class list is a one-hot code whose rows change
# only with their own label, and it records the same values.


def _one_hot(target: Node, classes: int, dtype: torch.dtype, weight: Node | None) -> Node:
    """``[target_i == c] * weight_c`` as ``dtype``, shape ``(N, C)``; a label outside
    ``0 .. C-1`` (the ignored one) gives a row of zeros."""
    hot = prim("eq", prim("unsqueeze", target, dim=-1), constant(torch.arange(classes)))
    code = prim("convert_element_type", hot, dtype=dtype_name(dtype))
    return code if weight is None else prim("mul", code, weight)


def _nll_parts(
    x: Node, target: Node, weight: Node | None, ignore_index: int, dtype: torch.dtype
) -> tuple[Node, Node, bool]:
    """The weighted one-hot code of the targets (rows of zeros where ignored), its row sums
    (each row's weight), and whether ``x`` was one sample (1-d)."""
    single = len(x.shape or ()) == 1
    classes = int((x.shape or (1,))[-1])
    t = prim("unsqueeze", target, dim=0) if single else target
    valid = prim("ne", t, ignore_index)
    t = prim("where", valid, t, -1)  # an ignored label may lie inside 0 .. C-1
    code = _one_hot(t, classes, dtype, weight)
    return code, prim("sum", code, dims=(1,), keepdim=False), single


@implements(aten.nll_loss_forward.default)
def _nll_loss_forward(
    out: Any, x: Node, target: Node, weight: Node | None, reduction: int, ignore_index: int
) -> tuple[Node, Node]:
    dtype = out[0].dtype
    code, row_weight, single = _nll_parts(x, target, weight, ignore_index, dtype)
    xs = prim("unsqueeze", x, dim=0) if single else x
    loss = prim("neg", prim("sum", prim("mul", xs, code), dims=(1,), keepdim=False))
    total = prim("sum", row_weight, dims=(0,), keepdim=False)
    if reduction == 0:  # none
        return (prim("squeeze", loss, dims=(0,)) if single else loss), total
    summed = prim("sum", loss, dims=(0,), keepdim=False)
    return (summed if reduction == 2 else prim("div", summed, total)), total


@implements(aten.nll_loss_backward.default)
def _nll_loss_backward(
    out: torch.Tensor,
    grad: Node,
    x: Node,
    target: Node,
    weight: Node | None,
    reduction: int,
    ignore_index: int,
    total_weight: Node,
) -> Node:
    code, _, single = _nll_parts(x, target, weight, ignore_index, out.dtype)
    if reduction == 0 and not single:
        g = prim("unsqueeze", grad, dim=1)
    elif reduction == 1:
        g = prim("div", grad, total_weight)
    else:
        g = grad
    result = prim("neg", prim("mul", code, g))
    return prim("squeeze", result, dims=(0,)) if single else result

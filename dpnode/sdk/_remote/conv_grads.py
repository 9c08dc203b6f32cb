"""The weight gradient of a convolution on private data, as prims that have privacy rules.

The engine's ``convolution_weight_grad`` contracts two private tensors (the layer's input
and its output's gradient) over the batch: a product of private values with no privacy rule.
The same gradient is, per example, a sum over output positions of the output's gradient
times the input window that position saw,

    pe[n, o, c, t] = sum_p go[n, o, p] * win[n, c, p, t]      (c within o's group)

recorded with ``pad``, ``unfold`` and ``slice`` (the windows) and a ``matmul`` batched over
examples and groups (``[og, positions] @ [positions, cg * taps]``, whose rule bounds products
of one example's own values). Each example's term depends on that example's row only, so
DP-SGD can clip it (``sdk._per_sample``), and the ordinary ``.grad`` is its sum over
examples. The price is the windows, rows x input channels x positions x taps values, which
the engine's prim never holds: it is used only where the input or the gradient is private.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from sdk._remote.graph import Node, prim

__all__ = ["per_example_weight_grad"]


def _windows(
    x: Node,
    shape: tuple[int, ...],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
) -> Node:
    """``x`` of ``shape`` (N, C, *spatial) as (N, C, *out, *kernel): the taps each output saw."""
    nsp = len(kernel)
    if any(padding):  # pad's widths run from the last dim backwards, as torch's F.pad
        widths = tuple(w for p in reversed(tuple(padding)) for w in (p, p))
        x = prim("pad", x, pad=widths, value=0.0)
    nd = 2 + nsp
    for d, (k, s, dl) in enumerate(zip(kernel, stride, dilation, strict=True)):
        span = dl * (k - 1) + 1
        x = prim("unfold", x, dim=2 + d, size=span, step=s)  # a window axis at the end
        if dl > 1:
            x = prim("slice", x, dim=nd + d, start=0, end=span, step=dl)
    return x


def per_example_weight_grad(
    x: Node,
    grad: Node,
    *,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
) -> Node:
    """Per-example gradients ``[N, C_out, C_in / groups, *kernel]`` of a forward convolution's
    weight, from its batched input ``x`` and its output's gradient ``grad``."""
    assert x.shape is not None and grad.shape is not None
    xs, gs = tuple(x.shape), tuple(grad.shape)
    n, cin, cout = xs[0], xs[1], gs[1]
    out = gs[2:]
    cg, og = cin // groups, cout // groups
    positions, taps = math.prod(out), math.prod(kernel)
    win = _windows(x, xs, kernel, stride, padding, dilation)  # [N, C_in, *out, *kernel]
    win = prim("reshape", win, shape=(n, groups, cg, positions, taps))
    win = prim("permute", win, dims=(0, 1, 3, 2, 4))  # [N, groups, positions, cg, taps]
    win = prim("reshape", win, shape=(n, groups, positions, cg * taps))
    go = prim("reshape", grad, shape=(n, groups, og, positions))
    # per example and group: [og, positions] @ [positions, cg * taps], batched over both
    pe = prim("matmul", go, win)
    pe = prim("reshape", pe, shape=(n, cout, cg, *kernel))
    pe.shape, pe.dtype = (n, cout, cg, *kernel), grad.dtype
    assert math.prod(pe.shape) == n * cout * cg * math.prod(kernel)
    return pe

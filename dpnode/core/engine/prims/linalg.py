"""matmul and convolution (forward, transposed, and the weight gradient).

Convolution works on windows of the padded input (``sliding_window_view``,
no copy) contracted with the weight by ``tensordot`` (one BLAS call per
group). The transposed convolution, which is also the gradient with respect
to the input, scatters one ``tensordot`` per kernel tap into a strided slice
of the output, so it never materialises a zero-dilated input.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from node.engine.accurate import BLOCK, depth
from node.engine.dtypes import DType, accumulation, opmath
from node.engine.prims.registry import Array, AttrSpec, Call, TensorMeta, broadcast, prim

# -- matmul ------------------------------------------------------------------


def _matmul_shapes(c: Call) -> tuple[tuple[int, ...], int, int, int]:
    a, b = c.tensor(0), c.tensor(1)
    if a.ndim == 0 or b.ndim == 0:
        raise c.fail("both arguments to matmul need at least 1 dimension")
    if a.dtype != b.dtype:
        raise c.fail(
            f"expected both operands to have the same dtype, got {a.dtype.name} and {b.dtype.name}"
        )
    if a.dtype.is_bool:
        raise c.fail("matmul is not implemented for bool (torch refuses it too)")
    m, k = (1, a.shape[0]) if a.ndim == 1 else a.shape[-2:]
    k2, n = (b.shape[0], 1) if b.ndim == 1 else b.shape[-2:]
    if k != k2:
        raise c.fail(
            f"shapes {list(a.shape)} and {list(b.shape)} cannot be multiplied ({k} != {k2})"
        )
    batch = broadcast(c, [a.shape[:-2], b.shape[:-2]])
    return batch, m, k, n


def _matmul_infer(c: Call) -> TensorMeta:
    a, b = c.tensor(0), c.tensor(1)
    batch, m, _, n = _matmul_shapes(c)
    shape = batch + ((m,) if a.ndim > 1 else ()) + ((n,) if b.ndim > 1 else ())
    return TensorMeta(shape, a.dtype)


def _matmul_flops(c: Call) -> int:
    batch, m, k, n = _matmul_shapes(c)
    return 2 * math.prod(batch) * m * k * n + 1


#: the shortest contraction an accurate product accumulates in blocks, in float64
WIDEN_MIN_K = 256


def matmul_accumulation(c: Call) -> tuple[DType, int]:
    """The dtype ``matmul`` accumulates in, and the most roundings a product goes through
    in that dtype (``node.engine.accurate``): torch's opmath and the contraction length,
    or float64 in blocks for an accurate call with at least ``WIDEN_MIN_K`` terms."""
    k = c.tensor(0).shape[-1]
    if c.accurate and k >= WIDEN_MIN_K and c.out().dtype.is_float:
        return accumulation(c.out().dtype, True), depth(k)
    return opmath(c.out().dtype), k


@prim("matmul", privacy="rule", args=2, infer=_matmul_infer, flops=_matmul_flops)
def _matmul(c: Call, args: list[Any], out: Array | None) -> Array:
    """torch.matmul: dot, matrix-vector, matrix and broadcast batched products."""
    a, b = args
    res = c.out().dtype
    acc, rounds = matmul_accumulation(c)
    cd = acc.np
    k = a.shape[-1]
    if rounds == k:
        r = np.matmul(a.astype(cd, copy=False), b.astype(cd, copy=False))
        return np.asarray(r).astype(res.np, copy=False)
    # a block of the contraction at a time, widened to float64 (a float32 operand is not
    # copied whole), the blocks' products added up in float64
    left = a if a.ndim > 1 else a[None, :]
    right = b if b.ndim > 1 else b[:, None]
    total: Array | None = None
    for s in range(0, k, BLOCK):
        piece = slice(s, s + BLOCK)
        part = np.matmul(
            left[..., piece].astype(cd, copy=False), right[..., piece, :].astype(cd, copy=False)
        )
        total = part if total is None else np.add(total, part, out=total)
    assert total is not None
    if b.ndim == 1:
        total = total[..., 0]
    if a.ndim == 1:
        total = total[..., 0, :] if b.ndim > 1 else total[..., 0]
    return np.asarray(total).astype(res.np, copy=False)


# -- convolution -------------------------------------------------------------

_CONV = {
    "stride": AttrSpec("ints"),
    "padding": AttrSpec("ints"),
    "dilation": AttrSpec("ints"),
    "groups": AttrSpec("int", optional=True, default=1),
    "transposed": AttrSpec("bool", optional=True, default=False),
    "output_padding": AttrSpec("ints", optional=True),
}


def _spatial_attr(c: Call, name: str, nsp: int, lo: int) -> tuple[int, ...]:
    v = c.attrs.get(name)
    if v is None:
        v = (0,) * nsp
    v = tuple(v)
    if len(v) == 1:
        v = v * nsp
    if len(v) != nsp or any(e < lo for e in v):
        raise c.fail(f"needs {nsp} values >= {lo}, got {list(v)}", name)
    return v


def _conv_geometry(c: Call) -> dict[str, Any]:
    x, w = c.tensor(0), c.tensor(1)
    nsp = w.ndim - 2
    if nsp not in (1, 2, 3):
        raise c.fail(f"weight must be 3-d, 4-d or 5-d, got {w.ndim}-d", 1)
    batched = x.ndim == w.ndim
    if not batched and x.ndim != w.ndim - 1:
        raise c.fail(f"input of {x.ndim} dims does not match a weight of {w.ndim} dims", 0)
    if x.dtype.is_bool or w.dtype != x.dtype:
        raise c.fail(
            f"input and weight must share a numeric dtype, got {x.dtype.name} and {w.dtype.name}"
        )
    g = c.attrs.get("groups") or 1
    stride = _spatial_attr(c, "stride", nsp, 1)
    padding = _spatial_attr(c, "padding", nsp, 0)
    dilation = _spatial_attr(c, "dilation", nsp, 1)
    outpad = _spatial_attr(c, "output_padding", nsp, 0)
    xs = x.shape if batched else (1, *x.shape)
    n, cin, sp = xs[0], xs[1], xs[2:]
    k = w.shape[2:]
    transposed = bool(c.attrs.get("transposed"))
    if g < 1 or cin % g:
        raise c.fail(f"{cin} input channels are not divisible by groups={g}", "groups")
    if transposed:
        if w.shape[0] != cin:
            raise c.fail(f"transposed weight needs {cin} input channels, has {w.shape[0]}", 1)
        cout = w.shape[1] * g
        out = tuple(
            (s - 1) * st - 2 * p + d * (kk - 1) + op + 1
            for s, st, p, d, kk, op in zip(sp, stride, padding, dilation, k, outpad, strict=True)
        )
    else:
        if w.shape[1] * g != cin or w.shape[0] % g:
            raise c.fail(
                f"weight {list(w.shape)} does not fit {cin} input channels with groups={g}", 1
            )
        cout = w.shape[0]
        out = tuple(
            (s + 2 * p - d * (kk - 1) - 1) // st + 1
            for s, st, p, d, kk in zip(sp, stride, padding, dilation, k, strict=True)
        )
    if any(o <= 0 for o in out):
        raise c.fail(f"output size {list(out)} is too small (input {list(sp)}, kernel {list(k)})")
    return dict(
        nsp=nsp,
        batched=batched,
        n=n,
        cin=cin,
        cout=cout,
        out=out,
        k=k,
        g=g,
        stride=stride,
        padding=padding,
        dilation=dilation,
        transposed=transposed,
    )


def _conv_infer(c: Call) -> TensorMeta:
    geo = _conv_geometry(c)
    b = c.args[2] if len(c.args) > 2 else None
    if isinstance(b, TensorMeta) and (b.shape != (geo["cout"],) or b.dtype != c.tensor(0).dtype):
        raise c.fail(f"bias must be 1-d of size {geo['cout']} and the input's dtype", 2)
    shape = ((geo["n"],) if geo["batched"] else ()) + (geo["cout"], *geo["out"])
    return TensorMeta(shape, c.tensor(0).dtype)


def _conv_workspace(c: Call) -> int:
    """The padded input, the window matrix tensordot copies, float32 copies of low precision."""
    x, w = c.tensor(0), c.tensor(1)
    geo = _conv_geometry(c)
    item = 4 if x.dtype.is_low_precision else x.dtype.itemsize
    n, cin, k = geo["n"], geo["cin"], math.prod(geo["k"])
    cast = (x.numel + w.numel + c.out().numel) * 4 if x.dtype.is_low_precision else 0
    if geo["transposed"]:
        sp = x.shape[-geo["nsp"] :]
        ext = math.prod(
            max((s - 1) * t + d * (kk - 1) + 1, o + p)
            for s, t, d, kk, o, p in zip(
                sp,
                geo["stride"],
                geo["dilation"],
                geo["k"],
                geo["out"],
                geo["padding"],
                strict=True,
            )
        )
        return int(cast + item * (n * geo["cout"] * ext + 2 * n * math.prod(sp) * geo["cout"]))
    padded = math.prod(
        s + 2 * p for s, p in zip(x.shape[-geo["nsp"] :], geo["padding"], strict=True)
    )
    return int(
        cast + item * (n * cin * padded + n * cin * math.prod(geo["out"]) * k + c.out().numel)
    )


def _conv_flops(c: Call) -> int:
    w = c.tensor(1)
    return 2 * c.out().numel * math.prod(w.shape[1:]) + 1


def _windows(
    xp: Array,
    k: tuple[int, ...],
    stride: tuple[int, ...],
    dil: tuple[int, ...],
    out: tuple[int, ...],
) -> Array:
    """(N, C, *out, *k) view of the padded input: the taps each output sees."""
    nsp = len(k)
    span = tuple(d * (kk - 1) + 1 for d, kk in zip(dil, k, strict=True))
    win = sliding_window_view(xp, span, axis=tuple(range(2, 2 + nsp)))
    sel: tuple[slice, ...] = (slice(None), slice(None))
    sel += tuple(slice(0, o * s, s) for o, s in zip(out, stride, strict=True))
    sel += tuple(slice(None, None, d) for d in dil)
    return win[sel]


def _pad_spatial(x: Array, padding: tuple[int, ...]) -> Array:
    if not any(padding):
        return x
    return np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])


def _conv_forward(x: Array, w: Array, geo: dict[str, Any]) -> Array:
    nsp, g = geo["nsp"], geo["g"]
    win = _windows(
        _pad_spatial(x, geo["padding"]), geo["k"], geo["stride"], geo["dilation"], geo["out"]
    )
    kax = tuple(range(2 + nsp, 2 + 2 * nsp))
    if g == 1:
        r = np.tensordot(win, w, axes=((1, *kax), (1, *range(2, 2 + nsp))))  # (N, *out, Cout)
        return np.moveaxis(r, -1, 1)
    cg, og = x.shape[1] // g, w.shape[0] // g
    res = np.empty((x.shape[0], w.shape[0], *geo["out"]), dtype=np.result_type(x, w))
    for i in range(g):
        r = np.tensordot(
            win[:, i * cg : (i + 1) * cg],
            w[i * og : (i + 1) * og],
            axes=((1, *kax), (1, *range(2, 2 + nsp))),
        )
        res[:, i * og : (i + 1) * og] = np.moveaxis(r, -1, 1)
    return res


def _conv_transposed(x: Array, w: Array, geo: dict[str, Any]) -> Array:
    g = geo["g"]
    st, dil, pad, k = geo["stride"], geo["dilation"], geo["padding"], geo["k"]
    sp = x.shape[2:]
    full = tuple((s - 1) * t + d * (kk - 1) + 1 for s, t, d, kk in zip(sp, st, dil, k, strict=True))
    ext = tuple(max(f, o + p) for f, o, p in zip(full, geo["out"], pad, strict=True))
    cin, cout = x.shape[1], geo["cout"]
    cg, og = cin // g, cout // g
    acc = np.zeros((x.shape[0], cout, *ext), dtype=np.result_type(x, w))
    for tap in np.ndindex(*k):
        dst = tuple(
            slice(t * d, t * d + (s - 1) * s_ + 1, s_)
            for t, d, s, s_ in zip(tap, dil, sp, st, strict=True)
        )
        for i in range(g):
            wt = w[i * cg : (i + 1) * cg, :, *tap]  # (cg, og)
            contrib = np.tensordot(
                x[:, i * cg : (i + 1) * cg], wt, axes=((1,), (0,))
            )  # (N, *sp, og)
            acc[(slice(None), slice(i * og, (i + 1) * og), *dst)] += np.moveaxis(contrib, -1, 1)
    crop = tuple(slice(p, p + o) for p, o in zip(pad, geo["out"], strict=True))
    return acc[(slice(None), slice(None), *crop)]


def conv_geometry(c: Call) -> dict[str, Any]:
    """The convolution's geometry (shapes, taps, stride, ...), as its kernel uses it."""
    return _conv_geometry(c)


def conv_map(x: Array, w: Array, geo: dict[str, Any]) -> Array:
    """The convolution of a batched ``x`` with ``w`` (no bias), in their own dtype: the
    linear map the privacy rule applies to bounds, with ``|w|`` for their widths."""
    return _conv_transposed(x, w, geo) if geo["transposed"] else _conv_forward(x, w, geo)


@prim(
    "convolution",
    privacy="rule",
    args=(2, 3),
    attrs=_CONV,
    infer=_conv_infer,
    flops=_conv_flops,
    workspace=_conv_workspace,
    optional_args=frozenset({2}),
)
def _convolution(c: Call, args: list[Any], out: Array | None) -> Array:
    """aten.convolution: N-d (1-3 spatial dims), stride, padding, dilation, groups, transposed."""
    x, w = args[0], args[1]
    b = args[2] if len(args) > 2 else None
    geo = _conv_geometry(c)
    res = c.out().dtype
    cd = opmath(res).np
    x = x.astype(cd, copy=False)
    w = w.astype(cd, copy=False)
    if not geo["batched"]:
        x = x[None]
    r = conv_map(x, w, geo)
    if b is not None:
        r = r + b.astype(cd, copy=False).reshape((-1,) + (1,) * geo["nsp"])
    if not geo["batched"]:
        r = r[0]
    return np.asarray(r).astype(res.np, copy=False)


def _wgrad_geometry(c: Call) -> dict[str, Any]:
    x, go = c.tensor(0), c.tensor(1)
    k = tuple(c.attr("kernel_size"))
    nsp = len(k)
    if x.ndim != nsp + 2 or go.ndim != nsp + 2:
        raise c.fail(f"input and grad_output must be batched {nsp + 2}-d tensors")
    if x.dtype != go.dtype or not x.dtype.is_float:
        raise c.fail("input and grad_output must share a floating dtype")
    g = c.attrs.get("groups") or 1
    stride = _spatial_attr(c, "stride", nsp, 1)
    padding = _spatial_attr(c, "padding", nsp, 0)
    dilation = _spatial_attr(c, "dilation", nsp, 1)
    out = tuple(
        (s + 2 * p - d * (kk - 1) - 1) // st + 1
        for s, st, p, d, kk in zip(x.shape[2:], stride, padding, dilation, k, strict=True)
    )
    if out != go.shape[2:] or go.shape[0] != x.shape[0]:
        raise c.fail(
            f"grad_output {list(go.shape)} does not match the forward output size {list(out)}", 1
        )
    if g < 1 or x.shape[1] % g or go.shape[1] % g:
        raise c.fail(f"channels not divisible by groups={g}", "groups")
    return dict(nsp=nsp, k=k, g=g, stride=stride, padding=padding, dilation=dilation, out=out)


def _wgrad_infer(c: Call) -> TensorMeta:
    geo = _wgrad_geometry(c)
    x, go = c.tensor(0), c.tensor(1)
    return TensorMeta((go.shape[1], x.shape[1] // geo["g"], *geo["k"]), x.dtype)


def _wgrad_workspace(c: Call) -> int:
    x, go = c.tensor(0), c.tensor(1)
    geo = _wgrad_geometry(c)
    item = 4 if x.dtype.is_low_precision else x.dtype.itemsize
    padded = math.prod(s + 2 * p for s, p in zip(x.shape[2:], geo["padding"], strict=True))
    win = x.shape[0] * x.shape[1] * math.prod(geo["out"]) * math.prod(geo["k"])
    return int(item * (x.shape[0] * x.shape[1] * padded + win + x.numel + go.numel))


def _wgrad_flops(c: Call) -> int:
    return 2 * c.tensor(1).numel * c.out().numel // max(c.out().shape[0], 1) + 1


@prim(
    "convolution_weight_grad",
    privacy="public_only",
    args=2,
    attrs={
        "kernel_size": AttrSpec("ints"),
        "stride": AttrSpec("ints"),
        "padding": AttrSpec("ints"),
        "dilation": AttrSpec("ints"),
        "groups": AttrSpec("int", optional=True, default=1),
    },
    infer=_wgrad_infer,
    flops=_wgrad_flops,
    workspace=_wgrad_workspace,
)
def _conv_wgrad(c: Call, args: list[Any], out: Array | None) -> Array:
    """Gradient of a (non-transposed) convolution with respect to its weight."""
    x, go = args
    geo = _wgrad_geometry(c)
    res = c.out().dtype
    cd = opmath(res).np
    x, go = x.astype(cd, copy=False), go.astype(cd, copy=False)
    nsp, g = geo["nsp"], geo["g"]
    win = _windows(
        _pad_spatial(x, geo["padding"]), geo["k"], geo["stride"], geo["dilation"], geo["out"]
    )
    oax = tuple(range(2, 2 + nsp))
    cg, og = x.shape[1] // g, go.shape[1] // g
    parts = [
        np.tensordot(
            go[:, i * og : (i + 1) * og], win[:, i * cg : (i + 1) * cg], axes=((0, *oax), (0, *oax))
        )
        for i in range(g)
    ]
    r = parts[0] if g == 1 else np.concatenate(parts, axis=0)
    return np.asarray(r).astype(res.np, copy=False)

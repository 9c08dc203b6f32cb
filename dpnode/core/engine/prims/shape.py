"""Shape prims: reshape, expand, permute, squeeze, unsqueeze, slice, flip, unfold, cat, pad.

The view prims return NumPy views where NumPy can; they are marked
``view=True`` and the evaluator tracks buffer ownership, so nothing is ever
written in place through a view that another live value can see.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpnode.core.engine.prims.elementwise import as_np
from dpnode.core.engine.prims.registry import Array, AttrSpec, Call, TensorMeta, prim
from dpnode.core.engine.promotion import Kind, Operand, result_type


def _shape_attr(c: Call, name: str = "shape") -> tuple[int, ...]:
    s = tuple(c.attr(name))
    return s


# -- views -------------------------------------------------------------------


def _reshape_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    shape = list(_shape_attr(c))
    if shape.count(-1) > 1:
        raise c.fail("only one dimension can be -1", "shape")
    if any(s < -1 for s in shape):
        raise c.fail(f"invalid shape {shape}", "shape")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or x.numel % known:
            raise c.fail(f"shape {shape} is invalid for input of size {x.numel}", "shape")
        shape[shape.index(-1)] = x.numel // known
    elif known != x.numel:
        raise c.fail(f"shape {shape} is invalid for input of size {x.numel}", "shape")
    return TensorMeta(tuple(shape), x.dtype)


@prim(
    "reshape",
    privacy="rule",
    args=1,
    attrs={"shape": AttrSpec("shape")},
    infer=_reshape_infer,
    view=True,
    flops=lambda c: 1,
)
def _reshape(c: Call, args: list[Any], out: Array | None) -> Array:
    """Reshape (a view when the layout allows, else a copy)."""
    return np.reshape(args[0], c.out().shape)


def _expand_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    shape = _shape_attr(c)
    if len(shape) < x.ndim:
        raise c.fail(f"cannot expand a {x.ndim}-d tensor to {len(shape)} dims", "shape")
    lead = len(shape) - x.ndim
    out: list[int] = []
    for i, s in enumerate(shape):
        if i < lead:
            if s < 0:
                raise c.fail(f"-1 is not allowed in a new leading dim ({list(shape)})", "shape")
            out.append(s)
            continue
        have = x.shape[i - lead]
        if s == -1:
            out.append(have)
        elif s < 0:
            raise c.fail(f"cannot expand to a negative size {s} at dim {i}", "shape")
        elif have == s or have == 1:
            out.append(s)
        else:
            raise c.fail(f"cannot expand size {have} to {s} at dim {i}", "shape")
    return TensorMeta(tuple(out), x.dtype)


@prim(
    "expand",
    privacy="rule",
    args=1,
    attrs={"shape": AttrSpec("shape")},
    infer=_expand_infer,
    view=True,
    flops=lambda c: 1,
)
def _expand(c: Call, args: list[Any], out: Array | None) -> Array:
    """Broadcast to ``shape`` (torch.expand; -1 keeps a dim); a read-only view."""
    return np.broadcast_to(args[0], c.out().shape)


def _permute_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    dims = [c.dim(d, x.ndim, "dims") for d in c.attr("dims")]
    if sorted(dims) != list(range(x.ndim)):
        raise c.fail(f"{list(c.attr('dims'))} is not a permutation of {x.ndim} dims", "dims")
    return TensorMeta(tuple(x.shape[d] for d in dims), x.dtype)


@prim(
    "permute",
    privacy="rule",
    args=1,
    attrs={"dims": AttrSpec("ints")},
    infer=_permute_infer,
    view=True,
    flops=lambda c: 1,
)
def _permute(c: Call, args: list[Any], out: Array | None) -> Array:
    """Permute dims (a view)."""
    x = args[0]
    return np.transpose(x, [d % max(x.ndim, 1) for d in c.attr("dims")]) if x.ndim else x


def _squeeze_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    dims = c.attrs.get("dims")
    if dims is None:
        keep = [s for s in x.shape if s != 1]
    else:
        ds = {c.dim(d, x.ndim, "dims") for d in dims}
        # torch: squeezing a dim whose size is not 1 is a no-op
        keep = [s for i, s in enumerate(x.shape) if not (i in ds and s == 1)]
    return TensorMeta(tuple(keep), x.dtype)


@prim(
    "squeeze",
    privacy="rule",
    args=1,
    attrs={"dims": AttrSpec("ints", optional=True)},
    infer=_squeeze_infer,
    view=True,
    flops=lambda c: 1,
)
def _squeeze(c: Call, args: list[Any], out: Array | None) -> Array:
    """Drop size-1 dims (all, or those listed)."""
    return np.reshape(args[0], c.out().shape)


def _unsqueeze_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    d = c.attr("dim")
    if not -x.ndim - 1 <= d <= x.ndim:
        raise c.fail(f"dim {d} out of range for unsqueeze of a {x.ndim}-d tensor", "dim")
    d %= x.ndim + 1
    return TensorMeta((*x.shape[:d], 1, *x.shape[d:]), x.dtype)


@prim(
    "unsqueeze",
    privacy="rule",
    args=1,
    attrs={"dim": AttrSpec("int")},
    infer=_unsqueeze_infer,
    view=True,
    flops=lambda c: 1,
)
def _unsqueeze(c: Call, args: list[Any], out: Array | None) -> Array:
    """Insert a size-1 dim."""
    return np.reshape(args[0], c.out().shape)


_SLICE = {
    "dim": AttrSpec("int"),
    "start": AttrSpec("int", optional=True),
    "end": AttrSpec("int", optional=True),
    "step": AttrSpec("int", optional=True, default=1),
}


def _slice_of(c: Call, x: TensorMeta) -> tuple[int, slice]:
    if x.ndim == 0:
        raise c.fail("cannot slice a 0-dim tensor", 0)
    d = c.dim(c.attr("dim"), x.ndim)
    step = c.attrs.get("step") or 1
    if step <= 0:
        raise c.fail(f"slice step must be positive, got {step}", "step")
    return d, slice(c.attrs.get("start"), c.attrs.get("end"), step)


def _slice_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    d, sl = _slice_of(c, x)
    n = len(range(*sl.indices(x.shape[d])))
    return TensorMeta((*x.shape[:d], n, *x.shape[d + 1 :]), x.dtype)


@prim(
    "slice", privacy="rule", args=1, attrs=_SLICE, infer=_slice_infer, view=True, flops=lambda c: 1
)
def _slice(c: Call, args: list[Any], out: Array | None) -> Array:
    """x[..., start:end:step, ...] along ``dim`` (step > 0, like torch)."""
    x = args[0]
    meta = c.args[0]
    assert isinstance(meta, TensorMeta)
    d, sl = _slice_of(c, meta)
    return np.asarray(x[(*((slice(None),) * d), sl)])


def _flip_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    dims = [c.dim(d, x.ndim, "dims") for d in c.attr("dims")]
    if len(set(dims)) != len(dims):
        raise c.fail("dims repeat", "dims")
    return x


@prim(
    "flip",
    privacy="rule",
    args=1,
    attrs={"dims": AttrSpec("ints")},
    infer=_flip_infer,
    view=True,
    flops=lambda c: 1,
)
def _flip(c: Call, args: list[Any], out: Array | None) -> Array:
    """Reverse the order along ``dims`` (a view)."""
    x: Array = args[0]
    if x.ndim == 0:
        return x
    return np.flip(x, axis=tuple(d % x.ndim for d in c.attr("dims")))


# -- copies ------------------------------------------------------------------


def _legacy_empty(t: TensorMeta) -> bool:
    # torch.cat skips 1-d empty tensors whatever the other shapes (legacy behaviour)
    return t.shape == (0,)


def _cat_infer(c: Call) -> TensorMeta:
    all_ts = [c.tensor(i) for i in range(len(c.args))]
    for i, t in enumerate(all_ts):
        if t.ndim == 0:
            raise c.fail("zero-dimensional tensors cannot be concatenated", i)
    dt = result_type(Operand(t.dtype, Kind.TENSOR) for t in all_ts)
    ts = [t for t in all_ts if not _legacy_empty(t)]
    if not ts:
        return TensorMeta((0,), dt)
    d = c.dim(c.attr("dim"), ts[0].ndim)
    first = ts[0]
    for i, t in enumerate(ts[1:], 1):
        if t.ndim != first.ndim or any(
            a != b for j, (a, b) in enumerate(zip(t.shape, first.shape, strict=True)) if j != d
        ):
            raise c.fail(
                f"shape {list(t.shape)} does not match {list(first.shape)} except in dim {d}", i
            )
    n = sum(t.shape[d] for t in ts)
    return TensorMeta((*first.shape[:d], n, *first.shape[d + 1 :]), dt)


@prim("cat", privacy="rule", args=(1, None), attrs={"dim": AttrSpec("int")}, infer=_cat_infer)
def _cat(c: Call, args: list[Any], out: Array | None) -> Array:
    """Concatenate along ``dim``, promoting dtypes like torch.cat."""
    d = c.out().dtype
    keep = [a for a in args if a.shape != (0,)]
    if not keep:
        return np.zeros((0,), dtype=d.np)
    return np.concatenate([as_np(a, d) for a in keep], axis=c.attr("dim"))


def _pad_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    pad = list(c.attr("pad"))
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise c.fail(f"padding of length {len(pad)} does not fit a {x.ndim}-d tensor", "pad")
    shape = list(x.shape)
    for k in range(len(pad) // 2):
        d = x.ndim - 1 - k
        shape[d] += pad[2 * k] + pad[2 * k + 1]
        if shape[d] < 0:
            raise c.fail(f"padding {pad} makes dim {d} negative", "pad")
    v = c.attrs.get("value")
    if isinstance(v, float) and not x.dtype.is_float and not float(v).is_integer():
        raise c.fail(f"a non-integer pad value for a {x.dtype.name} tensor", "value")
    return TensorMeta(tuple(shape), x.dtype)


@prim(
    "pad",
    privacy="rule",
    args=1,
    attrs={
        "pad": AttrSpec("ints"),
        "value": AttrSpec("float", optional=True, default=0.0, nonfinite=True),
    },
    infer=_pad_infer,
)
def _pad(c: Call, args: list[Any], out: Array | None) -> Array:
    """Constant padding, torch order (last dim first); negative pads crop."""
    x = args[0]
    pad = list(c.attr("pad"))
    widths = [(0, 0)] * x.ndim
    index: list[slice] = [slice(None)] * x.ndim
    for k in range(len(pad) // 2):
        d = x.ndim - 1 - k
        lo, hi = pad[2 * k], pad[2 * k + 1]
        widths[d] = (max(lo, 0), max(hi, 0))
        index[d] = slice(-min(lo, 0), x.shape[d] + min(hi, 0))
    x = x[tuple(index)]
    value = c.attrs.get("value") or 0.0
    r = np.full(c.out().shape, as_np(value, c.out().dtype), dtype=x.dtype)
    r[tuple(slice(lo, lo + s) for (lo, _), s in zip(widths, x.shape, strict=True))] = x
    return r


def _unfold_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    d = c.dim(c.attr("dim"), x.ndim)
    size, step = c.attr("size"), c.attr("step")
    n = x.shape[d] if x.ndim else 1
    if step <= 0:
        raise c.fail(f"step must be positive, got {step}", "step")
    if not 0 <= size <= n:
        raise c.fail(f"size {size} does not fit a dimension of size {n}", "size")
    if x.ndim == 0:
        return TensorMeta((size,), x.dtype)
    windows = (n - size) // step + 1
    return TensorMeta((*x.shape[:d], windows, *x.shape[d + 1 :], size), x.dtype)


@prim(
    "unfold",
    privacy="rule",
    args=1,
    attrs={"dim": AttrSpec("int"), "size": AttrSpec("int"), "step": AttrSpec("int")},
    infer=_unfold_infer,
    view=True,
    flops=lambda c: 1,
)
def _unfold(c: Call, args: list[Any], out: Array | None) -> Array:
    """Tensor.unfold: windows of ``size`` every ``step`` along ``dim``, as a new last dim
    (a view; pooling is unfold + amax/mean)."""
    x = args[0]
    if x.ndim == 0:
        return np.reshape(x, c.out().shape)
    d = c.attr("dim") % x.ndim
    win = np.lib.stride_tricks.sliding_window_view(x, c.attr("size"), axis=d)
    return np.asarray(win[(*((slice(None),) * d), slice(None, None, c.attr("step")))])

"""Indexing prims: gather, index_select, scatter, scatter_add, scatter_reduce, index_put, index.

Index ranges are checked here rather than left to NumPy, which would silently
wrap negative indices where torch raises. Index tensors are int64 (or int32);
index_put also takes bool masks, whose data-dependent count only affects the
values, never the output shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpnode.core.engine.constant_time import select
from dpnode.core.engine.prims.elementwise import as_np
from dpnode.core.engine.prims.registry import (
    Array,
    AttrSpec,
    Call,
    Scalar,
    TensorMeta,
    broadcast,
    prim,
)


def _check_index_dtype(c: Call, i: int, allow_bool: bool = False) -> TensorMeta:
    t = c.tensor(i)
    if not (t.dtype.name in ("int64", "int32") or (allow_bool and t.dtype.is_bool)):
        raise c.fail(f"index must be int64 (or int32), got {t.dtype.name}", i)
    return t


def _in_range(c: Call, idx: Array, n: int, arg: int, *, negative: bool = False) -> Array:
    """``idx`` checked against a dimension of size ``n`` (``negative``: ``-n .. -1`` count
    from the end, like torch's indexing).

    Out of range, a total kernel clamps the index into the dimension (wrapping negatives
    first) rather than fail; otherwise it is refused like torch refuses it.
    """
    if c.total:
        if negative:
            idx = select(idx < 0, idx + n, idx)
        return np.clip(idx, 0, max(n - 1, 0)) if idx.size else idx
    low = -n if negative else 0
    if idx.size and (idx.min() < low or idx.max() >= n):
        raise c.eval_error(f"index out of range for a dimension of size {n}", arg)
    return idx


def _gather_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    idx = _check_index_dtype(c, 1)
    d = c.dim(c.attr("dim"), x.ndim)
    if max(idx.ndim, 1) != max(x.ndim, 1):
        raise c.fail("index must have as many dims as the input", 1)
    for j, (a, b) in enumerate(zip(idx.shape, x.shape, strict=False)):
        if j != d and a > b:
            raise c.fail(f"index size {a} exceeds input size {b} at dim {j}", 1)
    return TensorMeta(idx.shape, x.dtype)


def _grid(shape: tuple[int, ...], dim: int, idx: Array) -> tuple[Array, ...]:
    g = list(np.ogrid[tuple(slice(0, s) for s in shape)])
    g[dim] = idx
    return tuple(g)


@prim("gather", privacy="rule", args=2, attrs={"dim": AttrSpec("int")}, infer=_gather_infer)
def _gather(c: Call, args: list[Any], out: Array | None) -> Array:
    """out[i][j] = x[index[i][j]][j] (for dim 0)."""
    x, idx = args
    if x.ndim == 0:
        idx = _in_range(c, idx, 1, 1)
        return np.broadcast_to(x, idx.shape).copy()
    d = c.attr("dim") % x.ndim
    idx = _in_range(c, idx, x.shape[d], 1)
    return np.asarray(x[_grid(idx.shape, d, idx)])


def _index_select_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    idx = _check_index_dtype(c, 1)
    if idx.ndim > 1:
        raise c.fail("index must be 0-d or 1-d", 1)
    d = c.dim(c.attr("dim"), x.ndim)
    if x.ndim == 0:
        return TensorMeta((), x.dtype)
    return TensorMeta((*x.shape[:d], idx.numel, *x.shape[d + 1 :]), x.dtype)


@prim(
    "index_select",
    privacy="rule",
    args=2,
    attrs={"dim": AttrSpec("int")},
    infer=_index_select_infer,
)
def _index_select(c: Call, args: list[Any], out: Array | None) -> Array:
    """Select entries of ``index`` along ``dim``."""
    x, idx = args
    if x.ndim == 0:
        idx = _in_range(c, idx, 1, 1)
        return np.array(x, copy=True)
    d = c.attr("dim") % x.ndim
    idx = _in_range(c, idx, x.shape[d], 1)
    return np.asarray(np.take(x, idx.reshape(-1), axis=d))


def _scatter_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    idx = _check_index_dtype(c, 1)
    d = c.dim(c.attr("dim"), x.ndim)
    src = c.args[2]
    if isinstance(src, TensorMeta):
        if src.dtype != x.dtype:
            raise c.fail(f"src dtype {src.dtype.name} must match self dtype {x.dtype.name}", 2)
        if any(a > b for a, b in zip(idx.shape, src.shape, strict=False)):
            raise c.fail("index is larger than src", 1)
    elif c.op == "scatter_add":
        raise c.fail("scatter_add needs a tensor src", 2)
    if max(idx.ndim, 1) != max(x.ndim, 1):
        raise c.fail("index must have as many dims as the input", 1)
    for j, (a, b) in enumerate(zip(idx.shape, x.shape, strict=False)):
        if j != d and a > b:
            raise c.fail(f"index size {a} exceeds input size {b} at dim {j}", 1)
    return x


def _scatter_kernel(c: Call, args: list[Any], out: Array | None) -> Array:
    x, idx, src = args
    r = np.array(x, copy=True)
    if idx.size == 0:
        return r
    shape = idx.shape
    if r.ndim == 0:
        idx = _in_range(c, idx, 1, 1)
        r2 = r.reshape(1)
        sv = as_np(src, c.out().dtype).reshape(-1)[: idx.size]
        if c.op == "scatter_add":
            np.add.at(r2, idx.reshape(-1), sv)
        else:
            r2[idx.reshape(-1)] = sv
        return r
    d = c.attr("dim") % r.ndim
    idx = _in_range(c, idx, r.shape[d], 1)
    if isinstance(src, np.ndarray):
        sv = src[tuple(slice(0, s) for s in shape)] if src.ndim else src
    else:
        sv = as_np(src, c.out().dtype)
    where = _grid(shape, d, idx)
    if c.op == "scatter_add":
        np.add.at(r, where, sv)
    else:
        r[where] = sv
    return r


prim(
    "scatter",
    privacy="public_only",
    args=3,
    attrs={"dim": AttrSpec("int")},
    infer=_scatter_infer,
    scalar_args=frozenset({2}),
)(_scatter_kernel)
prim(
    "scatter_add",
    privacy="public_only",
    args=3,
    attrs={"dim": AttrSpec("int")},
    infer=_scatter_infer,
)(_scatter_kernel)

_REDUCE = {"sum": np.add, "prod": np.multiply, "mean": np.add, "amax": np.fmax, "amin": np.fmin}


def _scatter_reduce_infer(c: Call) -> TensorMeta:
    x = _scatter_infer(c)
    if not isinstance(c.args[2], TensorMeta):
        raise c.fail("scatter_reduce needs a tensor src", 2)
    reduce = c.attr("reduce")
    if reduce not in _REDUCE:
        raise c.fail(f"reduce must be one of {sorted(_REDUCE)}, got {reduce!r}", "reduce")
    if reduce == "mean" and x.dtype.is_bool:
        raise c.fail("scatter_reduce mean is not implemented for bool (torch refuses it too)")
    return x


@prim(
    "scatter_reduce",
    privacy="public_only",
    args=3,
    attrs={
        "dim": AttrSpec("int"),
        "reduce": AttrSpec("str"),
        "include_self": AttrSpec("bool", optional=True, default=True),
    },
    infer=_scatter_reduce_infer,
)
def _scatter_reduce(c: Call, args: list[Any], out: Array | None) -> Array:
    """torch.scatter_reduce: sum, prod, mean, amax, amin of src into x at index along dim.

    Values are combined in index order (as torch's CPU loop does); amax/amin propagate
    NaN; ``include_self=False`` starts every written position from the reduction's
    identity; an integer mean rounds down, as torch does.
    """
    x, idx, src = args
    reduce = c.attr("reduce")
    out_np = c.out().dtype.np
    if x.dtype.kind == "V":  # bfloat16: computed in float32, rounded once at the end
        x, src = x.astype(np.float32), src.astype(np.float32)
    res = x.dtype
    r = np.array(x, copy=True).reshape(x.shape or (1,))
    if idx.size == 0:
        return r.reshape(x.shape).astype(out_np, copy=False)
    i2 = idx.reshape(idx.shape or (1,))
    d = c.attr("dim") % r.ndim
    i2 = _in_range(c, i2, r.shape[d], 1)
    s2 = src.reshape(src.shape or (1,))
    sv = s2[tuple(slice(0, n) for n in i2.shape)]
    where = _grid(i2.shape, d, i2)
    lin = np.ravel_multi_index(tuple(np.broadcast_to(w, i2.shape) for w in where), r.shape)
    lin = lin.reshape(-1)
    vals = sv.reshape(-1)
    include = bool(c.attrs.get("include_self", True))
    flat = r.reshape(-1)
    touched = np.zeros(flat.shape, dtype=bool)
    touched[lin] = True
    if not include:
        identity: Any = {"sum": 0, "mean": 0, "prod": 1}.get(reduce)
        if identity is None:  # amax/amin: the first value written
            first = np.full(flat.shape, -1, dtype=np.int64)
            first[lin[::-1]] = np.arange(len(lin))[::-1]
            flat[touched] = vals[first[touched]]
        else:
            flat[touched] = identity
    ufunc = _REDUCE[reduce]
    if reduce in ("amax", "amin") and res.kind == "f":
        # NaN wins, as in torch: fmax/fmin skip NaN, so put NaN back where any arrived
        nan = np.zeros(flat.shape, dtype=bool)
        np.logical_or.at(nan, lin, np.isnan(vals))
        nan |= np.isnan(flat)
        ufunc.at(flat, lin, vals)
        flat[nan] = np.nan
    elif reduce in ("amax", "amin"):
        (np.maximum if reduce == "amax" else np.minimum).at(flat, lin, vals)
    else:
        ufunc.at(flat, lin, vals)
    if reduce == "mean":
        count = np.zeros(flat.shape, dtype=np.int64)
        np.add.at(count, lin, 1)
        if include:
            count += 1
        safe = np.maximum(count, 1)
        if res.kind == "f":
            q = (flat / safe.astype(res)).astype(res)
        else:
            q = np.floor_divide(flat, safe.astype(res))
        flat[touched] = q[touched]
    return flat.reshape(x.shape).astype(out_np, copy=False)


def _index_put_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    v = c.args[1]
    if isinstance(v, TensorMeta) and v.dtype != x.dtype:
        raise c.fail(f"values dtype {v.dtype.name} must match self dtype {x.dtype.name}", 1)
    if isinstance(v, Scalar):
        raise c.fail("values must be a tensor", 1)
    idx = c.args[2:]
    if len(idx) > x.ndim:
        raise c.fail(f"too many indices ({len(idx)}) for a {x.ndim}-d tensor")
    if all(i is None for i in idx):
        raise c.fail("at least one index must be a tensor")
    for i, a in enumerate(idx, 2):
        if a is not None:
            _check_index_dtype(c, i, allow_bool=True)
    return x


@prim(
    "index_put",
    privacy="public_only",
    args=(3, None),
    attrs={"accumulate": AttrSpec("bool", optional=True, default=False)},
    infer=_index_put_infer,
    optional_args=frozenset(range(2, 64)),
)
def _index_put(c: Call, args: list[Any], out: Array | None) -> Array:
    """x[indices] = values (or += with accumulate); null indices stand for ':'."""
    x, values, *idx = args
    key: Any = tuple(slice(None) if i is None else i for i in idx)
    r = np.array(x, copy=True)
    try:
        if c.attrs.get("accumulate"):
            np.add.at(r, key, values)
        else:
            r[key] = values
    except (IndexError, ValueError) as e:
        raise c.eval_error(f"index_put failed: {e}") from None
    return r


def _index_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    idx = c.args[1:]
    if len(idx) > x.ndim:
        raise c.fail(f"too many indices ({len(idx)}) for a {x.ndim}-d tensor")
    metas: list[tuple[int, TensorMeta]] = []
    for i, a in enumerate(idx, 1):
        if a is None:
            continue
        t = _check_index_dtype(c, i)
        metas.append((i - 1, t))
    if not metas:
        raise c.fail("at least one index must be a tensor")
    bshape = broadcast(c, [t.shape for _, t in metas])
    dims = [d for d, _ in metas]
    rest = [s for d, s in enumerate(x.shape) if d not in dims]
    # NumPy's and torch's rule: indexed dims next to each other keep their place,
    # otherwise the broadcast index dims go first
    if dims == list(range(dims[0], dims[-1] + 1)):
        before = [s for d, s in enumerate(x.shape) if d < dims[0]]
        return TensorMeta((*before, *bshape, *rest[len(before) :]), x.dtype)
    return TensorMeta((*bshape, *rest), x.dtype)


@prim(
    "index",
    privacy="rule",
    args=(2, None),
    infer=_index_infer,
    optional_args=frozenset(range(1, 64)),
)
def _index(c: Call, args: list[Any], out: Array | None) -> Array:
    """x[idx1, idx2, ...] with integer index tensors (null stands for ':'), like aten.index."""
    x, *idx = args
    idx = [
        i if i is None else _in_range(c, i, x.shape[d], d + 1, negative=True)
        for d, i in enumerate(idx)
    ]
    key: Any = tuple(slice(None) if i is None else i for i in idx)
    return np.asarray(x[key])

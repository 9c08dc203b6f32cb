"""Indexing prims: gather, index_select, scatter, scatter_add, index_put and index.

Index ranges are checked here rather than left to NumPy, which would silently
wrap negative indices where torch raises. Index tensors are int64 (or int32);
index_put also takes bool masks, whose data-dependent count only affects the
values, never the output shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from node.engine.prims.elementwise import as_np
from node.engine.prims.registry import Array, AttrSpec, Call, Scalar, TensorMeta, broadcast, prim


def _check_index_dtype(c: Call, i: int, allow_bool: bool = False) -> TensorMeta:
    t = c.tensor(i)
    if not (t.dtype.name in ("int64", "int32") or (allow_bool and t.dtype.is_bool)):
        raise c.fail(f"index must be int64 (or int32), got {t.dtype.name}", i)
    return t


def _range_check(c: Call, idx: Array, n: int, arg: int) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise c.eval_error(f"index out of range for a dimension of size {n}", arg)


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


@prim("gather", args=2, attrs={"dim": AttrSpec("int")}, infer=_gather_infer)
def _gather(c: Call, args: list[Any], out: Array | None) -> Array:
    """out[i][j] = x[index[i][j]][j] (for dim 0)."""
    x, idx = args
    if x.ndim == 0:
        _range_check(c, idx, 1, 1)
        return np.broadcast_to(x, idx.shape).copy()
    d = c.attr("dim") % x.ndim
    _range_check(c, idx, x.shape[d], 1)
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


@prim("index_select", args=2, attrs={"dim": AttrSpec("int")}, infer=_index_select_infer)
def _index_select(c: Call, args: list[Any], out: Array | None) -> Array:
    """Select entries of ``index`` along ``dim``."""
    x, idx = args
    if x.ndim == 0:
        _range_check(c, idx, 1, 1)
        return np.array(x, copy=True)
    d = c.attr("dim") % x.ndim
    _range_check(c, idx, x.shape[d], 1)
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
        _range_check(c, idx, 1, 1)
        r2 = r.reshape(1)
        sv = as_np(src, c.out().dtype).reshape(-1)[: idx.size]
        if c.op == "scatter_add":
            np.add.at(r2, idx.reshape(-1), sv)
        else:
            r2[idx.reshape(-1)] = sv
        return r
    d = c.attr("dim") % r.ndim
    _range_check(c, idx, r.shape[d], 1)
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
    args=3,
    attrs={"dim": AttrSpec("int")},
    infer=_scatter_infer,
    scalar_args=frozenset({2}),
)(_scatter_kernel)
prim("scatter_add", args=3, attrs={"dim": AttrSpec("int")}, infer=_scatter_infer)(_scatter_kernel)


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


@prim("index", args=(2, None), infer=_index_infer, optional_args=frozenset(range(1, 64)))
def _index(c: Call, args: list[Any], out: Array | None) -> Array:
    """x[idx1, idx2, ...] with integer index tensors (null stands for ':'), like aten.index."""
    x, *idx = args
    for d, i in enumerate(idx):
        if i is not None:
            n = x.shape[d]
            if i.size and (i.min() < -n or i.max() >= n):
                raise c.eval_error(f"index out of range for dim {d} of size {n}", d + 1)
    key: Any = tuple(slice(None) if i is None else i for i in idx)
    return np.asarray(x[key])

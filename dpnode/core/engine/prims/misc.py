"""Sorting (argsort, topk, searchsorted, quantile), constants (full, arange) and the random
prim.

Sorting returns indices; the sorted values are ``gather(x, dim, indices)``,
which keeps every prim single-output. Sorts are always stable, and NaN sorts
as the largest value, as in torch. ``rand`` draws from the generator the
evaluator is given (the node's own), never from anything the client sends.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpnode.core.engine.constant_time import select
from dpnode.core.engine.dtypes import DTYPES, INT64, dtype
from dpnode.core.engine.prims.registry import Array, AttrSpec, Call, Scalar, TensorMeta, prim
from dpnode.core.engine.promotion import Kind, Operand, result_type, scalar_dtype


def _sort_flops(c: Call) -> int:
    x = c.tensor(0)
    return x.numel * max(int(math.log2(max(x.numel, 2))), 1) + 1


def _sort_workspace(c: Call) -> int:
    # argsort's int64 indices, their flipped copy, and a float32 copy of bfloat16
    x = c.tensor(0)
    return 3 * 8 * x.numel


def _argsort_along(x: Array, axis: int, descending: bool) -> Array:
    if x.dtype.kind == "V":  # bfloat16: float32 holds it exactly
        x = x.astype(np.float32)
    if not descending:
        return np.argsort(x, axis=axis, kind="stable")
    # descending and stable, NaN first: sort the reversed array ascending and map back
    n = x.shape[axis]
    rev = np.argsort(np.flip(x, axis=axis), axis=axis, kind="stable")
    return np.flip(n - 1 - rev, axis=axis)


def _argsort_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    c.dim(c.attr("dim"), x.ndim)
    return TensorMeta(x.shape, INT64)


@prim(
    "argsort",
    privacy="public_only",
    args=1,
    attrs={"dim": AttrSpec("int"), "descending": AttrSpec("bool", optional=True, default=False)},
    infer=_argsort_infer,
    flops=_sort_flops,
    workspace=_sort_workspace,
)
def _argsort(c: Call, args: list[Any], out: Array | None) -> Array:
    """Stable sort indices along ``dim`` (values: gather with them)."""
    (x,) = args
    if x.ndim == 0:
        return np.zeros((), dtype=np.int64)
    return _argsort_along(x, c.attr("dim") % x.ndim, bool(c.attrs.get("descending"))).astype(
        np.int64
    )


def _topk_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    if x.dtype.is_bool:
        raise c.fail("topk does not support bool (torch refuses it too)", 0)
    d = c.dim(c.attr("dim"), x.ndim)
    k = c.attr("k")
    n = x.shape[d] if x.ndim else 1
    if not 0 <= k <= n:
        raise c.fail(f"k={k} is out of range for a dimension of size {n}", "k")
    shape = (*x.shape[:d], k, *x.shape[d + 1 :]) if x.ndim else ()
    return TensorMeta(shape, INT64)


@prim(
    "topk",
    privacy="public_only",
    args=1,
    attrs={
        "k": AttrSpec("int"),
        "dim": AttrSpec("int", optional=True, default=-1),
        "largest": AttrSpec("bool", optional=True, default=True),
    },
    infer=_topk_infer,
    flops=_sort_flops,
    workspace=_sort_workspace,
)
def _topk(c: Call, args: list[Any], out: Array | None) -> Array:
    """Indices of the k largest (or smallest) along ``dim``, sorted; values via gather."""
    (x,) = args
    if x.ndim == 0:
        return np.zeros((), dtype=np.int64)
    d = c.attr("dim") % x.ndim
    largest = c.attrs.get("largest")
    idx = _argsort_along(x, d, bool(True if largest is None else largest))
    return np.ascontiguousarray(np.take(idx, np.arange(c.attr("k")), axis=d)).astype(np.int64)


_INTERPOLATIONS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile_infer(c: Call) -> TensorMeta:
    x, q = c.tensor(0), c.tensor(1)
    if x.dtype.is_bool:
        raise c.fail(f"quantile needs a real dtype, got {x.dtype.name}", 0)
    if not q.dtype.is_float:
        raise c.fail(f"the quantiles must be floating point, got {q.dtype.name}", 1)
    if q.ndim > 1:
        raise c.fail(f"the quantiles must be a scalar or 1-d, got {q.ndim} dims", 1)
    if x.numel == 0:
        raise c.fail("quantile of an empty tensor", 0)
    if c.attr("interpolation") not in _INTERPOLATIONS:
        raise c.fail(f"interpolation must be one of {', '.join(_INTERPOLATIONS)}", "interpolation")
    if not x.dtype.is_float and c.attr("interpolation") in ("linear", "midpoint"):
        raise c.fail("linear and midpoint interpolation need a floating-point input", 0)
    groups = c.attr("groups")
    has_index = len(c.args) > 2 and c.args[2] is not None
    if groups < 0 or groups > _MAX_GROUPS:
        raise c.fail(f"groups must be in [0, {_MAX_GROUPS}], got {groups}", "groups")
    if has_index != (groups > 0):
        raise c.fail("a group index (argument 2) goes with groups > 0, and only then", "groups")
    if has_index:
        index = c.tensor(2)
        if not index.dtype.is_int or index.numel != x.numel:
            raise c.fail(
                f"the group index must be integers, one per element ({x.numel}), got "
                f"{index.dtype.name} with {index.numel}",
                2,
            )
        return TensorMeta((groups, *q.shape), x.dtype)
    return TensorMeta(q.shape, x.dtype)


#: most groups a grouped quantile selects for
_MAX_GROUPS = 1000


@prim(
    "quantile",
    privacy="rule",
    args=(2, 3),
    optional_args=frozenset({2}),
    attrs={
        "interpolation": AttrSpec("str", optional=True, default="linear"),
        "ignore_nan": AttrSpec("bool", optional=True, default=False),
        "groups": AttrSpec("int", optional=True, default=0),
    },
    infer=_quantile_infer,
    flops=_sort_flops,
    workspace=_sort_workspace,
)
def _quantile(c: Call, args: list[Any], out: Array | None) -> Array:
    """The ``q`` quantiles of all of ``x``'s elements, as torch.quantile computes them
    (``ignore_nan``: torch.nanquantile; median is ``q = 0.5``, interpolation ``lower``);
    with ``groups`` G and a group index per element, those of each group's elements, one
    row per group (an empty group's are NaN; an index outside ``[0, G)`` is in none).

    On private data a quantile is only ever a publish's output, released by the exponential
    mechanism over the public range (``dpnode.core.dp.selection``): this kernel then never runs.
    """
    x, q = args[0], args[1]
    m = c.out()
    flat = np.asarray(x).reshape(-1)
    if flat.dtype.kind == "V":  # bfloat16: float32 holds it exactly
        flat = flat.astype(np.float32)
    qs = np.asarray(q).reshape(-1).astype(np.float64)
    if np.any((qs < 0) | (qs > 1) | np.isnan(qs)):
        raise c.eval_error("quantiles must be in [0, 1]", 1)
    compute: Any = m.dtype.np.type if m.dtype.name in ("float32", "float64") else np.float32
    how, skip = c.attr("interpolation"), bool(c.attr("ignore_nan"))
    groups = c.attr("groups")
    if not groups:
        return _quantiles_of(flat, qs, how, skip, compute).reshape(m.shape).astype(m.dtype.np)
    index = np.asarray(args[2]).reshape(-1)
    rows = [_quantiles_of(flat[index == g], qs, how, skip, compute) for g in range(groups)]
    return np.stack(rows).reshape(m.shape).astype(m.dtype.np)


def _quantiles_of(flat: Array, qs: Array, how: str, skip_nan: bool, compute: Any) -> Array:
    """torch.quantile's algorithm on one flat array, in float64 (NaN: all NaN)."""
    nan = np.isnan(flat) if flat.dtype.kind == "f" else np.zeros(flat.shape, dtype=bool)
    values = np.sort(flat[~nan])
    if values.size == 0 or (nan.any() and not skip_nan):
        return np.full(qs.shape, np.nan)
    ranks = qs.astype(compute) * compute(values.size - 1)
    if how == "lower":
        ranks = np.floor(ranks)
    elif how == "higher":
        ranks = np.ceil(ranks)
    elif how == "nearest":
        ranks = np.round(ranks)  # half to even, as torch's round
    below = np.minimum(ranks.astype(np.int64), values.size - 1)
    low = values[below]
    if how in ("linear", "midpoint"):
        above = np.minimum(np.ceil(ranks).astype(np.int64), values.size - 1)
        high = values[above].astype(compute)
        low = low.astype(compute)
        w = np.full_like(ranks, 0.5) if how == "midpoint" else ranks - below.astype(compute)
        # torch's lerp: from the nearer end
        low = select(w < 0.5, low + w * (high - low), high - (high - low) * (1 - w))
    return np.asarray(low, dtype=np.float64)


def _full_infer(c: Call) -> TensorMeta:
    d = dtype(c.attr("dtype"))
    v = c.attr("value")
    if not d.is_float and isinstance(v, float) and not (math.isfinite(v) and v.is_integer()):
        raise c.fail(f"value {v} does not fit dtype {d.name}", "value")
    return TensorMeta(tuple(c.attr("shape")), d)


@prim(
    "full",
    privacy="public_only",
    args=0,
    attrs={
        "shape": AttrSpec("shape"),
        "value": AttrSpec("float", nonfinite=True),
        "dtype": AttrSpec("dtype"),
    },
    infer=_full_infer,
)
def _full(c: Call, args: list[Any], out: Array | None) -> Array:
    """A tensor of ``shape`` filled with ``value``."""
    m = c.out()
    v = c.attr("value")
    if m.dtype.is_float:
        fill = np.asarray(v, dtype=m.dtype.np)
    else:  # integers wrap into narrow dtypes, as torch's fill does (uint8: -9 -> 247)
        fill = np.asarray(int(v), dtype=np.int64).astype(m.dtype.np)
    return np.full(m.shape, fill, dtype=m.dtype.np)


def _arange_count(c: Call) -> int:
    start, end, step = (c.attr(k) for k in ("start", "end", "step"))
    if step == 0:
        raise c.fail("step must be nonzero", "step")
    n = math.ceil((end - start) / step)
    if n < 0:
        raise c.fail(
            f"upper bound {end} and step {step} are inconsistent with start {start}", "end"
        )
    return int(n)


def _arange_infer(c: Call) -> TensorMeta:
    return TensorMeta((_arange_count(c),), dtype(c.attr("dtype")))


@prim(
    "arange",
    privacy="public_only",
    args=0,
    attrs={
        "start": AttrSpec("float"),
        "end": AttrSpec("float"),
        "step": AttrSpec("float"),
        "dtype": AttrSpec("dtype"),
    },
    infer=_arange_infer,
)
def _arange(c: Call, args: list[Any], out: Array | None) -> Array:
    """start + i * step for i < ceil((end - start) / step), like torch.arange."""
    m = c.out()
    start, step = c.attr("start"), c.attr("step")
    r = start + np.arange(m.shape[0], dtype=np.float64) * step
    if not m.dtype.is_float:
        r = np.floor(r) if all(float(v).is_integer() for v in (start, step)) else r
    return np.asarray(r.astype(m.dtype.np))


def _rand_infer(c: Call) -> TensorMeta:
    d = dtype(c.attr("dtype"))
    if not d.is_float:
        raise c.fail(f"rand needs a floating dtype, got {d.name}", "dtype")
    return TensorMeta(tuple(c.attr("shape")), d)


@prim(
    "rand",
    privacy="rule",
    args=0,
    attrs={"shape": AttrSpec("shape"), "dtype": AttrSpec("dtype")},
    infer=_rand_infer,
    random=True,
)
def _rand(c: Call, args: list[Any], out: Array | None) -> Array:
    """Uniform [0, 1) from the node's generator (dropout: lt(rand, 1 - p))."""
    if c.rng is None:
        raise c.eval_error("no random generator was given to the evaluator")
    m = c.out()
    if m.dtype.name in ("float32", "float64"):
        gen: Any = c.rng
        return np.asarray(gen.random(m.shape, dtype=m.dtype.np.type))
    r = c.rng.random(m.shape, dtype=np.float32).astype(m.dtype.np)
    # rounding to a low precision can reach 1.0; keep the half-open interval
    r[r >= 1] = 0
    return r


def _searchsorted_infer(c: Call) -> TensorMeta:
    seq = c.tensor(0)
    v = c.args[1]
    if seq.ndim == 0:
        raise c.fail("the sorted sequence needs at least one dimension", 0)
    if isinstance(v, TensorMeta):
        if seq.ndim > 1 and (v.ndim != seq.ndim or v.shape[:-1] != seq.shape[:-1]):
            raise c.fail(
                f"boundaries of shape {list(seq.shape)} need values with the same leading "
                f"dims, got {list(v.shape)}",
                1,
            )
        shape = v.shape
    elif seq.ndim > 1:
        raise c.fail("a scalar value needs a 1-d sorted sequence", 1)
    else:
        shape = ()
    if seq.dtype.is_bool or (isinstance(v, TensorMeta) and v.dtype.is_bool):
        raise c.fail("searchsorted is not implemented for bool (torch refuses it too)")
    return TensorMeta(shape, DTYPES["int32"] if c.attrs.get("out_int32") else INT64)


def _searchsorted_flops(c: Call) -> int:
    seq = c.tensor(0)
    return max(c.out().numel, 1) * (int(math.log2(max(seq.shape[-1], 1))) + 2)


@prim(
    "searchsorted",
    privacy="public_only",
    args=2,
    attrs={
        "right": AttrSpec("bool", optional=True, default=False),
        "out_int32": AttrSpec("bool", optional=True, default=False),
    },
    infer=_searchsorted_infer,
    flops=_searchsorted_flops,
    scalar_args=frozenset({1}),
)
def _searchsorted(c: Call, args: list[Any], out: Array | None) -> Array:
    """Insertion points of values into sorted rows (torch.searchsorted / bucketize).

    torch's own binary search, vectorized: the left bound moves right while
    ``not (row[mid] >= v)`` (``>`` with ``right``), so NaN values land past the end and
    NaN in the row behaves as torch's does.
    """
    seq, v = args
    ops = [Operand(c.tensor(0).dtype, Kind.TENSOR)]
    vm = c.args[1]
    if isinstance(vm, TensorMeta):
        ops.append(Operand(vm.dtype, Kind.ZERODIM if vm.ndim == 0 else Kind.TENSOR))
    else:
        assert isinstance(vm, Scalar)
        ops.append(Operand(scalar_dtype(vm.value), Kind.SCALAR))
    cd = result_type(ops)
    if cd.name == "bfloat16" or cd.is_low_precision:
        cd = DTYPES["float32"]
    s = np.asarray(seq).astype(cd.np, copy=False)
    vals = np.asarray(v).astype(cd.np, copy=False)
    n = s.shape[-1]
    if n == 0 or vals.size == 0:
        return np.zeros(c.out().shape, dtype=c.out().dtype.np)
    if s.ndim == 1:
        rows = np.broadcast_to(s, (*vals.shape, n)) if vals.ndim else s
        flat_rows = rows.reshape(-1, n)
    else:
        flat_rows = s.reshape(-1, n)
    flat_v = vals.reshape(-1)
    if s.ndim > 1:  # one row per leading index, shared by that row's values
        m = vals.shape[-1]
        row_of = np.repeat(np.arange(flat_rows.shape[0]), m)
    else:
        row_of = np.zeros(flat_v.shape, dtype=np.int64)
        flat_rows = s.reshape(1, n)
    start = np.zeros(flat_v.shape, dtype=np.int64)
    end = np.full(flat_v.shape, n, dtype=np.int64)
    right = bool(c.attrs.get("right"))
    with np.errstate(invalid="ignore"):
        # as many halvings as the longest search takes, whatever the values: a loop that
        # stopped once every search had would take a step less on some of them
        for _ in range(n.bit_length() + 1):
            active = start < end
            mid = (start + end) >> 1
            mv = flat_rows[row_of, np.minimum(mid, n - 1)]
            go_right = ~(mv > flat_v) if right else ~(mv >= flat_v)
            start = select(active & go_right, mid + 1, start)
            end = select(active & ~go_right, mid, end)
    return start.reshape(c.out().shape).astype(c.out().dtype.np)

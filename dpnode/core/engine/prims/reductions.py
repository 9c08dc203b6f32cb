"""Reductions (sum, prod, mean, amax, amin, argmax, argmin, any, all) and cumsum.

torch's rules: sum/prod/cumsum of bool or int give int64; float16/bfloat16
accumulate in float32 and round once; mean refuses integers; amax/amin
propagate NaN and refuse an empty reduction; any/all give bool, except uint8
which stays uint8 (a torch legacy that we reproduce).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpnode.core.engine.accurate import blocked_sum
from dpnode.core.engine.constant_time import select
from dpnode.core.engine.dtypes import BOOL, DTYPES, INT64, DType, accumulation, dtype, opmath
from dpnode.core.engine.prims.registry import Array, AttrSpec, Call, Privacy, TensorMeta, prim

_DIMS = {
    "dims": AttrSpec("ints", optional=True),
    "keepdim": AttrSpec("bool", optional=True, default=False),
}
_DIM = {
    "dim": AttrSpec("int", optional=True),
    "keepdim": AttrSpec("bool", optional=True, default=False),
}


def _dims(c: Call, x: TensorMeta) -> tuple[int, ...]:
    dims = c.attrs.get("dims")
    if dims is None or len(dims) == 0:
        # torch: an empty dim list reduces everything
        return tuple(range(x.ndim))
    out = tuple(c.dim(d, x.ndim, "dims") for d in dims)
    if len(set(out)) != len(out):
        raise c.fail(f"dim list {list(dims)} repeats a dim", "dims")
    return out


def _reduced(c: Call, x: TensorMeta, dims: tuple[int, ...]) -> tuple[int, ...]:
    if c.attrs.get("keepdim"):
        return tuple(1 if i in dims else s for i, s in enumerate(x.shape))
    return tuple(s for i, s in enumerate(x.shape) if i not in dims)


def _flops_in(c: Call) -> int:
    x = c.args[0]
    assert isinstance(x, TensorMeta)
    return max(x.numel, 1)


def _reduction(name: str, rule: str, *, privacy: Privacy) -> None:
    def infer(c: Call) -> TensorMeta:
        x = c.tensor(0)
        dims = _dims(c, x)
        d = x.dtype
        if rule == "accumulate":
            forced = c.attrs.get("dtype")
            d = dtype(forced) if forced is not None else (INT64 if not d.is_float else d)
        elif rule == "mean":
            if not d.is_float:
                raise c.fail(
                    "mean could not infer output dtype: input dtype must be floating "
                    f"point, got {d.name}",
                    0,
                )
        elif rule == "extreme":
            if x.ndim and any(x.shape[i] == 0 for i in dims):
                raise c.fail(f"{name} over an empty dimension has no identity", 0)
        elif rule == "logical":
            d = DTYPES["uint8"] if d.name == "uint8" else BOOL
        return TensorMeta(_reduced(c, x, dims), d)

    def kernel(c: Call, args: list[Any], out: Array | None) -> Array:
        (x,) = args
        meta = c.args[0]
        assert isinstance(meta, TensorMeta)
        dims = _dims(c, meta)
        keep = bool(c.attrs.get("keepdim"))
        res = c.out().dtype
        ax = dims if meta.ndim else None
        if rule in ("accumulate", "mean"):
            acc: DType = accumulation(res, c.accurate)
            if c.accurate and res.is_float and name != "prod":
                axes = dims if meta.ndim else ()
                r = blocked_sum(x, axes, acc.np, keep)
                if name == "mean":
                    r = r / math.prod(meta.shape[d] for d in axes)
            else:
                fn: Any = {"sum": np.sum, "prod": np.prod, "mean": np.mean}[name]
                r = fn(x, axis=ax, dtype=acc.np, keepdims=keep)
        elif rule == "extreme":
            src = x.astype(np.float32) if x.dtype.kind == "V" else x
            r = (np.max if name == "amax" else np.min)(src, axis=ax, keepdims=keep)
        else:
            r = (np.any if name == "any" else np.all)(x, axis=ax, keepdims=keep)
        return np.asarray(r).astype(res.np, copy=False)

    attrs = {**_DIMS, "dtype": AttrSpec("dtype", optional=True)} if rule == "accumulate" else _DIMS
    prim(
        name,
        privacy=privacy,
        args=1,
        attrs=attrs,
        infer=infer,
        flops=_flops_in,
        doc=f"{name} over dims ({rule})",
    )(kernel)


for _n, _r in {
    "sum": "accumulate",
    "mean": "mean",
    "amax": "extreme",
    "amin": "extreme",
    "any": "logical",
    "all": "logical",
}.items():
    _reduction(_n, _r, privacy="rule")
_reduction("prod", "accumulate", privacy="public_only")


def _arg_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    if x.dtype.is_bool:
        raise c.fail(f"{c.op} does not support bool input (torch refuses it)", 0)
    dim = c.attrs.get("dim")
    if dim is None:
        if x.numel == 0:
            raise c.fail(f"{c.op} of an empty tensor needs a dim", 0)
        shape: tuple[int, ...] = tuple(1 for _ in x.shape) if c.attrs.get("keepdim") else ()
        return TensorMeta(shape, INT64)
    d = c.dim(dim, x.ndim)
    if x.ndim and x.shape[d] == 0:
        raise c.fail(f"{c.op} over an empty dimension", "dim")
    return TensorMeta(_reduced(c, x, (d,) if x.ndim else ()), INT64)


def _arg_kernel(c: Call, args: list[Any], out: Array | None) -> Array:
    (x,) = args
    if x.dtype.kind == "V":
        x = x.astype(np.float32)
    fn = np.argmax if c.op == "argmax" else np.argmin
    dim = c.attrs.get("dim")
    keep = bool(c.attrs.get("keepdim"))
    if dim is None or x.ndim == 0:
        r = fn(x.reshape(-1))
        return np.asarray(r, dtype=np.int64).reshape(c.out().shape)
    return np.asarray(fn(x, axis=dim, keepdims=keep)).astype(np.int64, copy=False)


prim("argmax", privacy="rule", args=1, attrs=_DIM, infer=_arg_infer, flops=_flops_in)(_arg_kernel)
prim("argmin", privacy="rule", args=1, attrs=_DIM, infer=_arg_infer, flops=_flops_in)(_arg_kernel)


def _cumsum_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    c.dim(c.attr("dim"), x.ndim)
    forced = c.attrs.get("dtype")
    if forced is not None:
        return TensorMeta(x.shape, dtype(forced))
    return TensorMeta(x.shape, x.dtype if x.dtype.is_float else INT64)


@prim(
    "cumsum",
    privacy="public_only",
    args=1,
    attrs={"dim": AttrSpec("int"), "dtype": AttrSpec("dtype", optional=True)},
    infer=_cumsum_infer,
)
def _cumsum(c: Call, args: list[Any], out: Array | None) -> Array:
    """Inclusive cumulative sum along ``dim``; bool/int accumulate in int64."""
    (x,) = args
    res = c.out().dtype
    if x.ndim == 0:
        return np.asarray(x).astype(res.np)
    r = np.cumsum(x, axis=c.attr("dim"), dtype=opmath(res).np)
    return np.asarray(r).astype(res.np, copy=False)


def _scan_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    c.dim(c.attr("dim"), x.ndim)
    if c.op == "logcumsumexp":
        if not x.dtype.is_float:
            raise c.fail(f"logcumsumexp needs a floating tensor, got {x.dtype.name}", 0)
        return TensorMeta(x.shape, x.dtype)
    return TensorMeta(x.shape, INT64)


@prim("cumargmax", privacy="public_only", args=1, attrs={"dim": AttrSpec("int")}, infer=_scan_infer)
def _cumargmax(c: Call, args: list[Any], out: Array | None) -> Array:
    """Index of the running maximum along ``dim`` (values: gather with it), like cummax.

    torch's rule: a value equal to the running maximum, or a NaN, takes over, so ties
    give the latest index and the latest NaN wins.
    """
    return _cumarg(c, args[0], np.fmax)


@prim("cumargmin", privacy="public_only", args=1, attrs={"dim": AttrSpec("int")}, infer=_scan_infer)
def _cumargmin(c: Call, args: list[Any], out: Array | None) -> Array:
    """Index of the running minimum along ``dim``, like cummin (ties: latest index)."""
    return _cumarg(c, args[0], np.fmin)


def _cumarg(c: Call, x: Array, fn: Any) -> Array:
    if x.ndim == 0:
        return np.zeros((), dtype=np.int64)
    if x.dtype.kind == "V":
        x = x.astype(np.float32)
    d = c.attr("dim") % x.ndim
    if x.shape[d] == 0:
        return np.zeros(x.shape, dtype=np.int64)
    if x.dtype.kind == "f":
        nan = np.isnan(x)
        # the running extreme ignoring NaN; NaN positions take over on their own
        run = fn.accumulate(x, axis=d)
        take = nan | (x == run)
        seen_nan = np.logical_or.accumulate(nan, axis=d)
        take &= ~seen_nan | nan  # after a NaN only a later NaN takes over
    else:
        run = fn.accumulate(x, axis=d)
        take = x == run
    shape = [1] * x.ndim
    shape[d] = x.shape[d]
    pos = np.arange(x.shape[d], dtype=np.int64).reshape(shape)
    return np.asarray(np.maximum.accumulate(select(take, pos, 0), axis=d), dtype=np.int64)


@prim(
    "logcumsumexp", privacy="public_only", args=1, attrs={"dim": AttrSpec("int")}, infer=_scan_infer
)
def _logcumsumexp(c: Call, args: list[Any], out: Array | None) -> Array:
    """log(cumsum(exp(x))) along ``dim``, accumulated in float64 as torch's CPU kernel does."""
    (x,) = args
    res = c.out().dtype
    if x.ndim == 0:
        return np.array(x, copy=True)
    acc = np.asarray(x, dtype=np.float64)
    with np.errstate(all="ignore"):
        r = np.logaddexp.accumulate(acc, axis=c.attr("dim") % x.ndim)
    return np.asarray(r).astype(res.np)

"""torch's type promotion, reproduced without torch.

torch promotes in three groups, most important first: tensors with at least one
dimension, 0-dim tensors, and Python scalars ("wrapped numbers"). Within a
group dtypes combine with :func:`promote_types`; a lower group only matters
when its *category* (bool < int < float) is higher than the groups above it.
A Python float then contributes the default dtype (float32), a Python int
int64 and a bool bool; a 0-dim tensor contributes its own dtype. This is
``at::native::ResultTypeState`` in c10, minus complex (which dpnode refuses).

NumPy 2 (NEP 50) gets the scalar rule right but not the 0-dim rule nor
int64 + float32 (NumPy says float64), hence this module.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from node.engine.dtypes import BOOL, DEFAULT_FLOAT, DTYPES, INT64, DType

__all__ = ["Kind", "Operand", "promote_types", "result_type", "scalar_dtype"]


class Kind(enum.Enum):
    """How an operand takes part in promotion."""

    TENSOR = "tensor"  # at least one dimension
    ZERODIM = "zerodim"  # a 0-dim tensor
    SCALAR = "scalar"  # an inline Python bool/int/float


@dataclass(frozen=True)
class Operand:
    """A dtype and how it takes part in promotion."""

    dtype: DType
    kind: Kind


def promote_types(a: DType, b: DType) -> DType:
    """torch.promote_types for the supported dtypes.

    >>> f = lambda x, y: promote_types(DTYPES[x], DTYPES[y]).name
    >>> f("int64", "float32"), f("uint8", "int8"), f("float16", "bfloat16")
    ('float32', 'int16', 'float32')
    >>> f("bool", "uint8"), f("int32", "float16")
    ('uint8', 'float16')
    """
    if a == b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_int and b.is_int:
        # NumPy and torch agree on the small signed/unsigned lattice.
        return _by_np(np.promote_types(a.np, b.np))
    if a.is_int:
        return b
    if b.is_int:
        return a
    if {a.name, b.name} == {"float16", "bfloat16"}:
        return DTYPES["float32"]
    return a if a.itemsize > b.itemsize else b


def _by_np(npd: np.dtype[np.generic]) -> DType:
    for d in DTYPES.values():
        if d.np == npd:
            return d
    raise AssertionError(f"no dtype for {npd}")  # pragma: no cover - lattice is closed


def scalar_dtype(value: bool | int | float) -> DType:
    """The dtype a Python scalar stands for when it is a wrapped number.

    >>> scalar_dtype(True).name, scalar_dtype(3).name, scalar_dtype(0.5).name
    ('bool', 'int64', 'float32')
    """
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return INT64
    return DEFAULT_FLOAT


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    """c10's combine_categories without complex."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_float:
        return higher
    if higher.is_bool or lower.is_float:
        return promote_types(higher, lower)
    return higher


def result_type(operands: Iterable[Operand]) -> DType:
    """The dtype torch gives an elementwise op over ``operands``.

    >>> T, Z, S = Kind.TENSOR, Kind.ZERODIM, Kind.SCALAR
    >>> op = lambda n, k: Operand(DTYPES[n], k)
    >>> result_type([op("int64", T), op("float32", T)]).name
    'float32'
    >>> result_type([op("float16", T), op("float64", Z)]).name
    'float16'
    >>> result_type([op("int32", T), op("float32", S)]).name
    'float32'
    >>> result_type([op("int8", T), op("int64", Z)]).name
    'int8'
    >>> result_type([op("bool", T), op("float64", Z)]).name
    'float64'
    """
    tensor: DType | None = None
    zerodim: DType | None = None
    scalar: DType | None = None
    for o in operands:  # plain locals: this runs for every elementwise node planned
        if o.kind is Kind.TENSOR:
            tensor = o.dtype if tensor is None else promote_types(tensor, o.dtype)
        elif o.kind is Kind.ZERODIM:
            zerodim = o.dtype if zerodim is None else promote_types(zerodim, o.dtype)
        else:
            scalar = o.dtype if scalar is None else promote_types(scalar, o.dtype)
    out = _combine(tensor, _combine(zerodim, scalar))
    if out is None:
        raise ValueError("result_type needs at least one operand")
    return out

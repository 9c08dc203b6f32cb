"""The dtype table of the prim vocabulary: names, categories and NumPy storage.

Dtypes travel on the wire as torch-style names (``"float32"``, ``"bool"``, ...).
NumPy has no bfloat16, so it is stored with ``ml_dtypes.bfloat16``. Complex
dtypes and the wide unsigned integers (uint16/32/64, which torch only half
supports) are refused with :class:`~node.errors.UnsupportedDTypeError`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from node.errors import UnsupportedDTypeError

__all__ = [
    "BOOL",
    "DTYPES",
    "FLOAT32",
    "INT64",
    "Category",
    "DType",
    "accumulation",
    "dtype",
    "from_numpy",
    "opmath",
]


class Category(enum.IntEnum):
    """Promotion category, ordered as torch orders them."""

    BOOL = 0
    INT = 1
    FLOAT = 2


@dataclass(frozen=True)
class DType:
    """One supported dtype: its wire name, category and NumPy storage dtype."""

    name: str
    np: np.dtype[np.generic]
    category: Category

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return int(self.np.itemsize)

    @property
    def is_float(self) -> bool:
        return self.category is Category.FLOAT

    @property
    def is_int(self) -> bool:
        return self.category is Category.INT

    @property
    def is_bool(self) -> bool:
        return self.category is Category.BOOL

    @property
    def is_low_precision(self) -> bool:
        """float16 and bfloat16, which torch computes in float32 ("opmath")."""
        return self.name in ("float16", "bfloat16")

    def __repr__(self) -> str:
        return self.name


def _make(name: str, npd: object, cat: Category) -> DType:
    return DType(name, np.dtype(npd), cat)  # type: ignore[call-overload]


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        _make("bool", np.bool_, Category.BOOL),
        _make("uint8", np.uint8, Category.INT),
        _make("int8", np.int8, Category.INT),
        _make("int16", np.int16, Category.INT),
        _make("int32", np.int32, Category.INT),
        _make("int64", np.int64, Category.INT),
        _make("float16", np.float16, Category.FLOAT),
        _make("bfloat16", ml_dtypes.bfloat16, Category.FLOAT),
        _make("float32", np.float32, Category.FLOAT),
        _make("float64", np.float64, Category.FLOAT),
    )
}

BOOL = DTYPES["bool"]
INT64 = DTYPES["int64"]
FLOAT32 = DTYPES["float32"]
#: torch's default floating dtype, the result of int true division and of
#: float-only functions on integers.
DEFAULT_FLOAT = FLOAT32

_REFUSED = {
    "complex64": "complex dtypes are not supported by the prim vocabulary",
    "complex128": "complex dtypes are not supported by the prim vocabulary",
    "complex32": "complex dtypes are not supported by the prim vocabulary",
    "uint16": "uint16 is not supported (torch supports it only partially)",
    "uint32": "uint32 is not supported (torch supports it only partially)",
    "uint64": "uint64 is not supported (torch supports it only partially)",
}

_BY_NUMPY: dict[np.dtype[np.generic], DType] = {d.np: d for d in DTYPES.values()}


def dtype(name: str) -> DType:
    """Look up a dtype by its wire name.

    >>> dtype("float32").category
    <Category.FLOAT: 2>

    Raises:
        UnsupportedDTypeError: unknown or refused names (complex, uint16...).
    """
    if not isinstance(name, str):
        raise UnsupportedDTypeError(f"dtype must be a string name, got {type(name).__name__}")
    d = DTYPES.get(name)
    if d is None:
        reason = _REFUSED.get(name, "unknown dtype")
        raise UnsupportedDTypeError(f"dtype {name!r}: {reason}; supported: {', '.join(DTYPES)}")
    return d


def from_numpy(npd: np.dtype[np.generic]) -> DType:
    """The supported dtype that stores as ``npd``.

    >>> from_numpy(np.dtype("int64")).name
    'int64'
    """
    d = _BY_NUMPY.get(np.dtype(npd))
    if d is None:
        raise UnsupportedDTypeError(f"NumPy dtype {npd} is not supported")
    return d


def accumulation(d: DType, accurate: bool) -> DType:
    """The dtype sums and matrix products of ``d`` accumulate in.

    torch's ``opmath`` by default; float64 for every float when ``accurate`` (the
    evaluations the privacy tracker bounds: a float32 sum of many rows would otherwise
    carry a rounding error far larger than one subject's contribution).

    >>> accumulation(dtype("float32"), False).name, accumulation(dtype("float32"), True).name
    ('float32', 'float64')
    """
    return DTYPES["float64"] if accurate and d.is_float else opmath(d)


def opmath(d: DType) -> DType:
    """The dtype torch computes ``d`` in: float32 for float16/bfloat16.

    >>> opmath(dtype("bfloat16")).name
    'float32'
    """
    return FLOAT32 if d.is_low_precision else d

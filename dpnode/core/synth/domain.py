"""The synthesizer's domain, from public metadata only: one finite attribute per column.

A categorical column is its public categories; a boolean column its two values; an integer
column with few values in its declared bounds one value per bin; any other numeric column
``bins`` equal-width bins over its declared bounds (the number from public sizes, or given by
the caller). Nothing here looks at a private value to choose a bin: the domain, and with it
every marginal's size and the noise, is the same on every neighbouring dataset.

Values go into bins (:func:`encode`) and come back out of them (:func:`decode`), uniformly
within a bin and inside the bounds (integers for integer columns): post-processing of the
synthetic codes, with a seeded generator that never touches a private value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dpnode.core.errors import InvalidRequestError

__all__ = [
    "DEFAULT_BINS",
    "Attribute",
    "ColumnFacts",
    "decode",
    "default_bins",
    "domain_of",
    "encode",
]

#: The most bins a numeric column gets unless the caller asks for others.
DEFAULT_BINS = 32
#: The most bins a caller may ask for (a marginal of two such columns has 2^20 cells).
MAX_BINS = 1024


@dataclass(frozen=True)
class ColumnFacts:
    """A column's public metadata, as the node declares it."""

    name: str
    dtype: str
    row_shape: tuple[int, ...]
    lower: float
    upper: float
    categories: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Attribute:
    """One column as a finite attribute of ``size`` values.

    Attributes:
        name: the column's name.
        dtype: the column's stored dtype (what :func:`decode` returns).
        size: how many values (bins) it has.
        lower, upper: the declared bounds.
        width: a numeric bin's width (``None``: one value per bin, ``lower + index``).
    """

    name: str
    dtype: str
    size: int
    lower: float
    upper: float
    width: float | None

    @property
    def integral(self) -> bool:
        return np.dtype(self.dtype).kind in "iub"


def _span(attribute: Attribute) -> int | None:
    """How many integers a binned integer attribute spans, when its bins' arithmetic is exact
    in int64 (``None``: not a binned integer attribute, or one too wide for that)."""
    if attribute.width is None or not attribute.integral:
        return None
    span = int(attribute.upper - attribute.lower) + 1
    limit = 2**62 // attribute.size
    fits = span < limit and abs(attribute.lower) < 2**62 and abs(attribute.upper) < 2**62
    return span if fits else None


def default_bins(rows: int) -> int:
    """Bins for a numeric column of a table of ``rows`` rows (public): about a bin per
    ``sqrt(rows)`` rows, between 4 and :data:`DEFAULT_BINS`.

    >>> default_bins(100), default_bins(10_000), default_bins(10**7)
    (10, 32, 32)
    """
    return max(4, min(DEFAULT_BINS, math.isqrt(max(rows, 0))))


def _attribute(facts: ColumnFacts, bins: int) -> Attribute:
    if facts.row_shape:
        raise InvalidRequestError(
            f"column {facts.name!r} holds a {list(facts.row_shape)} array per row; a "
            "synthetic table has one value per cell: leave it out with columns=[...]"
        )
    if facts.categories is not None:
        size = len(facts.categories)
        return Attribute(facts.name, facts.dtype, size, 0.0, size - 1.0, None)
    lower, upper = facts.lower, facts.upper
    if not (math.isfinite(lower) and math.isfinite(upper)):
        raise InvalidRequestError(
            f"column {facts.name!r} has unbounded declared bounds [{lower}, {upper}]: its "
            "bins need finite ones; leave it out with columns=[...]"
        )
    kind = np.dtype(facts.dtype).kind
    if kind == "b":
        return Attribute(facts.name, facts.dtype, 2, 0.0, 1.0, None)
    if kind in "iu":
        low, high = math.ceil(lower), math.floor(upper)
        if high - low + 1 <= bins:  # one bin per integer value
            return Attribute(facts.name, facts.dtype, max(1, high - low + 1), low, high, None)
        return Attribute(facts.name, facts.dtype, bins, low, high, (high - low + 1) / bins)
    if upper == lower:
        return Attribute(facts.name, facts.dtype, 1, lower, upper, None)
    return Attribute(facts.name, facts.dtype, bins, lower, upper, (upper - lower) / bins)


def domain_of(
    columns: Sequence[ColumnFacts], rows: int, bins: Mapping[str, int] | None = None
) -> tuple[Attribute, ...]:
    """The attributes of ``columns`` (public metadata), numeric ones binned.

    Raises:
        InvalidRequestError: a column without finite bounds or with a per-row array, a bin
            count outside [1, MAX_BINS], or ``bins`` naming a column that is not there.

    >>> age = ColumnFacts("age", "int64", (), 0.0, 120.0)
    >>> [(a.name, a.size) for a in domain_of([age], 100)]
    [('age', 10)]
    >>> [(a.name, a.size) for a in domain_of([age], 100, {"age": 121})]
    [('age', 121)]
    """
    asked = dict(bins or {})
    unknown = sorted(set(asked) - {c.name for c in columns})
    if unknown:
        raise InvalidRequestError(
            f"bins= names {unknown}, which are not columns of the synthesized table"
        )
    out = []
    for facts in columns:
        count = asked.get(facts.name, default_bins(rows))
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_BINS:
            raise InvalidRequestError(
                f"bins for column {facts.name!r} must be a whole number in [1, {MAX_BINS}], "
                f"got {count!r}"
            )
        out.append(_attribute(facts, count))
    return tuple(out)


def encode(attribute: Attribute, values: npt.NDArray[np.generic]) -> npt.NDArray[np.int64]:
    """Each value's bin, in ``[0, size)`` (values are inside the declared bounds: the node
    clamped or refused the others at upload, and NaN has no bin but the first).

    >>> a = Attribute("x", "float64", 4, 0.0, 1.0, 0.25)
    >>> encode(a, np.array([0.0, 0.3, 0.99, 1.0])).tolist()
    [0, 1, 3, 3]
    """
    span = _span(attribute)
    if span is not None:  # integers: exact, so that a decoded value comes back to its bin
        shifted = np.asarray(values, dtype=np.int64) - np.int64(attribute.lower)
        bins: npt.NDArray[np.int64] = np.clip(
            shifted * attribute.size // span, 0, attribute.size - 1
        )
        return bins
    x = np.asarray(values, dtype=np.float64)
    if attribute.width is None:
        index = x - attribute.lower
    else:
        index = np.floor((x - attribute.lower) / attribute.width)
    index = np.nan_to_num(index, nan=0.0, posinf=attribute.size - 1, neginf=0.0)
    return np.clip(index, 0, attribute.size - 1).astype(np.int64)


def decode(
    attribute: Attribute, codes: npt.NDArray[np.int64], rng: np.random.Generator
) -> npt.NDArray[np.generic]:
    """Values for bins: a bin's value itself, or a uniform draw within a numeric bin (an
    integer one for integer columns), always inside the declared bounds.

    >>> a = Attribute("x", "int64", 4, 0.0, 99.0, 25.0)
    >>> v = decode(a, np.array([0, 3, 3]), np.random.default_rng(0))
    >>> bool(v[0] < 25 and v[1] >= 75 and v.max() <= 99), v.dtype.name
    (True, 'int64')
    """
    c = np.asarray(codes, dtype=np.int64)
    span = _span(attribute)
    if span is not None:  # the integers k with c <= k * size / span < c + 1, uniformly
        first = -(-c * span // attribute.size)
        after = -(-(c + 1) * span // attribute.size)
        picked = first + np.floor(rng.random(c.size) * (after - first)).astype(np.int64)
        values = attribute.lower + np.minimum(picked, after - 1).astype(np.float64)
        return np.clip(values, attribute.lower, attribute.upper).astype(np.dtype(attribute.dtype))
    if attribute.width is None:
        values = attribute.lower + c.astype(np.float64)
    else:
        u = rng.random(c.size)
        values = attribute.lower + (c + u) * attribute.width
        if attribute.integral:
            values = np.floor(values)
        values = np.clip(values, attribute.lower, attribute.upper)
    return values.astype(np.dtype(attribute.dtype))

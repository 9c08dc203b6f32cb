"""Accurate accumulation for tracked evaluations: float64, in blocks of ``BLOCK`` terms.

However a float sum of ``n`` terms is ordered, its result is within ``gamma(h) * sum |x|``
of the exact sum, ``h`` being the most roundings any one term goes through (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 4.2). Added in one
pass, ``h`` can be ``n``; added in blocks whose sums are then added, ``h`` is at most
:func:`depth` ``(n) = BLOCK + ceil(n / BLOCK) + 1``: about 3,000 instead of a million for a
million rows. The privacy tracker charges exactly this bound, so it depends on no
library's internal order (:mod:`dpnode.core.privacy.rounding`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BLOCK", "block_sums", "blocked_sum", "depth", "rows_last", "total"]

Array = npt.NDArray[Any]

#: terms summed together before their sums are added
BLOCK = 2048


def depth(n: int) -> int:
    """The most roundings one term of an accurate sum of ``n`` terms goes through.

    >>> depth(10), depth(1_000_000)
    (10, 2538)
    """
    return n if n <= BLOCK else BLOCK + -(-n // BLOCK) + 1


def rows_last(x: Array, axes: tuple[int, ...]) -> Array:
    """``x`` with the kept axes first and the summed ``axes`` flattened last, in their order."""
    n = math.prod(x.shape[a] for a in axes)
    kept = [d for d in range(x.ndim) if d not in axes]
    y = np.moveaxis(x, axes, range(len(kept), x.ndim))
    return y.reshape([x.shape[d] for d in kept] + [n])


def block_sums(y: Array, acc: np.dtype[Any]) -> Array:
    """The sum of each run of ``BLOCK`` terms along ``y``'s last axis, whose length is a
    multiple of ``BLOCK``: shape ``(..., len // BLOCK)``."""
    m = y.shape[-1]
    return np.asarray(np.sum(y.reshape((*y.shape[:-1], m // BLOCK, BLOCK)), axis=-1, dtype=acc))


def total(sums: Array, tail: Array | None, acc: np.dtype[Any]) -> Array:
    """The sum of the block ``sums`` (last axis), plus the ``tail`` of fewer than ``BLOCK``
    terms: the last two steps of :func:`blocked_sum`."""
    # C order whatever the layout ``sums`` came in, so that the order of the additions
    # depends on the shapes alone
    out = np.sum(np.ascontiguousarray(sums), axis=-1, dtype=acc)
    return np.asarray(out if tail is None else out + tail)


def blocked_sum(x: Array, axes: tuple[int, ...], acc: np.dtype[Any], keepdims: bool) -> Array:
    """``x.sum(axis=axes, dtype=acc)`` whose every term goes through ``depth(n)`` roundings.

    Evaluated on the rows of ``x`` in several pieces (``dpnode.core.engine.blocks``), whose starts
    are multiples of ``BLOCK``, the same blocks are summed the same way.
    """
    n = math.prod(x.shape[a] for a in axes)
    if n <= BLOCK:
        return np.asarray(np.sum(x, axis=axes, dtype=acc, keepdims=keepdims))
    y = rows_last(x, axes)
    m = n - n % BLOCK
    tail = np.sum(y[..., m:], axis=-1, dtype=acc) if m < n else None
    out = total(block_sums(y[..., :m], acc), tail, acc)
    if keepdims:
        out = np.reshape(out, [1 if d in axes else s for d, s in enumerate(x.shape)])
    return np.asarray(out)

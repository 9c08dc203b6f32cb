"""Accurate accumulation for tracked evaluations: float64, in blocks of ``BLOCK`` terms.

However a float sum of ``n`` terms is ordered, its result is within ``gamma(h) * sum |x|``
of the exact sum, ``h`` being the most roundings any one term goes through (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 4.2). Added in one
pass, ``h`` can be ``n``; added in blocks whose sums are then added, ``h`` is at most
:func:`depth` ``(n) = BLOCK + ceil(n / BLOCK) + 1``: about 3,000 instead of a million for a
million rows. The privacy tracker charges exactly this bound, so it depends on no
library's internal order (:mod:`node.privacy.rounding`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["BLOCK", "blocked_sum", "depth"]

Array = npt.NDArray[Any]

#: terms summed together before their sums are added
BLOCK = 2048


def depth(n: int) -> int:
    """The most roundings one term of an accurate sum of ``n`` terms goes through.

    >>> depth(10), depth(1_000_000)
    (10, 2538)
    """
    return n if n <= BLOCK else BLOCK + -(-n // BLOCK) + 1


def blocked_sum(x: Array, axes: tuple[int, ...], acc: np.dtype[Any], keepdims: bool) -> Array:
    """``x.sum(axis=axes, dtype=acc)`` whose every term goes through ``depth(n)`` roundings."""
    n = math.prod(x.shape[a] for a in axes)
    if n <= BLOCK:
        return np.asarray(np.sum(x, axis=axes, dtype=acc, keepdims=keepdims))
    kept = [d for d in range(x.ndim) if d not in axes]
    y = np.moveaxis(x, axes, range(len(kept), x.ndim)).reshape([x.shape[d] for d in kept] + [n])
    m = n - n % BLOCK
    blocks = y[..., :m].reshape((*y.shape[:-1], m // BLOCK, BLOCK))
    total = np.sum(np.sum(blocks, axis=-1, dtype=acc), axis=-1, dtype=acc)
    if m < n:
        total = total + np.sum(y[..., m:], axis=-1, dtype=acc)
    if keepdims:
        total = np.reshape(total, [1 if d in axes else s for d, s in enumerate(x.shape)])
    return np.asarray(total)

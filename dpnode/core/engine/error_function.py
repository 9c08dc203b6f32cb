"""``erf`` and ``erfc`` in time that does not depend on where their arguments lie.

SciPy's error functions pick a formula by the argument's magnitude: ``erf`` its own
polynomial below 1 and ``1 - erfc`` above (3 times as long on the dev box); ``erfc`` one
rational function below 8, another from 8 on, and a shortcut where its result underflows.
The time of ``sum(erf(x))`` then counted the private values above 1, and GELU (which is
``x * (1 + erf(x / sqrt(2))) / 2``) would show the same.

Each kernel here calls SciPy once per formula, on every element: an element takes its own
value in its formula's call and a fixed value of that formula's range in the others, and
:func:`select` (which blends bits, in time that does not depend on the choice) keeps the
right result. Every call then takes the same path for every element whatever the data, and
the results are SciPy's, bit for bit, under the engine's flush-to-zero mode: ``erf(x)`` is
``1 - erfc(|x|)`` with ``x``'s sign from 1 on (and 1 from 6 on), ``erfc(x)`` is
``1 - erf(x)`` below 1 and ``2 - erfc(-x)`` for negative ``x``, as SciPy computes them
(tests/engine/test_error_function.py checks it). float32 is computed in float64 and
rounded once, as SciPy does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.special  # type: ignore[import-untyped,unused-ignore]

from dpnode.core.engine.constant_time import by_blocks, into, select

__all__ = ["erf", "erfc"]

Array = np.ndarray[Any, Any]

#: erfc's second rational function starts here
_HIGH = 8.0
_BELOW_HIGH = float(np.nextafter(_HIGH, 0.0))
#: erf is exactly 1 from here on (``1 - erfc(6)`` rounds to 1)
_ERF_ONE = 6.0
#: the largest argument whose erfc is a normal float; beyond, it is flushed to 0
_LAST = 26.54325845425098


def _erf(x: Array) -> Array:
    a = np.abs(x)
    small = a < 1.0
    inner = scipy.special.erf(select(small, x, 0.5))
    outer = np.copysign(1.0 - scipy.special.erfc(np.clip(a, 1.0, _ERF_ONE)), x)
    return select(np.isnan(x), x, select(small, inner, outer))


def _erfc(x: Array) -> Array:
    a = np.abs(x)
    small = a < 1.0
    inner = 1.0 - scipy.special.erf(select(small, x, 0.5))
    middle = scipy.special.erfc(np.clip(a, 1.0, _BELOW_HIGH))
    high = scipy.special.erfc(np.clip(a, _HIGH, _LAST))
    tail = select(a < _HIGH, middle, select(a <= _LAST, high, 0.0))
    tail = select(x < 0, 2.0 - tail, tail)
    return select(np.isnan(x), x, select(small, inner, tail))


def erf(x: Array, out: Array | None = None) -> Array:
    """``scipy.special.erf(x)`` (written into ``out`` if given)."""
    with np.errstate(all="ignore"):
        return into(by_blocks(_erf, x), out, np.asarray(x).dtype)


def erfc(x: Array, out: Array | None = None) -> Array:
    """``scipy.special.erfc(x)`` (written into ``out`` if given)."""
    with np.errstate(all="ignore"):
        return into(by_blocks(_erfc, x), out, np.asarray(x).dtype)

"""The data-independent grid 2^k on which every noised release lies.

A release is ``(round(x / 2^k) + Z) * 2^k`` computed in float64, where ``Z`` is an integer noise
draw. Every step is either exact or a deterministic function of the exact integer
``round(x / 2^k) + Z`` (IEEE addition and scaling by a power of two are correctly rounded), so
the release is post-processing of an integer mechanism and Mironov's (2012) attack on the
low-order bits of floating-point noise has nothing to read.

Rounding is applied to the query's *input* to the noise, so the mechanism protects the rounded
query, whose sensitivity is larger than the real one: each coordinate can move by one extra grid
step (round-half-even, ``|round(a) - round(b)| ≤ floor(|a - b|) + 1``). In grid units, an
``n``-vector with L1 sensitivity ``Δ₁`` rounds to one with L1 sensitivity at most
``floor(Δ₁ / 2^k) + n``, and L2 sensitivity ``Δ₂`` to at most ``Δ₂ / 2^k + sqrt(n)`` (triangle
inequality). That extra term grows with ``n``, so the grid is chosen from the sensitivity and
the size, not from the noise scale alone: ``k`` is the largest exponent with ``n 2^k ≤ Δ₁
2^-10`` (L1) or ``sqrt(n) 2^k ≤ Δ₂ 2^-10`` (L2), which keeps the inflation below 0.1% of the
noise. When that would make the noise scale in grid units exceed the samplers' limit (2^44),
``k`` is raised until it fits and the larger inflation is charged, never ignored.

Values proven integers on every dataset (from public metadata) need no rounding at all: on the
grid ``2^0 = 1`` rounding is the identity, the rounded query is the query, and its sensitivity
is the declared ``Δ₁`` or ``Δ₂`` with no ``+ n`` or ``+ sqrt(n)`` term (even ``floor(Δ₁)`` and
``floor(Δ₂²)`` under the root: an integer query changes by an integer vector). The discrete
Laplace of scale ``Δ₁ / ε`` on the integers is then ε-DP and the discrete Gaussian with
``Δ₂² <= 2 rho s²`` is rho-zCDP (Canonne, Kamath & Steinke 2020) for any real ``Δ₁``, ``Δ₂``;
:func:`dpnode.core.dp.mechanisms.plan_laplace` (``integral=True``) takes that grid whenever
``finest_exponent`` would be ``<= 0`` and the scale fits the samplers.

Inputs must be finite; a value whose grid index overflows a double is refused. Both refusals
depend on the private values, which is why the caller maps them to an evaluation error without
the value (see ``docs/privacy.md``, what is not protected).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpnode.core.errors import EvaluationError

__all__ = ["FINENESS_BITS", "finest_exponent", "on_grid", "round_to_grid", "to_values"]

#: The grid inflation of the sensitivity is at most 2^-FINENESS_BITS of the sensitivity.
FINENESS_BITS = 10


def finest_exponent(sensitivity: float, count: int, *, norm: int) -> int:
    """The largest ``k`` with ``count^(1/norm) * 2^k <= sensitivity * 2^-FINENESS_BITS``.

    Args:
        sensitivity: L1 (``norm=1``) or L2 (``norm=2``) sensitivity, finite and > 0.
        count: number of values released (at least 1).
        norm: 1 or 2.

    Raises:
        ValueError: on a non-positive sensitivity or count, or another norm.

    >>> finest_exponent(1.0, 1, norm=1)
    -10
    >>> finest_exponent(1.0, 1000, norm=1)
    -20
    >>> finest_exponent(3.0, 16, norm=2)
    -11
    """
    if not (math.isfinite(sensitivity) and sensitivity > 0) or count < 1:
        raise ValueError("sensitivity must be finite and > 0, count >= 1")
    if norm not in (1, 2):
        raise ValueError("norm must be 1 or 2")
    # Exact comparisons with fractions: k is the largest integer with
    # 2^k <= sensitivity * 2^-F / count^(1/norm), i.e. 2^(norm k) * count <= (s 2^-F)^norm.
    target = Fraction(sensitivity) / (1 << FINENESS_BITS)
    bound = target**norm / count
    # a start within a few steps of k, from the bit lengths (a float log2 of a subnormal
    # sensitivity's 2^-F would be log2(0))
    log2 = target.numerator.bit_length() - target.denominator.bit_length()
    k = log2 - (count.bit_length() // norm) - 2
    while Fraction(2) ** (norm * (k + 1)) <= bound:
        k += 1
    while Fraction(2) ** (norm * k) > bound:
        k -= 1
    return k


def round_to_grid(values: npt.NDArray[np.float64], k: int) -> npt.NDArray[np.float64]:
    """Grid indices ``round_half_even(values / 2^k)`` as integral float64 (exact).

    Args:
        values: finite float64 values.
        k: grid exponent.

    Raises:
        EvaluationError: if a value is NaN or infinite, or its grid index overflows.

    >>> round_to_grid(np.array([0.3, -1.25, 2.5]), -1)
    array([ 1., -2.,  5.])
    """
    if not np.all(np.isfinite(values)):
        raise EvaluationError("cannot noise a NaN or infinite value")
    with np.errstate(over="ignore"):
        scaled = np.ldexp(values, -k)
    if not np.all(np.isfinite(scaled)):
        raise EvaluationError(f"a value is too large for the noise grid 2^{k}")
    return np.rint(scaled)


def to_values(indices: npt.NDArray[np.float64], k: int) -> npt.NDArray[np.float64]:
    """Grid indices (integral float64) back to values: ``indices * 2^k``, with ``-0.0`` as 0."""
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(indices, k)
    out += 0.0  # -0.0 + 0.0 == +0.0: the sign of a zero must not leak the input's sign
    return out


def on_grid(values: npt.NDArray[np.float64], k: int) -> bool:
    """Whether every value is an integer multiple of ``2^k``.

    >>> on_grid(np.array([0.5, -3.0]), -1), on_grid(np.array([0.25]), -1)
    (True, False)
    """
    scaled = np.ldexp(values, -k)
    return bool(np.all(np.isfinite(scaled)) and np.all(scaled == np.rint(scaled)))

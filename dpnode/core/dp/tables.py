"""Exact-arithmetic probability tables for the noise samplers, as 128-bit alias tables.

A sampler draws an outcome from a finite table in constant work: one 64-bit word picks a bin
and a 128-bit comparison (the word's low bits, then a tie-breaking word) decides between the
bin's own outcome and its alias (Walker's alias method, built exactly with Python integers).
Every outcome's probability is therefore an exact multiple of 2^-128.

The tables approximate an ideal pmf. The deviation is bounded, not estimated:

* probabilities are computed with :mod:`decimal` at 80 significant digits, normalised over the
  kept support and rounded to multiples of 2^-128 (largest remainder, so they sum to one):
  each entry is off by less than 2^-128 + 10^-60, so the total variation (TV) distance added
  is at most ``size * (2^-129 + 10^-60)``;
* the support is truncated where the ideal tail mass drops below 2^-128; conditioning on the
  kept support moves the distribution by exactly that mass in TV.

``AliasTable.tv_bound`` is the sum of both, rounded up; samplers add the bounds of the tables
they combine (TV is subadditive over independent draws and post-processing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Context, Decimal, localcontext

import numpy as np
import numpy.typing as npt

__all__ = [
    "DECIMAL_CONTEXT",
    "PRECISION_BITS",
    "AliasTable",
    "build_alias_table",
    "discrete_gaussian_table",
    "laplace_top_table",
    "truncated_geometric_table",
]

#: Fixed-point precision of every table probability.
PRECISION_BITS = 128
_ONE = 1 << PRECISION_BITS
_FINE = 1 << (PRECISION_BITS + 64)
#: Support is truncated where the ideal tail mass is below 2^-TAIL_BITS.
TAIL_BITS = 128
_TAIL = Decimal(2) ** -TAIL_BITS
#: Per-entry error of the decimal computation, generously: at 80 digits every input is within
#: 10^-79 (relative) and an entry is at most 2^16 multiplications and a division away from them.
_DECIMAL_ERROR = 1e-60
#: Decimal context of every table computation (callers computing a table's inputs use it too).
DECIMAL_CONTEXT = Context(prec=80)
#: Largest table the samplers build (bins); bounds memory and build time.
MAX_BINS_LOG2 = 16


@dataclass(frozen=True, eq=False)
class AliasTable:
    """An alias table over the integers ``offset .. offset + size - 1``.

    Attributes:
        bits: ``d``; the table has ``2**d`` bins, chosen by the top ``d`` bits of a word.
        offset: the value of outcome index 0.
        size: number of outcomes with non-zero probability mass (the rest are padding).
        th: per bin, the high ``64 - d`` bits of the 128-bit acceptance threshold.
        tl: per bin, the low 64 bits of the acceptance threshold.
        alias: per bin, the outcome index taken when the threshold is not met.
        tv_bound: total variation distance from the ideal pmf, upper bound.
    """

    bits: int
    offset: int
    size: int
    th: npt.NDArray[np.uint64]
    tl: npt.NDArray[np.uint64]
    alias: npt.NDArray[np.int64]
    tv_bound: float


def build_alias_table(weights: list[int], *, offset: int, tv_bound: float) -> AliasTable:
    """Build an exact alias table from integer weights that sum to 2^128.

    Args:
        weights: probability of each outcome in units of 2^-128; must sum to exactly 2^128.
        offset: value of outcome 0.
        tv_bound: the caller's bound on the TV distance of ``weights`` from the ideal pmf.

    Raises:
        ValueError: if the weights do not sum to 2^128 or the table would be too large.

    >>> t = build_alias_table([1 << 126, 3 << 126], offset=5, tv_bound=0.0)
    >>> t.bits, t.size, [int(a) for a in t.alias]
    (1, 2, [1, 1])
    """
    if sum(weights) != _ONE or any(w < 0 for w in weights):
        raise ValueError("alias weights must be non-negative and sum to 2^128")
    bits = max(1, (len(weights) - 1).bit_length())
    if bits > MAX_BINS_LOG2:
        raise ValueError(f"alias table of {len(weights)} outcomes exceeds 2^{MAX_BINS_LOG2} bins")
    bins = 1 << bits
    capacity = _ONE >> bits
    mass = list(weights) + [0] * (bins - len(weights))
    threshold = [capacity] * bins
    alias = list(range(bins))
    small = [i for i in range(bins) if mass[i] < capacity]
    large = [i for i in range(bins) if mass[i] >= capacity]
    # Vose's method on exact integers: each bin ends up holding exactly `capacity`.
    while small and large:
        s, g = small.pop(), large.pop()
        threshold[s] = mass[s]
        alias[s] = g
        mass[g] -= capacity - mass[s]
        (small if mass[g] < capacity else large).append(g)
    if small:  # only possible through a bug: the sums are exact
        raise AssertionError("alias construction left an under-full bin")
    mask = (1 << 64) - 1
    for b in range(bins):
        if threshold[b] >= capacity:  # a full bin: both branches give the bin's own outcome
            threshold[b], alias[b] = 0, b
    th = np.array([t >> 64 for t in threshold], dtype=np.uint64)
    tl = np.array([t & mask for t in threshold], dtype=np.uint64)
    return AliasTable(
        bits=bits,
        offset=offset,
        size=len(weights),
        th=th,
        tl=tl,
        alias=np.asarray(alias, dtype=np.int64),
        tv_bound=tv_bound,
    )


def _quantise(probs: list[Decimal]) -> tuple[list[int], float]:
    """Round probabilities (summing to one) to multiples of 2^-128 that sum to exactly one."""
    # 2^64 extra fraction bits (exact integers) decide the largest remainders.
    with localcontext(DECIMAL_CONTEXT):
        fine = [int(p * _FINE) for p in probs]
    floors = [f >> 64 for f in fine]
    missing = _ONE - sum(floors)
    if not 0 <= missing <= len(probs):  # the probabilities did not sum to one
        raise AssertionError("probabilities to quantise must sum to one")
    # Largest remainder: give the missing units to the entries that lost the most.
    mask = (1 << 64) - 1
    order = sorted(range(len(probs)), key=lambda i: fine[i] & mask, reverse=True)
    for i in order[:missing]:
        floors[i] += 1
    return floors, len(probs) * (2.0**-129 + _DECIMAL_ERROR)


def _round_up(x: Decimal) -> float:
    f = float(x)
    return f if Decimal(f) >= x else math.nextafter(f, math.inf)


def truncated_geometric_table(ratio: Decimal, bits: int) -> AliasTable:
    """Table of ``P(r) ∝ ratio**r`` on ``0 .. 2**bits - 1`` (finite support: no tail).

    Args:
        ratio: the geometric ratio, ``0 < ratio < 1``, computed to 80 digits by the caller.
        bits: the support has ``2**bits`` outcomes.
    """
    with localcontext(DECIMAL_CONTEXT):
        weights = [Decimal(1)]
        for _ in range((1 << bits) - 1):
            weights.append(weights[-1] * ratio)
        total = sum(weights, Decimal(0))
        probs = [w / total for w in weights]
    ints, tv = _quantise(probs)
    return build_alias_table(ints, offset=0, tv_bound=tv)


def laplace_top_table(scale: Decimal, shift: int) -> AliasTable:
    """Table of the sign, zero and high part of a discrete Laplace variable.

    The discrete Laplace variable ``Z`` with ``P(Z = z) ∝ p**|z|`` is ``0`` or
    ``±(1 + q * 2**shift + R)`` with ``R`` in ``[0, 2**shift)``. This table holds ``v = 0`` for
    ``Z = 0`` and ``v = ±(q + 1)`` for the sign and ``q``; ``R`` comes from digit tables.

    Args:
        scale: ``t``; ``P(Z = z) ∝ exp(-|z|/t)``.
        shift: number of low bits of ``|Z| - 1`` drawn by the digit tables.
    """
    with localcontext(DECIMAL_CONTEXT):
        one = Decimal(1)
        p = (-1 / scale).exp()
        big_q = (-Decimal(1 << shift) / scale).exp()  # ratio of the high part q, directly
        p_zero = (one - p) / (one + p)
        first = p_zero * p * (one - big_q) / (one - p)  # P(Z = +(1 + R)), q = 0
        # Tail of both signs beyond q_max: 2 * first * big_q**(q_max+1) / (1 - big_q) < 2^-128.
        # Smallest q_max with the tail below 2^-128, from logarithms, then checked exactly.
        q_max = max(0, int((_TAIL * (one - big_q) / (2 * first)).ln() / big_q.ln()))
        while q_max > 0 and 2 * first * big_q**q_max / (one - big_q) < _TAIL:
            q_max -= 1
        while 2 * first * big_q ** (q_max + 1) / (one - big_q) >= _TAIL:
            q_max += 1
        tail = 2 * first * big_q ** (q_max + 1) / (one - big_q)
        side = [first]
        for _ in range(q_max):
            side.append(side[-1] * big_q)
        kept = p_zero + 2 * sum(side, Decimal(0))
        probs = [s / kept for s in reversed(side)] + [p_zero / kept] + [s / kept for s in side]
    ints, tv = _quantise(probs)
    return build_alias_table(ints, offset=-(q_max + 1), tv_bound=tv + _round_up(tail))


def discrete_gaussian_table(variance: Decimal) -> AliasTable:
    """Table of the discrete Gaussian ``P(z) ∝ exp(-z²/(2 variance))``, truncated at its tail.

    The tail beyond ``T`` is bounded by the integral ``∫_T^∞ exp(-x²/2s²) dx ≤ (s²/T)
    exp(-T²/2s²)`` on each side, against the kept mass.

    Args:
        variance: ``s²`` of the discrete Gaussian, computed to 80 digits by the caller.
    """
    with localcontext(DECIMAL_CONTEXT):
        s = variance.sqrt()
        two_var = 2 * variance
        # Smallest T whose tail bound, against a kept mass of at least 1, is below 2^-128.
        # Start from a float estimate (log space) a few units beyond the bound; check exactly.
        sf = float(s)
        t_max = int(sf * math.sqrt(2 * TAIL_BITS * math.log(2))) + 1
        log_target = -TAIL_BITS * math.log(2)
        while math.log(2 * sf * sf / t_max) - t_max**2 / (2 * sf * sf) >= log_target - 1e-6:
            t_max += 1
        while 2 * (variance / t_max) * (-(Decimal(t_max) ** 2) / two_var).exp() >= _TAIL:
            t_max += 1
        # Weights by recurrence: w(z+1) = w(z) * r^(2z+1), r = exp(-1/(2 s²)).
        r = (-1 / two_var).exp()
        r2 = r * r
        side = [Decimal(1)]
        step = r
        for _ in range(t_max):
            side.append(side[-1] * step)
            step *= r2
        kept = 2 * sum(side, Decimal(0)) - 1
        tail = 2 * (variance / t_max) * (-(Decimal(t_max) ** 2) / two_var).exp() / kept
        probs = [w / kept for w in reversed(side[1:])] + [w / kept for w in side]
    ints, tv = _quantise(probs)
    return build_alias_table(ints, offset=-t_max, tv_bound=tv + _round_up(tail))

"""Vectorised, constant-work samplers of the discrete Laplace and discrete Gaussian on integers.

Why not the exact samplers of Canonne, Kamath & Steinke (2020)? Their rejection loops are exact
but run for a random number of rounds that depends on the noise drawn, and they are scalar.
Here every sample costs the same fixed sequence of table lookups (:mod:`dpnode.core.dp.tables`),
whatever the noise, and a whole array is drawn at once. The price is a deviation from the
ideal distribution, bounded (below), which :mod:`dpnode.core.dp.accounting` charges for each release
at the release's own parameters.

Large scales do not need large tables:

* **Discrete Laplace** ``P(z) ∝ exp(-|z|/t)``: ``|Z| - 1`` given ``Z ≠ 0`` is geometric, and a
  geometric variable splits *exactly* into independent base-2^w digits, each a truncated
  geometric (``p^r = Π p^(2^o r_o)``). One table holds the sign, zero and the high part; one
  table per digit of at most 13 bits holds the rest.
* **Discrete Gaussian** ``P(z) ∝ exp(-z²/2s²)``: for ``s`` above 512, ``Z = m A + B`` with
  ``B ~ N_Z(0, s_B²)`` from a fixed table (``s_B = 4m``, ``m = 64``) and ``A ~ N_Z(0, (s² -
  s_B²)/m²)`` drawn the same way, recursively. By Poisson summation the result's pmf is the
  ideal one times ``1 ± γ`` with ``γ ≤ 2 Σ_k exp(-2π² k² τ² / m²)`` and
  ``τ² = (s² - s_B²) s_B² / s²`` (the argument of Kairouz, Liu & Steinke 2021 for sums of
  discrete Gaussians); here
  ``τ / m ≥ 3.4``, so ``γ < 10^-100``. That deviation is accounted for too.

Randomness: raw 64-bit words from ``numpy``'s PCG64DXSM seeded with 256 fresh bits from the
operating system's CSPRNG (:func:`secrets.randbits`) on every call, so two calls or two
processes never share a stream. The generator itself is not cryptographic; the words are never
released (only table outcomes added to secret values). ``source="os"`` draws every word from
``os.urandom`` instead, for a deployment that wants a cryptographic stream at a few times the
cost. The default, ``source="auto"``, draws a small sample (at most :data:`OS_WORDS` words)
from ``os.urandom`` too: there one system call costs less than seeding a generator (about 1
against 20 microseconds for a scalar's words), so the common release of a few values gets the
cryptographic stream for less.

Within one Laplace sample the 128-bit comparisons share a single tie-breaking word; it matters
only when a lookup's 64-bit part ties its threshold (probability ``2^-(64 - d)`` for a table of
``2^d`` bins, ``d ≤ 16``), and the draws differ from fully independent tie-breakers only if two
lookups of one sample tie, which adds ``Σ_{i<j} 2^-(128 - d_i - d_j)`` to the TV bound. Each
lookup of a Gaussian sample has a tie-breaking word of its own: its lookups are exactly
independent, which the pointwise bound below needs.

What the budget needs (``docs/privacy.md``, "The samplers' deviation and the budget"):

* a Laplace plan's ``tv_bound``: the release is charged ``(1 + e^epsilon) n tv_bound`` as delta;
* a Gaussian plan's noise pmf ``q`` is pointwise close to the ideal ``p``: ``|q(z) - p(z)| <=
  gamma p(z) + error p(0)`` for every integer ``z`` (``GaussianPlan.gamma``, ``.error``), within
  the constants :data:`dpnode.core.dp.accounting.GAUSSIAN_GAMMA` and ``GAUSSIAN_ERROR`` that the
  accounting uses for every plan; its ``tv_bound`` is the fixed
  :data:`dpnode.core.dp.accounting.GAUSSIAN_TV`, above every plan's total-variation distance, so
  that
  ``n tv_bound`` also says how many values a release noised.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, localcontext
from functools import lru_cache
from typing import Literal

import numpy as np
import numpy.typing as npt

from dpnode.core.dp.accounting import GAUSSIAN_ERROR, GAUSSIAN_GAMMA, GAUSSIAN_TV
from dpnode.core.dp.tables import (
    DECIMAL_CONTEXT,
    PRECISION_BITS,
    TAIL_BITS,
    AliasTable,
    discrete_gaussian_table,
    laplace_top_table,
    truncated_geometric_table,
)

__all__ = [
    "GaussianPlan",
    "LaplacePlan",
    "Source",
    "gaussian_plan",
    "laplace_plan",
    "noise_from_words",
    "sample",
    "word_source",
]

Source = Literal["auto", "pcg", "os"]
#: The most words ``source="auto"`` draws from ``os.urandom`` (beyond, PCG64DXSM is cheaper).
OS_WORDS = 512
WordSource = Callable[[int], npt.NDArray[np.uint64]]

#: Laplace: the top table covers t / 2^shift in [2^5, 2^6); digits have at most 13 bits.
_LAPLACE_TOP_LOG2 = 5
_DIGIT_BITS = 13
#: Gaussian: tables up to s = 512; beyond, Z = 64 A + B with B ~ N_Z(0, 256²).
_GAUSS_TOP_MAX = 512.0
_GAUSS_M_LOG2 = 6
_GAUSS_B_SCALE = 4 * (1 << _GAUSS_M_LOG2)
#: Largest scale accepted, so that every noise value is below 2^53 (exact as a double).
MAX_SCALE = 2.0**44
#: Samples per chunk: the working set stays in cache.
_CHUNK = 1 << 14


@dataclass(frozen=True, eq=False)
class LaplacePlan:
    """How to draw a discrete Laplace variable of scale ``t`` in grid units.

    Attributes:
        scale: ``t``; ``P(z) ∝ exp(-|z|/t)``.
        top: table of ``v`` (0, or ``±(q+1)``).
        shift: ``|Z| = 1 + (|v| - 1) 2^shift + R``.
        digits: ``(table, offset)`` pairs; ``R = Σ digit << offset``.
        tv_bound: TV distance of one sample from the ideal distribution, upper bound.
        max_abs: largest ``|Z|`` the plan can produce.
        top_sign: per top outcome index, ``sign(v)``.
        top_base: per top outcome index, ``sign(v) (1 + (|v| - 1) 2^shift)`` (0 for ``v = 0``).
    """

    scale: float
    top: AliasTable
    shift: int
    digits: tuple[tuple[AliasTable, int], ...]
    tv_bound: float
    max_abs: int
    top_sign: npt.NDArray[np.int64]
    top_base: npt.NDArray[np.int64]

    @property
    def tables(self) -> tuple[AliasTable, ...]:
        return (self.top, *(t for t, _ in self.digits))

    @property
    def word_rows(self) -> int:
        """Rows of words one sample takes: one per lookup and a shared tie-breaking word."""
        return len(self.tables) + 1


@dataclass(frozen=True, eq=False)
class GaussianPlan:
    """How to draw a discrete Gaussian of standard-deviation parameter ``s`` in grid units.

    ``Z = B_0 + m (B_1 + m (... + m A))`` where ``A`` comes from ``top`` and every ``B_i`` from
    ``low``; ``levels`` is the number of ``B`` terms.

    Every lookup has its own tie-breaking word, so the lookups of one sample are independent.

    Attributes:
        scale: ``s``; ``P(z) ∝ exp(-z² / (2 s²))``.
        top: table of the innermost ``A``.
        low: table of each ``B`` (``None`` when ``levels == 0``).
        levels: number of ``m``-steps.
        tv_bound: :data:`dpnode.core.dp.accounting.GAUSSIAN_TV`, the same for every plan: an upper
            bound on ``tables_tv``, so that ``n tv_bound`` says how many values were noised.
        max_abs: largest ``|Z|`` the plan can produce.
        offset: the value of all-zero outcome indices, ``top.offset m^L + low.offset Σ m^i``.
        tables_tv: TV distance of one sample from the ideal distribution, upper bound.
        gamma: ``Γ`` of the pointwise bound ``|q(z) - p(z)| <= Γ p(z) + E p(0)``.
        error: ``E`` of that bound (an absolute error, as a fraction of the pmf's peak).
    """

    scale: float
    top: AliasTable
    low: AliasTable | None
    levels: int
    tv_bound: float
    max_abs: int
    offset: int
    tables_tv: float = 0.0
    gamma: float = 0.0
    error: float = 0.0

    @property
    def tables(self) -> tuple[AliasTable, ...]:
        return (self.top,) + ((self.low,) * self.levels if self.low is not None else ())

    @property
    def word_rows(self) -> int:
        """Rows of words one sample takes: a word and a tie-breaking word per lookup."""
        return 2 * len(self.tables)


def _tie_bound(tables: tuple[AliasTable, ...]) -> float:
    # The shared tie-breaking word matters only if two lookups of one sample tie in their
    # 64-bit parts; lookup i ties with probability 2^-(64 - bits_i), independently of j.
    return math.fsum(
        2.0 ** -(128 - a.bits - b.bits) for i, a in enumerate(tables) for b in tables[i + 1 :]
    )


def _check_scale(scale: float) -> None:
    if not (math.isfinite(scale) and 0.0 < scale <= MAX_SCALE):
        raise ValueError(f"noise scale {scale!r} (grid units) must be in (0, 2^44]")


@lru_cache(maxsize=32)
def laplace_plan(scale: float) -> LaplacePlan:
    """Plan (and cache) the discrete Laplace sampler of scale ``t`` (grid units).

    Raises:
        ValueError: if ``scale`` is not in ``(0, 2^44]``.

    >>> plan = laplace_plan(3000.0)
    >>> plan.shift, [off for _, off in plan.digits], plan.tv_bound < 2.0**-90
    (6, [0], True)
    """
    _check_scale(scale)
    shift = max(0, math.floor(math.log2(scale)) - _LAPLACE_TOP_LOG2)
    with localcontext(DECIMAL_CONTEXT):
        t = Decimal(scale)
        top = laplace_top_table(t, shift)
        digits = []
        offset = 0
        while offset < shift:
            width = min(_DIGIT_BITS, shift - offset)
            ratio = (-Decimal(1 << offset) / t).exp()
            digits.append((truncated_geometric_table(ratio, width), offset))
            offset += width
    tables = (top, *(d for d, _ in digits))
    tv = math.fsum(tb.tv_bound for tb in tables) + _tie_bound(tables)
    v_max = -top.offset
    v = np.arange(1 << top.bits, dtype=np.int64) + top.offset  # padding indices never drawn
    sign = np.sign(v)
    return LaplacePlan(
        scale=scale,
        top=top,
        shift=shift,
        digits=tuple(digits),
        tv_bound=tv,
        max_abs=v_max << shift,
        top_sign=sign,
        top_base=sign * (1 + ((np.abs(v) - 1) << shift)),
    )


@lru_cache(maxsize=1)
def _gaussian_low_table() -> AliasTable:
    with localcontext(DECIMAL_CONTEXT):
        return discrete_gaussian_table(Decimal(_GAUSS_B_SCALE) ** 2)


def _poisson_gamma(tau_over_m: float) -> float:
    # g = 2 Σ_{k≥1} exp(-a k²) ≤ 2 e^-a / (1 - e^-a), a = 2π² (τ/m)²; the pmf of m A + B is
    # the ideal one times a factor in [(1-g)/(1+g), (1+g)/(1-g)]: within 1 ± 2g/(1-g).
    a = 2.0 * math.pi**2 * tau_over_m**2
    gamma = 2.0 * math.exp(-a) / -math.expm1(-a)
    return 2.0 * gamma / (1.0 - gamma)


#: A table entry's distance from the ideal pmf normalised over the table's support, at most
#: (largest-remainder rounding to 2^-128, plus the decimal computation's 10^-60), rounded up.
_ENTRY_ERROR = math.nextafter(2.0**-PRECISION_BITS + 1e-60, math.inf)
#: A table's truncated tail, at most (relative to the kept mass: what normalising adds too).
_TABLE_TAIL = 2.0**-TAIL_BITS
#: Relative slack for the float arithmetic of the bounds below (each is a few dozen operations).
_SLACK = 1.0 + 1e-9
#: The composed variance (computed with 80 digits) differs from s² by a relative 10^-78 at most;
#: over the bulk that moves the pmf by far less than this, added to Γ per level.
_VARIANCE_SLACK = 1e-70


def _normaliser_bounds(sigma: float) -> tuple[float, float]:
    """Bounds on ``N = Σ_z exp(-z²/(2σ²))``: at least ``max(1, √(2π) σ)`` (the term z = 0, and
    Poisson summation, whose cosine terms are all positive), at most ``1 + √(2π) σ`` (a
    unimodal sum is at most its peak plus its integral)."""
    root = math.sqrt(2.0 * math.pi) * sigma
    return max(1.0, root / _SLACK), (1.0 + root) * _SLACK


def _pointwise(
    top_sigma: float, steps: list[tuple[float, float, float]], low_size: int
) -> tuple[float, float]:
    """``(Γ, E)`` with ``|q(z) - p(z)| <= Γ p(z) + E p(0)`` for every integer ``z``.

    ``steps`` lists, from the innermost level outwards, ``(σ_A, σ_Z, Γ_P)`` of each
    ``Z = m A + B``. A table gives ``Γ = 2^-128`` (its normalisation) and an absolute error
    of one entry's; a level adds, with ``B`` a table of ``low_size`` entries (see
    ``docs/privacy.md``, "The samplers' deviation and the budget", Lemma 3)::

        Γ_Z = Γ_P + (Γ_A + Γ_B + Γ_A Γ_B)(1 + Γ_P)
        e_Z = (1 + Γ_A)(u c + t_B) / N_A + e_A (M_B (1 + Γ_B) + u c + t_B)

    (absolute errors ``e``; ``c = |S_B|/m + 1``, ``M_B = 1/N_B + 1/m``, ``u`` an entry's error,
    ``t_B`` the table's tail), and finally ``E = e N_Z``.
    """
    m = float(1 << _GAUSS_M_LOG2)
    u, tail = _ENTRY_ERROR, _TABLE_TAIL
    gamma, error = tail, u  # the innermost table, absolute error
    gamma_b = tail
    n_b, _ = _normaliser_bounds(float(_GAUSS_B_SCALE))
    m_b = (1.0 / n_b + 1.0 / m) * _SLACK
    count = low_size / m + 1.0
    sigma = top_sigma
    for sigma_a, sigma_z, poisson in steps:
        n_a, _ = _normaliser_bounds(sigma_a)
        new_error = (1.0 + gamma) * (u * count + tail) / n_a + error * (
            m_b * (1.0 + gamma_b) + u * count + tail
        )
        gamma = poisson + _VARIANCE_SLACK + (gamma + gamma_b + gamma * gamma_b) * (1.0 + poisson)
        error = new_error * _SLACK
        sigma = sigma_z
    _, n_z = _normaliser_bounds(sigma)
    return gamma * _SLACK, error * n_z * _SLACK


@lru_cache(maxsize=32)
def gaussian_plan(scale: float) -> GaussianPlan:
    """Plan (and cache) the discrete Gaussian sampler of parameter ``s`` (grid units).

    Raises:
        ValueError: if ``scale`` is not in ``(0, 2^44]``.

    >>> plan = gaussian_plan(10_000.0)
    >>> plan.levels, plan.tables_tv < 2.0**-90, plan.error < 2.0**-110
    (1, True, True)
    """
    _check_scale(scale)
    m = 1 << _GAUSS_M_LOG2
    tv = 0.0
    levels = 0
    steps: list[tuple[float, float, float]] = []
    with localcontext(DECIMAL_CONTEXT):
        var = Decimal(scale) ** 2
        b_var = Decimal(_GAUSS_B_SCALE) ** 2
        while var > Decimal(_GAUSS_TOP_MAX) ** 2:
            a_var = var - b_var  # variance of m·A
            tau_over_m = float((a_var * b_var / var).sqrt() / m)
            poisson = _poisson_gamma(tau_over_m)
            tv += poisson
            steps.append((float((a_var / (m * m)).sqrt()), float(var.sqrt()), poisson))
            var = a_var / (m * m)
            levels += 1
        top = discrete_gaussian_table(var)
        top_sigma = float(var.sqrt())
    low = _gaussian_low_table() if levels else None
    tables = (top,) + ((low,) * levels if low is not None else ())
    # Independent lookups: no tie term.
    tv += math.fsum(tb.tv_bound for tb in tables)
    gamma, error = _pointwise(top_sigma, steps[::-1], low.size if low is not None else 0)
    if not (tv <= GAUSSIAN_TV and gamma <= GAUSSIAN_GAMMA and error <= GAUSSIAN_ERROR):
        raise AssertionError(f"gaussian plan {scale!r} exceeds the accounting's constants")
    low_abs = -low.offset if low is not None else 0
    max_abs = -top.offset * m**levels + low_abs * sum(m**i for i in range(levels))
    offset = top.offset * m**levels - low_abs * sum(m**i for i in range(levels))
    return GaussianPlan(
        scale=scale,
        top=top,
        low=low,
        levels=levels,
        tv_bound=GAUSSIAN_TV,
        max_abs=max_abs,
        offset=offset,
        tables_tv=tv,
        gamma=gamma,
        error=error,
    )


def word_source(source: Source = "pcg", words: int | None = None) -> WordSource:
    """A fresh stream of uniform 64-bit words, seeded from the OS CSPRNG.

    Args:
        source: ``"pcg"`` (PCG64DXSM seeded with 256 bits from :func:`secrets.randbits`),
            ``"os"`` (every word from :func:`os.urandom`) or ``"auto"`` (``"os"`` for a
            stream of at most :data:`OS_WORDS` words, else ``"pcg"``).
        words: how many words the stream will give in all, if known (``"auto"`` takes a
            stream of unknown length from ``"pcg"``).

    Raises:
        ValueError: on an unknown source.
    """
    if source == "auto":
        source = "os" if words is not None and words <= OS_WORDS else "pcg"
    if source == "pcg":
        bits = np.random.PCG64DXSM(secrets.randbits(256))

        def pcg(count: int) -> npt.NDArray[np.uint64]:
            return bits.random_raw(count)

        return pcg
    if source == "os":

        def urandom(count: int) -> npt.NDArray[np.uint64]:
            return np.frombuffer(os.urandom(8 * count), dtype=np.uint64).copy()

        return urandom
    raise ValueError(f"unknown randomness source {source!r}; use 'auto', 'pcg' or 'os'")


class _Scratch:
    """Preallocated buffers for one chunk of lookups."""

    def __init__(self, size: int) -> None:
        self.bins = np.empty(size, dtype=np.uint64)
        self.th = np.empty(size, dtype=np.uint64)
        self.tl = np.empty(size, dtype=np.uint64)
        self.flag = np.empty(size, dtype=np.bool_)
        self.out = np.empty(size, dtype=np.int64)
        self.sign = np.empty(size, dtype=np.int64)
        self.diff = np.empty(size, dtype=np.int64)
        self.low = np.empty(size, dtype=np.int64)


def _lookup(
    table: AliasTable, word: npt.NDArray[np.uint64], tie: npt.NDArray[np.uint64], s: _Scratch
) -> npt.NDArray[np.int64]:
    """Outcome indices for one chunk; the same operations whatever the outcome."""
    m = word.shape[0]
    low_bits = np.uint64(64 - table.bits)
    bins = np.right_shift(word, low_bits, out=s.bins[:m]).view(np.int64)
    np.bitwise_and(word, np.uint64((1 << (64 - table.bits)) - 1), out=word)
    th, tl, flag, out = s.th[:m], s.tl[:m], s.flag[:m], s.out[:m]
    # Bins are below 2^bits by construction; mode="clip" only skips numpy's buffered checks.
    np.take(table.th, bins, out=th, mode="clip")
    np.take(table.tl, bins, out=tl, mode="clip")
    np.less(tie, tl, out=flag)
    np.add(th, flag, out=th, casting="unsafe")  # (x, tie) < (th, tl)  <=>  x < th + [tie < tl]
    np.less(word, th, out=flag)
    np.take(table.alias, bins, out=out, mode="clip")
    # out += flag * (bins - out): arithmetic, not a masked copy, so that no branch depends on
    # which outcome was drawn.
    diff = np.subtract(bins, out, out=s.diff[:m])
    np.multiply(diff, flag, out=diff)
    out += diff
    return out  # outcome indices; the value is index + table.offset


def _laplace_chunk(
    plan: LaplacePlan, words: npt.NDArray[np.uint64], s: _Scratch, dest: npt.NDArray[np.int64]
) -> None:
    tie = words[-1]
    m = dest.shape[0]
    top = _lookup(plan.top, words[0], tie, s)
    # Z = sign(v) (1 + (|v| - 1) 2^shift + R): the signed base and the sign per top outcome
    # come from two small tables, so v = 0 gives 0 without a branch.
    sign = np.take(plan.top_sign, top, out=s.sign[:m], mode="clip")
    np.take(plan.top_base, top, out=dest, mode="clip")
    low = s.low[:m]
    low.fill(0)
    for i, (table, offset) in enumerate(plan.digits):
        digit = _lookup(table, words[1 + i], tie, s)
        if offset:
            np.left_shift(digit, offset, out=digit)
        low += digit
    low *= sign
    dest += low


def _gaussian_chunk(
    plan: GaussianPlan, words: npt.NDArray[np.uint64], s: _Scratch, dest: npt.NDArray[np.int64]
) -> None:
    # Z = B_0 + m (B_1 + ... + m A) on outcome indices, then one constant for all the offsets.
    # Lookup i takes word 2i and its own tie-breaking word 2i + 1.
    np.copyto(dest, _lookup(plan.top, words[0], words[1], s))
    for i in range(1, plan.levels + 1):
        assert plan.low is not None
        np.left_shift(dest, _GAUSS_M_LOG2, out=dest)
        dest += _lookup(plan.low, words[2 * i], words[2 * i + 1], s)
    dest += plan.offset


def noise_from_words(
    plan: LaplacePlan | GaussianPlan, words: npt.NDArray[np.uint64]
) -> npt.NDArray[np.int64]:
    """The noise integers that uniform words map to (the deterministic half of :func:`sample`).

    Every column costs the same operations whatever its words: one lookup per table of the
    plan, on all elements, in chunks of 2^14.

    Args:
        plan: from :func:`laplace_plan` or :func:`gaussian_plan`.
        words: shape ``(plan.word_rows, count)``, uniform 64-bit words; overwritten. Laplace:
            one row per lookup, and a last row that breaks ties. Gaussian: for each lookup a
            row and its own tie-breaking row.

    Raises:
        ValueError: if ``words`` has the wrong shape or dtype.
    """
    rows = plan.word_rows
    if words.dtype != np.uint64 or words.ndim != 2 or words.shape[0] != rows:
        raise ValueError(f"words must be uint64 of shape ({rows}, count)")
    count = words.shape[1]
    result = np.empty(count, dtype=np.int64)
    scratch = _Scratch(min(_CHUNK, max(count, 1)))
    for start in range(0, count, _CHUNK):
        stop = min(start + _CHUNK, count)
        _noise_chunk(plan, words[:, start:stop], scratch, result[start:stop])
    return result


def _noise_chunk(
    plan: LaplacePlan | GaussianPlan,
    words: npt.NDArray[np.uint64],
    s: _Scratch,
    dest: npt.NDArray[np.int64],
) -> None:
    if isinstance(plan, LaplacePlan):
        _laplace_chunk(plan, words, s, dest)
    else:
        _gaussian_chunk(plan, words, s, dest)


def sample(
    plan: LaplacePlan | GaussianPlan, count: int, *, source: Source = "auto"
) -> npt.NDArray[np.int64]:
    """Draw ``count`` independent noise integers from ``plan`` with a freshly seeded stream.

    Args:
        plan: from :func:`laplace_plan` or :func:`gaussian_plan`.
        count: number of samples.
        source: see :func:`word_source`.

    Raises:
        ValueError: if ``count`` is negative.

    >>> z = sample(laplace_plan(2.5), 1000)
    >>> z.dtype, z.shape
    (dtype('int64'), (1000,))
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    rows = plan.word_rows
    words_of = word_source(source, rows * count)
    result = np.empty(count, dtype=np.int64)
    scratch = _Scratch(min(_CHUNK, max(count, 1)))
    for start in range(0, count, _CHUNK):
        m = min(_CHUNK, count - start)
        words = words_of(rows * m).reshape(rows, m)
        _noise_chunk(plan, words, scratch, result[start : start + m])
    return result

"""Error bars: how far a released statistic may be from its value without noise, at 95%.

A statistic's ``<name>_scale`` is not one kind of number, so neither is its error bar:

* **noised** (count, sum, mean, var, std, count_distinct): the scale is the standard
  deviation of the noise in the value. Laplace noise of scale ``b`` has standard deviation
  ``sqrt(2) b`` and stays within ``± ln(20) b`` with probability 95% exactly, which is
  ``± 2.12`` standard deviations; Gaussian noise within ``± 1.96``. That is exact for a
  count or a count of distinct keys (one noised value each). A sum, mean, variance or
  standard deviation combines several noised values, whose sum has lighter tails than one
  Laplace value of the same spread, and a ratio's standard deviation is to first order: for
  them the bar is about 95%, and more where the value was clipped to what it can be (a
  mean to the column's bounds), which only brings it nearer the truth.
* **selected** (median, quantile, min, max): the scale is permute-and-flip's, in rows of
  rank (``2 k / epsilon``), and says nothing of the value's units. Among ``m`` public
  candidates the answer's rank is within ``scale (ln m + t)`` rows of the quantile's with
  probability at least ``1 - e^-t`` (McKenna and Sheldon 2020): at 95%, ``t = ln 20``. The
  bar is that many rows of rank, shown as such.
* **exact** (a count without filter or group: public): no bar.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dpnode.core.dp.selection import candidates
from dpnode.sdk.query.expressions import is_integral

if TYPE_CHECKING:
    from dpnode.sdk._handles import ColumnInfo

__all__ = [
    "GAUSSIAN_95",
    "LAPLACE_95",
    "ErrorBar",
    "candidate_count",
    "caption",
    "error_bar",
    "shown",
]

#: standard deviations of Laplace noise within which it stays with probability 95%:
#: ``P(|L| > t b) = e^-t`` gives ``t = ln 20``, and its standard deviation is ``sqrt(2) b``
LAPLACE_95 = math.log(20.0) / math.sqrt(2.0)
#: the same for Gaussian noise: the normal distribution's 97.5% quantile
GAUSSIAN_95 = 1.959963984540054


@dataclass(frozen=True)
class ErrorBar:
    """``± half_width`` around a released value, at 95%: in the statistic's own units, or
    (``rank``) in rows of rank for a selected quantile."""

    half_width: float
    rank: bool = False


def error_bar(mechanism: str, scale: float, candidates: int = 1) -> ErrorBar | None:
    """The 95% error bar of a value released by ``mechanism`` (a receipt's) with noise
    ``scale`` (its ``<name>_scale``); ``candidates``: a selection's number of public
    candidates. None for an exact value (scale 0).

    >>> round(error_bar("laplace", 1.0).half_width, 3)  # 2.12 standard deviations
    2.118
    >>> bar = error_bar("exponential", 2.0, candidates=121)  # 2 (ln 121 + ln 20) rows of rank
    >>> round(bar.half_width, 2), bar.rank
    (15.58, True)
    >>> error_bar("laplace", 0.0) is None
    True
    """
    if not scale > 0:
        return None
    if mechanism == "exponential":
        return ErrorBar(scale * (math.log(max(candidates, 1)) + math.log(20.0)), rank=True)
    return ErrorBar(scale * (GAUSSIAN_95 if mechanism == "gaussian" else LAPLACE_95))


def candidate_count(info: ColumnInfo) -> int:
    """How many public candidates the node selects a quantile of the column among: every
    integer of an integer column's bounds if there are few enough, else a grid."""
    lo, hi = info.bounds
    return len(candidates(lo, hi, is_integral(info)))


def shown(value: float, bar: ErrorBar | None) -> str:
    """``value ± bar``, the value rounded where the bar's second significant digit falls;
    a rank bar in rows beside the value as released.

    >>> shown(47.9321, ErrorBar(1.234)), shown(4567.8, ErrorBar(123.4)), shown(3.0, None)
    ('47.9 ± 1.2', '4568 ± 123', '3')
    >>> shown(47.0, ErrorBar(15.58, rank=True))
    '47 (± 16 rows)'
    """
    text = f"{value:.6g}"
    if bar is None or not math.isfinite(bar.half_width):
        return text
    if bar.rank:
        return f"{text} (± {bar.half_width:.0f} rows)"
    digits = max(0, 1 - math.floor(math.log10(bar.half_width)))
    return f"{value:.{digits}f} ± {bar.half_width:.{digits}f}"


def caption(bars: list[ErrorBar | None]) -> str:
    """What the ``±`` of a table's cells mean, for the kinds of bar it holds."""
    parts = []
    if any(b is not None and not b.rank for b in bars):
        parts.append(
            "value ± the 95% interval of its noise (± 2.12 standard deviations of Laplace "
            "noise, 1.96 of Gaussian; about 95% for a sum, mean, var or std, which combine "
            "several noised values)"
        )
    if any(b is not None and b.rank for b in bars):
        parts.append(
            "a quantile, median, min or max ± rows of rank: within that many rows of the "
            "true quantile's rank with probability at least 95%"
        )
    if any(b is None for b in bars):
        parts.append("no ±: exact (public)")
    return "; ".join(parts) + "." if parts else ""

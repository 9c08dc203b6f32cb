"""One row's measurements and its line in the table: errors, their ratio, times, verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: the product's targets: dpnode's error at most OpenDP's within two standard errors, its
#: time per release at most this many times OpenDP's
TIME_TARGET = 1.5

HEADER = (
    "| table | statistic | dpnode | OpenDP | dpnode / OpenDP (± 2 s.e.) "
    "| dpnode ms | OpenDP ms | time ratio | target |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


@dataclass
class Side:
    """One side's releases of a row: each release's error and time in seconds, or why it has
    none."""

    errors: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    refused: str | None = None

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.errors)) if self.errors and self.refused is None else None

    @property
    def ms(self) -> float | None:
        """The median time of a release, in milliseconds."""
        return 1e3 * float(np.median(self.seconds)) if self.seconds else None


def ratio(ours: list[float], theirs: list[float]) -> tuple[float, float]:
    """The ratio of the mean errors and two standard errors of it (the delta method over the
    releases).

    >>> ratio([1.0, 3.0], [2.0, 2.0])
    (1.0, 1.0)
    """
    a, b = np.asarray(ours), np.asarray(theirs)
    ma, mb = float(a.mean()), float(b.mean())
    if mb == 0:
        return (1.0, 0.0) if ma == 0 else (math.inf, 0.0)
    relative = [
        e.std(ddof=1) / (m * math.sqrt(e.size)) if m and e.size > 1 else 0.0
        for e, m in ((a, ma), (b, mb))
    ]
    return ma / mb, 2 * ma / mb * math.hypot(*relative)


def _cell(side: Side) -> str:
    if side.refused is not None:
        return side.refused.replace("|", "/")
    return f"{side.mean:.4g}" if side.mean is not None else "-"


def line(table: str, name: str, ours: Side, theirs: Side) -> str:
    """The row's line; its last cell says whether dpnode meets the targets ("behind:" what it
    misses, or "refused").

    >>> ok = Side([1.0, 1.0], [0.010, 0.012])
    >>> line("t", "sum", ok, Side([1.0, 1.0], [0.010, 0.010]))
    '| t | sum | 1 | 1 | 1.00 ± 0.00 | 11 | 10 | 1.10 | ok |'
    >>> line("t", "sum", Side(refused="refused: no"), ok)
    '| t | sum | refused: no | 1 | - | - | 11 | - | **refused** |'
    """
    cells = [table, name, _cell(ours), _cell(theirs)]
    verdict: list[str] = []
    if ours.mean is not None and theirs.mean is not None:
        r, two_se = ratio(ours.errors, theirs.errors)
        cells.append(f"{r:.2f} ± {two_se:.2f}")
        if r - two_se > 1.0:
            verdict.append("error")
    else:
        cells.append("-")
    times = [ours.ms if ours.refused is None else None, theirs.ms]
    cells += [f"{t:.3g}" if t is not None else "-" for t in times]
    if times[0] is not None and times[1] is not None:
        cells.append(f"{times[0] / times[1]:.2f}")
        if times[0] > TIME_TARGET * times[1]:
            verdict.append("time")
    else:
        cells.append("-")
    if ours.refused is not None:
        cells.append("**refused**")
    else:
        cells.append(f"**behind: {', '.join(verdict)}**" if verdict else "ok")
    return "| " + " | ".join(cells) + " |"


def error_line(name: str, ours: np.ndarray | None, theirs: np.ndarray | None) -> str:
    """A line of errors alone (for benches that print no times): each side's mean absolute
    error, and their ratio with one standard error; a side with no release prints "-".

    >>> error_line("median (age)", None, np.array([0.51234]))
    '| median (age) | - | 0.5123 | - |'
    >>> error_line("sum", np.array([1.0, 3.0]), np.array([2.0, 2.0]))
    '| sum | 2 | 2 | 1.00 ± 0.50 |'
    """
    means = [float(e.mean()) if e is not None else None for e in (ours, theirs)]
    cells = [f"{m:.4g}" if m is not None else "-" for m in means]
    shown = "-"
    if ours is not None and theirs is not None and means[1]:
        r, two_se = ratio(list(ours), list(theirs))
        shown = f"{r:.2f} ± {two_se / 2:.2f}"
    return f"| {name} | {cells[0]} | {cells[1]} | {shown} |"

"""Charts drawn on the node as inline SVG: no script, no library, readable without colour.

A chart is built from values the page already shows in a table next to it (the ledger), so it
releases nothing the table does not. Text is escaped; coordinates are plain numbers.

Labels cannot collide: the lines drawn across the plot (the allocation, the renewal) are named
in a legend under it, one row each, rather than next to the lines, which meet wherever the
renewal is near the plot's top right; the axis labels sit on their own sides of the plot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from xml.sax.saxutils import escape

from markupsafe import Markup

WIDTH = 640
LEFT, RIGHT, TOP, PLOT_HEIGHT = 64, 16, 16, 200
#: Baseline of the dates under the plot, top of the legend, height of one legend row.
DATES_Y = TOP + PLOT_HEIGHT + 22
LEGEND_TOP, LEGEND_ROW = DATES_Y + 10, 24


@dataclass(frozen=True)
class Step:
    """The epsilon used (as the budget counts it) just after a charge at ``at``."""

    at: datetime
    used: float


def _fmt(value: float) -> str:
    """A short label for an axis value.

    >>> _fmt(0.5), _fmt(2.0), _fmt(0.125)
    ('0.5', '2', '0.125')
    """
    return f"{value:.4g}"


def _ticks(top: float, count: int = 4) -> list[float]:
    """Ticks from 0 to at most ``top``, at a round step (1, 2, 2.5 or 5 times a power of
    ten) giving at most ``count`` intervals.

    >>> _ticks(2.0), _ticks(11.5), _ticks(0.3)
    ([0.0, 0.5, 1.0, 1.5, 2.0], [0.0, 5.0, 10.0], [0.0, 0.1, 0.2, 0.3])
    """
    if not top > 0:
        return [0.0]
    power = 10.0 ** math.floor(math.log10(top / count))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power * count >= top)
    return [round(i * step, 12) for i in range(int(top / step + 1e-9) + 1)]


def budget_chart(
    steps: Sequence[Step],
    *,
    allocation: float,
    start: datetime,
    end: datetime,
    renews_at: datetime | None,
    title: str,
) -> Markup:
    """Epsilon used over ``start``..``end`` as a step line, against the allocation (a dashed
    line) and the renewal (a dotted line at ``renews_at`` when it falls inside the window).

    >>> from datetime import UTC, datetime, timedelta
    >>> t0 = datetime(2026, 1, 1, tzinfo=UTC)
    >>> svg = budget_chart([Step(t0 + timedelta(hours=1), 0.5)], allocation=2.0, start=t0,
    ...                    end=t0 + timedelta(days=1), renews_at=None, title="a <b>")
    >>> "<title" in svg and "a &lt;b&gt;" in svg and 'class="allocation"' in svg
    True
    """
    finite = [s.used for s in steps if s.used != float("inf")]
    top = max([allocation, *finite, 1e-9]) * 1.1
    span = max((end - start).total_seconds(), 1e-6)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, PLOT_HEIGHT
    renewal = renews_at if renews_at is not None and start <= renews_at <= end else None
    legend = [
        ("spent", "", f"epsilon used: {_fmt(finite[-1] if finite else 0.0)}"),
        ("allocation", "8 4", f"allocation {_fmt(allocation)}"),
    ]
    if renewal is not None:
        legend.append(("renewal", "2 4", f"renews {renewal:%Y-%m-%d %H:%M} UTC"))
    height = LEGEND_TOP + LEGEND_ROW * len(legend) + 4

    def x(at: datetime) -> float:
        return LEFT + plot_w * min(max((at - start).total_seconds() / span, 0.0), 1.0)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - min(value, top) / top)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {WIDTH} {height}"'
        ' role="img" aria-labelledby="chart-title chart-desc">',
        f'<title id="chart-title">{escape(title)}</title>',
        f'<desc id="chart-desc">Epsilon used from {start:%Y-%m-%d %H:%M} to '
        f"{end:%Y-%m-%d %H:%M} UTC: {_fmt(finite[-1] if finite else 0.0)} of "
        f"{_fmt(allocation)} after {len(steps)} charges.</desc>",
    ]
    for tick in _ticks(top / 1.1):
        ty = y(tick)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}"/>'
            f'<text class="axis" x="{LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end">'
            f"{_fmt(tick)}</text>"
        )
    parts.append(
        f'<text class="axis" x="{LEFT}" y="{DATES_Y}">{start:%Y-%m-%d %H:%M}</text>'
        f'<text class="axis" x="{WIDTH - RIGHT}" y="{DATES_Y}" text-anchor="end">'
        f"{end:%Y-%m-%d %H:%M} UTC</text>"
    )
    ay = y(allocation)
    parts.append(
        f'<line class="allocation" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{ay:.1f}" y2="{ay:.1f}"'
        ' stroke-dasharray="8 4"/>'
    )
    if renewal is not None:
        rx = x(renewal)
        parts.append(
            f'<line class="renewal" x1="{rx:.1f}" x2="{rx:.1f}" y1="{TOP}" y2="{TOP + plot_h}"'
            ' stroke-dasharray="2 4"/>'
        )
    points = [(float(LEFT), y(0.0))]
    for step in steps:
        px = x(step.at)
        points += [(px, points[-1][1]), (px, y(step.used))]
    points.append((x(end) if renews_at is None or renews_at > end else x(renews_at), points[-1][1]))
    path = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
    parts.append(f'<polyline class="spent" fill="none" points="{path}"/>')
    for step in steps:
        parts.append(
            f'<circle class="charge" cx="{x(step.at):.1f}" cy="{y(step.used):.1f}" r="3"/>'
        )
    for row, (kind, dashes, text) in enumerate(legend):
        mid = LEGEND_TOP + LEGEND_ROW * row + LEGEND_ROW / 2
        dash = f' stroke-dasharray="{dashes}"' if dashes else ""
        parts.append(
            f'<line class="{kind} key" x1="{LEFT}" x2="{LEFT + 28}" y1="{mid:.1f}" y2="{mid:.1f}"'
            f"{dash}/>"
            f'<text class="label" x="{LEFT + 36}" y="{mid + 4:.1f}">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))

"""Renewal periods: fixed lengths anchored at a UTC instant.

A period of length ``L`` anchored at ``A`` splits time into half-open windows
``[A + k L, A + (k + 1) L)`` for every integer ``k`` (instants before the anchor belong to
negative ``k``). An instant exactly on a boundary starts the new period. Only fixed lengths are
accepted (seconds to weeks): calendar months have no fixed length, and a budget that renews
"monthly" on uneven dates would give different users different amounts per day of waiting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["Period", "as_utc", "format_period", "parse_period"]

_UNITS: dict[str, timedelta] = {
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}
_PATTERN = re.compile(r"([1-9][0-9]{0,8})([smhdw])")


#: The longest period: windows around any time of use end within the calendar.
LONGEST = timedelta(days=36_500)


def parse_period(text: str) -> timedelta:
    """A length such as ``"30d"``: a positive whole number and one unit of s, m, h, d or w.

    Raises:
        ValueError: on anything else, with the accepted form in the message.

    >>> parse_period("30d")
    datetime.timedelta(days=30)
    >>> parse_period("12h") == parse_period("720m")
    True
    >>> parse_period("1 month")
    Traceback (most recent call last):
    ...
    ValueError: bad period '1 month': write a whole number and a unit s, m, h, d or w, e.g. '30d'
    """
    match = _PATTERN.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(
            f"bad period {text!r}: write a whole number and a unit s, m, h, d or w, e.g. '30d'"
        )
    count, unit = int(match.group(1)), _UNITS[match.group(2)]
    if count > LONGEST // unit:  # windows must end within the calendar
        raise ValueError(f"period {text!r} is longer than {LONGEST.days} days")
    return count * unit


def format_period(length: timedelta) -> str:
    """The canonical text of a period length: the largest unit that divides it.

    >>> format_period(parse_period("168h")), format_period(parse_period("90m"))
    ('1w', '90m')
    """
    for unit in ("w", "d", "h", "m", "s"):
        count, rest = divmod(length, _UNITS[unit])
        if rest == timedelta(0):
            return f"{count}{unit}"
    raise ValueError(f"period {length} is not a whole number of seconds")


def as_utc(at: datetime) -> datetime:
    """``at`` in UTC; naive datetimes are refused (their zone is a guess).

    >>> as_utc(datetime.fromisoformat("2026-01-01T02:00:00+02:00")).isoformat()
    '2026-01-01T00:00:00+00:00'
    """
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError(f"datetime {at.isoformat()} has no time zone; give it in UTC")
    try:
        return at.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-01:00 is past the calendar's end in UTC
        raise ValueError(f"datetime {at.isoformat()} is beyond the calendar in UTC") from None


@dataclass(frozen=True)
class Period:
    """Windows of ``length`` starting at ``anchor + k * length``.

    >>> p = Period(parse_period("30d"), datetime(2026, 1, 1, tzinfo=UTC))
    >>> [d.date().isoformat() for d in p.window(datetime(2026, 2, 5, tzinfo=UTC))]
    ['2026-01-31', '2026-03-02']
    >>> p.window(datetime(2026, 1, 31, tzinfo=UTC))[0] == datetime(2026, 1, 31, tzinfo=UTC)
    True
    """

    length: timedelta
    anchor: datetime

    def __post_init__(self) -> None:
        if self.length <= timedelta(0):
            raise ValueError("a period must be longer than zero")
        object.__setattr__(self, "anchor", as_utc(self.anchor))

    def index(self, at: datetime) -> int:
        """Which window ``at`` falls in (0 is the one that starts at the anchor)."""
        return (as_utc(at) - self.anchor) // self.length

    def window(self, at: datetime) -> tuple[datetime, datetime]:
        """The half-open window ``[start, end)`` that contains ``at``."""
        start = self.anchor + self.index(at) * self.length
        return start, start + self.length

    def counts_at(self, at: datetime, other: datetime) -> bool:
        """Whether what was charged at ``other`` counts in the window of ``at``: it falls in
        that window or a later one. A charge dated after ``at``'s window was spent already,
        stamped by a clock ahead of the one reading ``at`` (another worker's): it counts now
        and again in its own window, never in neither."""
        return self.index(other) >= self.index(at)

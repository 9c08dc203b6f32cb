"""Renewal periods: windows tile time exactly, boundaries belong to the next window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.policies import Period, format_period, parse_period
from dpnode.policies._periods import LONGEST

instants = st.datetimes(
    min_value=datetime(1990, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)
)
lengths = st.integers(1, 10**8).map(lambda s: timedelta(seconds=s))


@settings(deadline=None)
@given(lengths, instants, instants)
def test_windows_tile_time(length: timedelta, anchor: datetime, at: datetime) -> None:
    period = Period(length, anchor)
    start, end = period.window(at)
    assert start <= at < end and end - start == length
    assert (start - anchor) % length == timedelta(0)
    assert period.window(end)[0] == end  # a boundary starts the next window
    assert period.window(end - timedelta(microseconds=1))[0] == start
    assert period.counts_at(at, start) and not period.counts_at(at, start - length)
    assert period.counts_at(at, end) and period.counts_at(at, end + 5 * length)


@settings(deadline=None)
@given(st.integers(1, 10**6), st.sampled_from("smhdw"))
def test_period_text_round_trips(count: int, unit: str) -> None:
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[unit]
    if count * seconds > LONGEST.total_seconds():  # beyond the calendar: refused
        with pytest.raises(ValueError, match="longer than 36500 days"):
            parse_period(f"{count}{unit}")
        return
    length = parse_period(f"{count}{unit}")
    assert parse_period(format_period(length)) == length


@pytest.mark.parametrize("text", ["", "30", "d", "0d", "-1d", "1.5d", "1 d", "1D", "1y", "P30D"])
def test_bad_period_strings_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bad period"):
        parse_period(text)


def test_anchor_in_another_zone_is_the_same_instant() -> None:
    plus2 = timezone(timedelta(hours=2))
    a = Period(timedelta(days=1), datetime(2026, 1, 1, 2, tzinfo=plus2))
    b = Period(timedelta(days=1), datetime(2026, 1, 1, tzinfo=UTC))
    assert a == b


def test_naive_times_are_refused() -> None:
    period = Period(timedelta(days=1), datetime(2026, 1, 1, tzinfo=UTC))
    with pytest.raises(ValueError, match="no time zone"):
        period.window(datetime(2026, 1, 2))

"""The ledger as people read it: what each row added to "epsilon used", and a training run's
steps as one line.

A row records what it charged in its mechanism's own terms: a pure epsilon, a rho, the
samplers' delta. Those do not add up to the "epsilon used" a user reads in their budget:
Gaussian releases compose as zCDP, and the privacy filter converts the window's rho total at
the allowance's delta (``policies.Limit.epsilon_used``), which is not linear in rho (the first
Gaussian step of a run costs far more epsilon than its thirtieth). So each row is also read
with its *epsilon used*: how much the user's converted total grew with it,
``E(before + row) - E(before)``, where ``before`` sums the user's earlier rows of the same
renewal window and ``E`` is :meth:`Status.used_units`, the very function the budget view
reports ``spent_epsilon`` with. Over the rows of a window these telescope: in whole ledger
units they add up to exactly the epsilon the budget reports as spent (and the delta used
likewise).

It is worked out when the ledger is read, not stored when a row is charged. The conversion
depends on the allowance's delta, which admins change (a grant of delta, a policy revision):
a stored value would stop adding up to the budget view after such a change, while one
derived from the rows as they stand always does, and rows charged before this existed have
one too. What it costs is one statement per user and renewal window read: a running sum
over that user's rows (``SUM() OVER``), computed by the database.

Training runs (``dpnode.node.services.runs``) are recorded when planned, and each step's row
names its run (``LedgerEntry.run_id``): :func:`lines_of` lists the ledger one line per run
(its steps, their epsilon used summed) or per charge of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Select, case, false, func, or_, select
from sqlalchemy.orm import Session

from dpnode import policies
from dpnode.node.db.base import utcnow
from dpnode.node.db.direct import connection_of
from dpnode.node.db.models import LedgerEntry, LedgerEntryDataset, TrainingRun, User
from dpnode.node.services import policy as policy_service
from dpnode.node.services.budget_status import Status, _status
from dpnode.node.services.ledger_sums import _LEDGER, policy_user
from dpnode.node.settings import Settings

__all__ = ["Line", "Used", "ledger_of", "lines_of", "run_total", "used_by_row"]


@dataclass(frozen=True)
class Used:
    """What one row (or several, summed) added to its user's budget, in ledger units: the
    epsilon used as the privacy filter counts it (``None``: a rho with no delta to convert it
    at, which no budget holds) and the delta used."""

    epsilon_units: int | None
    delta_units: int

    def __add__(self, other: Used) -> Used:
        epsilon = (
            None
            if self.epsilon_units is None or other.epsilon_units is None
            else self.epsilon_units + other.epsilon_units
        )
        return Used(epsilon, self.delta_units + other.delta_units)


NOTHING = Used(0, 0)


_Query = TypeVar("_Query", bound=Select[*tuple[Any, ...]])


class _Row(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def user_id(self) -> int: ...
    @property
    def at(self) -> datetime: ...
    @property
    def cap_only(self) -> bool: ...


def _filtered(
    query: _Query,
    user_id: int | None,
    dataset_id: int | None,
    since: datetime | None,
    until: datetime | None,
    run_id: int | None = None,
) -> _Query:
    if user_id is not None:
        query = query.where(LedgerEntry.user_id == user_id)
    if since is not None:
        query = query.where(LedgerEntry.at >= since)
    if until is not None:
        query = query.where(LedgerEntry.at < until)
    if run_id is not None:
        query = query.where(LedgerEntry.run_id == run_id)
    if dataset_id is not None:
        reads = select(LedgerEntryDataset.ledger_id).where(
            LedgerEntryDataset.dataset_id == dataset_id
        )
        query = query.where(LedgerEntry.id.in_(reads))
    return query


def ledger_of(
    session: Session,
    user_id: int | None,
    *,
    dataset_id: int | None = None,
    before_id: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    run_id: int | None = None,
    limit: int = 100,
) -> list[LedgerEntry]:
    """Charges, newest first: one user's (``None``: everyone's), optionally on one dataset,
    of one training run, and charged at or after ``since`` and before ``until``."""
    query = select(LedgerEntry).order_by(LedgerEntry.id.desc()).limit(limit)
    query = _filtered(query, user_id, dataset_id, since, until, run_id)
    if before_id is not None:
        query = query.where(LedgerEntry.id < before_id)
    return list(session.scalars(query))


def _window(
    period: policies.Period | None, at: datetime, now: datetime
) -> tuple[datetime | None, datetime | None]:
    """The renewal window whose rows ``at``'s row adds to: ``[start, end)``; the current one
    has no end (as the budget counts it: a row dated ahead by another clock counts now)."""
    if period is None:
        return None, None
    start, end = period.window(at)
    return start, None if period.index(at) >= period.index(now) else end


def _running(
    connection: Connection,
    user_id: int,
    window: tuple[datetime | None, datetime | None],
    ids: set[int],
) -> dict[int, tuple[policies.Spent, policies.Spent]]:
    """For each row of ``ids`` (all ``user_id``'s, in ``window``): the sums of the user's rows
    of the window before it, and its own amounts."""
    running = [func.sum(c).over(order_by=_LEDGER.c.id) for c in _AMOUNTS]
    inner = select(_LEDGER.c.id, *_AMOUNTS, *running).where(
        _LEDGER.c.user_id == user_id, _LEDGER.c.id <= max(ids), _LEDGER.c.cap_only.is_(false())
    )
    start, end = window
    if start is not None:
        inner = inner.where(_LEDGER.c.at >= start)
    if end is not None:
        inner = inner.where(_LEDGER.c.at < end)
    sums = inner.subquery()
    found: dict[int, tuple[policies.Spent, policies.Spent]] = {}
    for ident, e, r, d, upto_e, upto_r, upto_d in connection.execute(
        select(sums).where(sums.c.id >= min(ids))
    ):
        if ident in ids:  # the running sums include the row: what came before is less it
            own = policies.Spent(int(e), int(d), int(r))
            before = policies.Spent(
                int(upto_e) - int(e), int(upto_d) - int(d), int(upto_r) - int(r)
            )
            found[ident] = (before, own)
    return found


#: A row's amounts, in the order :func:`_running` reads them (the ledger's ``tv_units``
#: holds the samplers' delta, in delta units).
_AMOUNTS = (_LEDGER.c.epsilon_units, _LEDGER.c.rho_units, _LEDGER.c.tv_units)


def _grew(status: Status, before: policies.Spent, own: policies.Spent) -> Used:
    """How much ``own`` added to the (epsilon, delta) used that ``before`` counts for."""
    return _between(status, before, before + own)


def _between(status: Status, lower: policies.Spent, upper: policies.Spent) -> Used:
    """How much more (epsilon, delta) used ``upper`` counts for than ``lower``."""
    e0, d0 = status.used_units(lower)
    e1, d1 = status.used_units(upper)
    return Used(None if e0 is None or e1 is None else e1 - e0, d1 - d0)


def used_by_row(
    on: Session | Connection,
    status_of: Callable[[int], Status],
    rows: Iterable[_Row],
    *,
    now: datetime | None = None,
) -> dict[int, Used]:
    """What each of ``rows`` added to its user's epsilon and delta used (see the module),
    by row id. ``status_of(user_id)``: the user's budget, whose conversion is used."""
    connection = connection_of(on)
    now = utcnow() if now is None else now
    groups: dict[tuple[int, datetime | None, datetime | None], set[int]] = {}
    statuses: dict[int, Status] = {}
    used: dict[int, Used] = {}
    for row in rows:
        if row.cap_only:  # paid from datasets' caps alone: nothing of its user's budget
            used[row.id] = NOTHING
            continue
        if row.user_id not in statuses:
            statuses[row.user_id] = status_of(row.user_id)
        renewal = statuses[row.user_id].in_force.policy.renewal
        period = None if renewal is None else renewal.period()
        groups.setdefault((row.user_id, *_window(period, row.at, now)), set()).add(row.id)
    for (user_id, start, end), ids in groups.items():
        status = statuses[user_id]
        for ident, (before, own) in _running(connection, user_id, (start, end), ids).items():
            used[ident] = _grew(status, before, own)
    return used


def statuses(session: Session, settings: Settings) -> Callable[[int], Status]:
    """``status_of`` for :func:`used_by_row`: each user's budget now, under the policy in
    force (read once per user)."""
    in_force = policy_service.current(session)
    now = utcnow()

    def status_of(user_id: int) -> Status:
        user = session.get(User, user_id)
        assert user is not None  # a ledger row's user: never deleted
        return _status(session, settings, in_force, policy_user(session, user), now)

    return status_of


@dataclass(frozen=True)
class Line:
    """One line of the ledger as :func:`lines_of` groups it: a charge of its own, or the
    steps of one training run (``run``), newest first, with what each added (``used``)."""

    entries: list[LedgerEntry]
    run: TrainingRun | None
    used: dict[int, Used]

    @property
    def total(self) -> Used:
        """What the line's rows added to the budget, summed."""
        total = NOTHING
        for e in self.entries:
            total = total + self.used[e.id]
        return total


def lines_of(
    session: Session,
    settings: Settings,
    user_id: int | None,
    *,
    dataset_id: int | None = None,
    before_id: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
) -> list[Line]:
    """The ledger one line per training run or per charge of its own, newest first (by each
    line's newest row; ``before_id`` pages: lines whose newest row is older than it), with
    the filters of :func:`ledger_of` applied to the rows of each line."""
    newest = func.max(LedgerEntry.id)
    alone = case((LedgerEntry.run_id.is_(None), LedgerEntry.id), else_=None)
    keys = select(newest, LedgerEntry.run_id).group_by(LedgerEntry.run_id, alone)
    keys = _filtered(keys, user_id, dataset_id, since, until)
    if before_id is not None:
        keys = keys.having(newest < before_id)
    found: list[tuple[int, int | None]] = [
        (int(n), None if run is None else int(run))
        for n, run in session.execute(keys.order_by(newest.desc()).limit(limit))
    ]
    singles = [n for n, run in found if run is None]
    run_ids = [run for _, run in found if run is not None]
    if not found:
        return []
    rows = select(LedgerEntry).where(
        or_(
            LedgerEntry.id.in_(singles),
            LedgerEntry.run_id.in_(run_ids),
        )
    )
    rows = _filtered(rows, user_id, dataset_id, since, until)
    entries = list(session.scalars(rows.order_by(LedgerEntry.id.desc())))
    used = used_by_row(session, statuses(session, settings), entries)
    planned = select(TrainingRun).where(TrainingRun.id.in_(run_ids))
    runs = {r.id: r for r in session.scalars(planned)}
    by_run: dict[int, list[LedgerEntry]] = {}
    by_id: dict[int, LedgerEntry] = {}
    for e in entries:
        if e.run_id is None:
            by_id[e.id] = e
        else:
            by_run.setdefault(e.run_id, []).append(e)
    lines: list[Line] = []
    for n, run in found:
        if run is None:
            lines.append(Line([by_id[n]], None, used))
        else:
            lines.append(Line(by_run[run], runs[run], used))
    return lines


def run_total(
    connection: Connection, status: Status, user_id: int, run_id: int
) -> tuple[int, Used]:
    """How many steps of ``run_id`` the ledger holds and what they added to the budget,
    summed, under ``status``'s conversion (the budget after the newest of them).

    Each step's charge reads this (its receipt states the run so far), so it must not grow
    with the run: what consecutive rows add telescopes (``E(b + o1) - E(b) + E(b + o1 + o2)
    - E(b + o1)``), so each stretch of the run's rows with no other charge between them costs
    two conversions, not two a row."""
    rows = connection.execute(
        select(_LEDGER.c.id, _LEDGER.c.at).where(_LEDGER.c.run_id == run_id)
    ).all()
    renewal = status.in_force.policy.renewal
    period = None if renewal is None else renewal.period()
    now = utcnow()
    windows: dict[tuple[datetime | None, datetime | None], set[int]] = {}
    for ident, at in rows:
        windows.setdefault(_window(period, at, now), set()).add(ident)
    total = NOTHING
    for window, ids in windows.items():
        found = _running(connection, user_id, window, ids)
        start: policies.Spent | None = None
        end = policies.Spent()
        for ident in sorted(found):
            before, own = found[ident]
            if start is not None and before != end:  # another charge came between
                total = total + _between(status, start, end)
                start = None
            if start is None:
                start = before
            end = before + own
        if start is not None:
            total = total + _between(status, start, end)
    return len(rows), total

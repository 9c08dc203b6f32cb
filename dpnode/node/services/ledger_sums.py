"""The ledger as a budget decision reads it: a few sums, whatever its length.

A charge's transaction is on every publish's path, so it reads the ledger with statements
built once: all of a user's rows, under a policy without renewal, as the one-row total the
database keeps (``dpnode.node.db.models.LedgerTotal``); otherwise the rows of the current
renewal window summed, plus the few rows a rate limit or a dataset's cap needs
(:func:`_load`). Decisions on these sums equal decisions on the whole ledger
(tests/node/test_budget_scope.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, and_, bindparam, false, func, or_, select
from sqlalchemy.orm import Session

from dpnode import policies
from dpnode.node.db.base import table_of
from dpnode.node.db.direct import connection_of
from dpnode.node.db.models import (
    BudgetGrant,
    Dataset,
    LedgerEntry,
    LedgerEntryDataset,
    LedgerTotal,
    Role,
    User,
)

__all__ = ["Account", "policy_user"]

_GRANTS = BudgetGrant.__table__
_LEDGER = table_of(LedgerEntry)
# The statements of every publish, built once: building a statement costs more than running
# it on SQLite (the values are bound per call).
_GRANTS_OF = (
    select(*(_GRANTS.c[k] for k in ("at", "epsilon_units", "delta_units", "granted_by", "reason")))
    .where(_GRANTS.c.user_id == bindparam("user_id"))
    .order_by(_GRANTS.c.id)
)
_SUMS = (
    func.coalesce(func.sum(_LEDGER.c.epsilon_units), 0),
    func.coalesce(func.sum(_LEDGER.c.rho_units), 0),
    func.coalesce(func.sum(_LEDGER.c.tv_units), 0),
    func.max(_LEDGER.c.at),
)
# A user's own rows: not those paid from datasets' caps alone (``LedgerEntry.cap_only``),
# which the database's total leaves out too.
_MINE = select(*_SUMS).where(
    _LEDGER.c.user_id == bindparam("user_id"), _LEDGER.c.cap_only.is_(false())
)
_MINE_SINCE = _MINE.where(_LEDGER.c.at >= bindparam("since"))
_TOTALS = LedgerTotal.__table__
#: The same as ``_MINE``, kept up to date by the database (``dpnode.node.db.models.LedgerTotal``).
_TOTAL = select(
    _TOTALS.c.epsilon_units, _TOTALS.c.rho_units, _TOTALS.c.tv_units, _TOTALS.c.newest_at
).where(_TOTALS.c.user_id == bindparam("user_id"))
_DATASETS = Dataset.__table__


class Account(NamedTuple):
    """The user a charge is for, as its transaction reads (and locks) the row."""

    id: int
    email: str
    role: Role


def policy_user(
    on: Session | Connection, user: User | Account, *, granted: bool = True
) -> policies.User:
    """``user`` as the policies see it, with every budget grant made to them (none read when
    the caller found none: ``granted`` false)."""
    grants = connection_of(on).execute(_GRANTS_OF, {"user_id": user.id}) if granted else ()
    return policies.User(
        user.id,
        user.email,
        user.role.value,
        tuple(policies.Grant(at, e, d, by=by, reason=why) for at, e, d, by, why in grants),
    )


@dataclass(frozen=True)
class _Ledger:
    """The ledger rows a decision needs (``charges``), and the user's own rows of the current
    period summed in ledger units (``mine``: epsilon, rho, sampler deviation, the newest
    ``at``), from which the budget after a charge follows without reading the ledger again."""

    charges: list[policies.Charge]
    #: All the user's rows of the period unless ``listed``: then those not passed one by one.
    mine: tuple[int, int, int, datetime | None]
    #: Whether ``charges`` passes some of the user's rows one by one (the rate limit's).
    listed: bool
    #: The user's rows in the rate limit's window (0 without a rate limit).
    in_rate_window: int


def _charges(
    session: Session,
    policy: policies.Policy,
    request: policies.PublishRequest,
    user: policies.User,
) -> list[policies.Charge]:
    """The ledger as :func:`policies.decide` needs it, in a few rows whatever its length.

    See :func:`_load`.
    """
    return _load(session, policy, request, user).charges


def _load(
    on: Session | Connection,
    policy: policies.Policy,
    request: policies.PublishRequest,
    user: policies.User,
    total: tuple[int, int, int, datetime | None] | None = None,
) -> _Ledger:
    """The ledger as :func:`policies.decide` needs it, in a few rows whatever its length.

    Rows matter one by one only to the rate limit, and only once the user reached it (the
    newest ``max_publishes`` in its window say when the next publish is free); otherwise
    the ledger enters as sums, each dated by its newest row so that it lands in the same
    renewal window: the user's rows of the current window (counted against the user, no
    dataset), plus zero-cost markers so that the rate limit counts every row of its window,
    and for each capped dataset everyone's rows on it in the cap's window except those
    passed one by one (counted against the dataset, user 0: nobody). A row paid from caps
    alone (``cap_only``, a data owner's synthetic mock) is only ever among the latter: it
    is not the user's, not even for the rate limit. Each row's samplers'
    delta is in ``tv_units`` already (costed when it was charged), so sums add up exactly.
    Decisions on these equal decisions on the whole ledger (tests/node/test_budget_scope.py).
    All the user's rows (no renewal, none passed one by one) are read as their total, which
    the database keeps equal to their sum (tests/node/test_ledger_totals.py): ``total`` when
    the caller read it in this transaction (:func:`_lock`).
    """

    def charge(
        at: datetime, who: int, ids: tuple[int, ...], e: int, r: int, delta: int
    ) -> policies.Charge:
        return policies.Charge(at, who, ids, e, delta, r)

    user_id = user.id
    scope = policies.ledger_scope(policy, user, request)
    # A cap names a dataset; count every row that read a dataset of that name, whatever its
    # id (one deleted and uploaded again keeps its cap).
    capped = {
        dataset_id: name
        for name, dataset_id in request.datasets.items()
        if dataset_id in scope.datasets
    }

    def reads(dataset_id: int) -> Any:  # rare (a capped dataset): built per call
        entries = select(LedgerEntryDataset.ledger_id).where(
            or_(
                LedgerEntryDataset.dataset_name == capped[dataset_id],
                # SQLite may give a deleted dataset's id to a new one: ids decide only for
                # charges recorded before names were.
                and_(
                    LedgerEntryDataset.dataset_name.is_(None),
                    LedgerEntryDataset.dataset_id == dataset_id,
                ),
            )
        )
        return LedgerEntry.id.in_(entries)

    connection = connection_of(on)
    period = None if policy.renewal is None else policy.renewal.period()
    since = None if period is None else period.window(request.at)[0]
    found: list[policies.Charge] = []
    listed: list[int] = []  # ids of the rows passed one by one
    extra, extra_at, count = 0, request.at, 0
    limit = policy.rate_limit
    if limit is not None:
        own = select(LedgerEntry).where(
            LedgerEntry.user_id == user_id, LedgerEntry.cap_only.is_(false())
        )
        # The rate limit needs the count of the user's rows in its window and, once that
        # reaches the limit, the newest max_publishes of them (when the next one is free).
        cutoff = request.at - policies.parse_period(limit.window)
        in_window = own.where(LedgerEntry.at > cutoff)
        count = int(connection.scalar(in_window.with_only_columns(func.count())) or 0)
        if count >= limit.max_publishes:
            newest = in_window.order_by(LedgerEntry.at.desc(), LedgerEntry.id.desc())
            recent = connection.execute(newest.limit(limit.max_publishes)).all()
            listed = [e.id for e in recent]
            found += _listed(connection, recent, capped, charge, user_id)
            extra = count - len(recent)  # in the window, summed below: counted by markers
            if recent:
                extra_at = recent[-1].at
    if since is None and not listed:  # all the user's rows: their total, one row
        if total is None:
            total = _total(connection.execute(_TOTAL, {"user_id": user_id}).first())
        mine = total
    else:
        rest = _MINE if since is None else _MINE_SINCE
        if listed:
            rest = rest.where(_LEDGER.c.id.not_in(listed))
        row = connection.execute(rest, {"user_id": user_id, "since": since}).one()
        mine = _total(row)  # sums of no rows are 0, their newest NULL
    newest_at = mine[3]
    if newest_at is not None:
        found.append(charge(newest_at, user_id, (), *mine[:3]))
        if limit is not None and newest_at > request.at - policies.parse_period(limit.window):
            extra -= 1  # the sum itself sits in the rate window
    # Zero-cost markers, so that the rate limit counts the summed rows of its window too.
    found += [charge(extra_at, user_id, (), 0, 0, 0) for _ in range(max(extra, 0))]
    for dataset_id, cap_since in sorted(scope.datasets.items()):
        touching = select(LedgerEntry).where(reads(dataset_id))
        if cap_since is not None:
            touching = touching.where(LedgerEntry.at >= cap_since)
        if listed:  # not the rows passed one by one above
            touching = touching.where(LedgerEntry.id.not_in(listed))
        eps, rho, tv, newest = connection.execute(touching.with_only_columns(*_SUMS)).one()
        if newest is not None:
            found.append(charge(newest, 0, (dataset_id,), int(eps), int(rho), int(tv)))
    return _Ledger(found, mine, bool(listed), count)


def _listed(
    connection: Connection,
    rows: Sequence[Any],
    capped: dict[int, str],
    charge: Any,
    user_id: int,
) -> list[policies.Charge]:
    """Rows passed one by one (``ledger_entries`` rows), each listing the capped datasets it
    read by name too."""
    named: dict[int, set[int]] = {}
    if capped and rows:
        index = select(LedgerEntryDataset).where(
            LedgerEntryDataset.ledger_id.in_([e.id for e in rows]),
            LedgerEntryDataset.dataset_name.in_(list(capped.values())),
        )
        by_name = {name: dataset_id for dataset_id, name in capped.items()}
        for row in connection.execute(index):
            named.setdefault(row.ledger_id, set()).add(by_name[str(row.dataset_name)])
    return [
        charge(
            e.at,
            user_id,
            tuple(sorted(set(e.dataset_ids) | named.get(e.id, set()))),
            e.epsilon_units,
            e.rho_units,
            e.tv_units,
        )
        for e in rows
    ]


def _total(row: Any) -> tuple[int, int, int, datetime | None]:
    """A ledger total as :func:`_load` uses it (no row or NULLs: nothing spent)."""
    if row is None or row[3] is None:
        return (0, 0, 0, None)
    return (int(row[0]), int(row[1]), int(row[2]), row[3])

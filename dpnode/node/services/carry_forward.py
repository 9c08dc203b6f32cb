"""Carrying spending forward: what the budget mark holds and the database lacks, into the ledger.

After a restore of an older backup (or a rolled-back upgrade) the database holds less privacy
spending than the mark (``dpnode.node.services.spending_mark``), and the node refuses
publishes. :func:`carry_forward` appends one audited ledger row per user and per dataset name
that is behind, charging what is missing, then settles the mark at the new totals: spent
epsilon never goes down. A dataset's row is charged to the admin running it (a ledger row
names a user), paid from the dataset's cap alone (``cap_only``): it counts against the cap,
not against that admin's own budget.

It takes the database's write lock (SQLite) or the ledger's table lock (PostgreSQL) before
the mark's lock, the order a charge takes them in, so that it can run while node processes
serve. :func:`adopt` makes a new mark from the database, for a node that never had one or
whose mark was lost: the operator vouches that the database is current, and it is audited.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, text

from dpnode.core.errors import BudgetMarkError, ConflictError, NotFoundError
from dpnode.node.db.base import table_of, utcnow
from dpnode.node.db.models import Dataset, LedgerEntry, LedgerEntryDataset, Role, User
from dpnode.node.db.session import serial_engine
from dpnode.node.services import audit
from dpnode.node.services.mark_file import at_least, sub
from dpnode.node.services.spending_mark import (
    Amount,
    Gap,
    MarkState,
    find_gap,
    live_leases,
    locked,
    read_state,
    read_totals,
    write_state,
)

__all__ = ["Carried", "adopt", "carry_forward"]

#: The mechanism of a carried-forward ledger row.
MECHANISM = "carry_forward"
_LEDGER = table_of(LedgerEntry)
_READS = table_of(LedgerEntryDataset)


@dataclass(frozen=True)
class Carried:
    """What :func:`carry_forward` found and wrote."""

    gap: Gap
    #: ledger row id by mark key
    rows: dict[str, int]
    #: keys of users the database no longer has (restored from before they existed)
    dropped: list[str]


@contextmanager
def _serialised(engine: Engine) -> Iterator[Connection]:
    """A transaction that charges wait for (and that waits for charges in flight)."""
    with serial_engine(engine).connect() as connection:
        connection.begin()  # BEGIN IMMEDIATE on SQLite
        if connection.dialect.name != "sqlite":
            connection.execute(text("LOCK TABLE ledger_entries IN SHARE ROW EXCLUSIVE MODE"))
        try:
            yield connection
        except BaseException:
            connection.rollback()
            raise
        connection.commit()


def _account(connection: Connection, email: str | None) -> tuple[int, str]:
    users = table_of(User)
    query = select(users.c.id, users.c.email).where(users.c.role == Role.ADMIN)
    if email is not None:
        query = query.where(users.c.email == email.strip().lower())
    row = connection.execute(query.order_by(users.c.id).limit(1)).first()
    if row is None:
        raise NotFoundError(
            f"no admin account{f' {email}' if email else ''} to charge datasets' missing "
            "spending to: create one (dpnode user add --role admin) or name one with --admin"
        )
    return int(row[0]), str(row[1])


def _row(
    connection: Connection,
    user_id: int,
    amount: Amount,
    detail: dict[str, object],
    *,
    cap_only: bool = False,
) -> int:
    values = {
        "at": utcnow(),
        "user_id": user_id,
        "mechanism": MECHANISM,
        "epsilon_units": amount[0],
        "rho_units": amount[1],
        "tv_units": amount[2],
        "dataset_ids": [],
        "graph_hash": None,
        "detail": detail,
        "policy_revision": None,
        "run_id": None,
        "cap_only": cap_only,
    }
    return int(connection.execute(insert(_LEDGER).returning(_LEDGER.c.id), values).scalar_one())


def carry_forward(
    engine: Engine, path: Path, *, operator: str, reason: str, admin_email: str | None = None
) -> Carried:
    """Append the spending the database lacks against the mark at ``path`` and settle the
    mark; nothing when the database is not behind.

    Args:
        engine: the node's database.
        path: the budget mark.
        operator: who runs it (the audit log says so), ``reason`` why.
        admin_email: the admin account datasets' missing spending is charged to (the first
            admin when ``None``).

    Raises:
        BudgetMarkError: the mark is missing or corrupt (see :func:`adopt`).
        NotFoundError: a dataset is behind and there is no such admin account.
    """
    with _serialised(engine) as connection, locked(path):
        state = read_state(path)
        if state is None:
            raise _missing(path)
        totals = read_totals(connection)
        running = live_leases(path)
        gap = find_gap(state, totals, running)
        if not gap.behind:
            return Carried(gap, {}, [])
        users = table_of(User)
        known = {int(i) for (i,) in connection.execute(select(users.c.id))}
        rows: dict[str, int] = {}
        dropped: list[str] = []
        detail: dict[str, Any] = {"reason": reason, "operator": operator, "mark": str(path)}
        for key, amount in sorted(gap.missing.items()):
            kind, _, name = key.partition(":")
            if kind == "user":
                if int(name) not in known:
                    dropped.append(key)
                    continue
                rows[key] = _row(connection, int(name), amount, {**detail, "key": key})
                continue
            admin_id, email = _account(connection, admin_email)
            charged = {**detail, "key": key, "charged_to": email}
            ident = _row(connection, admin_id, amount, charged, cap_only=True)
            datasets = table_of(Dataset)
            found = connection.scalar(select(datasets.c.id).where(datasets.c.name == name))
            dataset_id = 0 if found is None else int(found)  # 0: none of that name now
            connection.execute(
                insert(_READS), {"ledger_id": ident, "dataset_id": dataset_id, "dataset_name": name}
            )
            rows[key] = ident
        for key, ident in rows.items():
            amount = gap.missing[key]
            audit.append(
                connection,
                None,
                "budget.carry_forward",
                target_type="ledger",
                target_id=ident,
                key=key,
                epsilon_units=amount[0],
                rho_units=amount[1],
                tv_units=amount[2],
                **detail,
            )
        if dropped:
            audit.append(connection, None, "budget.carry_forward_dropped", keys=dropped, **detail)
        after = read_totals(connection)
        live = {t: taken for t, taken in state.leases.items() if t not in gap.stale}
        settled = {k: v for k, v in state.settled.items() if k not in dropped}
        # A key carried forward (or a stopped process's) now holds at least its old ceiling;
        # live leases keep their share of it (they move what they charge into ``settled``).
        stale = {k for t in gap.stale for k in state.leases[t]}
        for key in (gap.missing.keys() | stale) - set(dropped):
            held = after.amounts.get(key, (0, 0, 0))
            for taken in live.values():
                held = sub(held, taken.get(key, (0, 0, 0)))
            settled[key] = at_least(settled.get(key, (0, 0, 0)), held)
        # what was forfeited under a key carried forward is in its ledger now
        forfeited = {k: v for k, v in state.forfeited.items() if k not in gap.missing}
        # Written before the commit: should the commit fail, the mark is ahead and the next
        # run carries exactly what is still missing.
        verified = state.verified & running
        write_state(path, MarkState(after.sequence, settled, live, forfeited, verified))
        return Carried(gap, rows, dropped)


def _missing(path: Path) -> BudgetMarkError:
    return BudgetMarkError(
        f"there is no budget mark at {path}: if this node never had one, or it was lost and "
        "you are sure the database holds all spending, adopt the database as the mark with "
        "--new-mark --reason '...' (audited)"
    )


def adopt(engine: Engine, path: Path, *, operator: str, reason: str) -> MarkState:
    """Replace the mark at ``path`` (missing, corrupt or not) with the database's totals.

    Whatever the database lacks is then forgotten: the operator vouches for it (audited).

    Raises:
        ConflictError: node processes are running (stop them first).
    """
    with _serialised(engine) as connection, locked(path):
        live = live_leases(path)
        if live:
            raise ConflictError(
                f"{len(live)} node process(es) use the budget mark {path}: stop the node "
                "before adopting a new mark"
            )
        totals = read_totals(connection)
        state = MarkState(totals.sequence, dict(totals.amounts), {})
        audit.append(
            connection,
            None,
            "budget.mark_adopted",
            target_type="ledger",
            target_id=totals.sequence,
            reason=reason,
            operator=operator,
            mark=str(path),
        )
        write_state(path, state)
        return state

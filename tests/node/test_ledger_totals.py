"""Each user's ledger total, kept by the database, equals the sum of their ledger rows: after
charges, refusals, rows inserted directly, a concurrent burst and an upgrade of a database
that already had a ledger; and a total beyond 64 bits is refused, not rounded."""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from alembic import command
from sqlalchemy import Connection, func, insert, inspect, select, text
from sqlalchemy.exc import DBAPIError

from dpnode.core.errors import PolicyRefusedError
from dpnode.node.context import NodeContext
from dpnode.node.db.migrate import alembic_config, check, upgrade
from dpnode.node.db.models import LedgerEntry, LedgerTotal, User
from dpnode.node.services import budget, budget_status, charge_lock
from dpnode.node.services.budget import Cost
from tests.conftest import make_user

TENTH = 10**8  # epsilon 0.1 in ledger units


def _sums(context: NodeContext) -> dict[int, tuple[int, int, int, datetime]]:
    """Every user's rows summed as the ledger has them, and as their total has them."""
    e = LedgerEntry
    query = select(
        e.user_id,
        func.sum(e.epsilon_units),
        func.sum(e.rho_units),
        func.sum(e.tv_units),
        func.max(e.at),
    ).group_by(e.user_id)
    t = LedgerTotal
    totals = select(t.user_id, t.epsilon_units, t.rho_units, t.tv_units, t.newest_at)
    with context.sessions() as session:
        summed = {row[0]: tuple(row[1:]) for row in session.execute(query)}
        kept = {row[0]: tuple(row[1:]) for row in session.execute(totals)}
    assert kept == summed
    return kept  # type: ignore[return-value]


def _row(user: User, at: datetime, epsilon: int, rho: int = 0, tv: int = 0) -> dict[str, object]:
    return {
        "at": at,
        "user_id": user.id,
        "mechanism": "laplace",
        "epsilon_units": epsilon,
        "rho_units": rho,
        "tv_units": tv,
        "dataset_ids": [],
        "detail": {},
    }


def test_totals_follow_charges_refusals_and_rows_inserted_directly(
    context: NodeContext, scientist: User, owner: User
) -> None:
    assert _sums(context) == {}
    rng = np.random.default_rng(0)
    for step in range(30):
        user = scientist if step % 3 else owner
        cost = Cost(
            "laplace" if step % 2 else "gaussian",
            epsilon_units=int(rng.integers(1, 5)) * TENTH if step % 2 else 0,
            rho_units=0 if step % 2 else int(rng.integers(1, 10**6)),
            tv_units=int(rng.integers(0, 10**12)),
            asked_epsilon_units=TENTH,
        )
        # Once the default budget is spent a charge is refused: nothing written, nothing added.
        with contextlib.suppress(PolicyRefusedError):
            budget.charge(context.serial_sessions, context.settings, user.id, cost)
    # Rows out of date order (an older row after a newer one) keep the newest date.
    now = datetime.now(UTC)
    with context.engine.begin() as connection:
        connection.execute(insert(LedgerEntry), _row(owner, now + timedelta(days=1), 7))
        connection.execute(insert(LedgerEntry), _row(owner, now - timedelta(days=9), 5, 3, 2))
    totals = _sums(context)
    assert totals[owner.id][3] == now + timedelta(days=1)
    # What the budget check reads is the ledger's sum.
    with context.sessions() as session:
        status = budget_status.budget_of(session, context.settings, scientist.id)
    assert status.status.spent.epsilon_units == totals[scientist.id][0]


def test_a_concurrent_burst_keeps_the_totals_exact(context: NodeContext) -> None:
    people = [make_user(context, f"burst{i}@example.org", "data_scientist") for i in range(3)]

    def charge(i: int) -> bool:
        cost = Cost("laplace", epsilon_units=(i % 4 + 1) * TENTH, tv_units=i)
        try:
            budget.charge(context.serial_sessions, context.settings, people[i % 3].id, cost)
        except PolicyRefusedError:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        done = list(pool.map(charge, range(60)))
    assert any(done)
    totals = _sums(context)
    for person in people:
        # The default budget (10) is never overspent, read from the totals.
        assert totals[person.id][0] <= 10 * 10**9


def test_a_total_beyond_64_bits_is_refused(context: NodeContext, scientist: User) -> None:
    now = datetime.now(UTC)
    with context.engine.begin() as connection:
        connection.execute(insert(LedgerEntry), _row(scientist, now, 2**63 - 2))
    with pytest.raises(DBAPIError), context.engine.begin() as connection:
        connection.execute(insert(LedgerEntry), _row(scientist, now, 2))
    assert _sums(context)[scientist.id][0] == 2**63 - 2


def test_an_upgrade_sums_the_ledger_that_was_there(
    context: NodeContext, scientist: User, owner: User
) -> None:
    url = context.settings.resolved_database_url
    context.engine.dispose()
    command.downgrade(alembic_config(url), "0003")
    now = datetime.now(UTC)
    rows = [_row(scientist, now - timedelta(hours=i), i * TENTH, i, 10 * i) for i in range(5)]
    rows.append(_row(owner, now, TENTH))
    with context.engine.begin() as connection:
        assert "ledger_totals" not in _tables(connection)
        connection.execute(insert(LedgerEntry), rows)
    context.engine.dispose()
    upgrade(url)
    totals = _sums(context)
    assert totals[scientist.id] == (10 * TENTH, 10, 100, now)
    assert totals[owner.id] == (TENTH, 0, 0, now)
    # And the trigger is back: the next row is added.
    budget.charge(
        context.serial_sessions, context.settings, owner.id, Cost("laplace", epsilon_units=TENTH)
    )
    assert _sums(context)[owner.id][0] == 2 * TENTH


def _tables(connection: Connection) -> set[str]:
    return set(inspect(connection).get_table_names())


def test_the_models_match_the_migrations(context: NodeContext) -> None:
    check(context.settings.resolved_database_url)
    with context.engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM ledger_totals")).scalar() == 0


def test_a_charge_reads_the_total_a_charge_it_waited_for_committed(
    context: NodeContext, scientist: User
) -> None:
    """Forced interleaving: a charge holds the user's lock and writes a ledger row; a second
    charge waits for the lock; the first commits. What the second reads (its total, hence its
    decision) has the first's row, on both databases: on PostgreSQL the lock waits in its own
    statement, and a statement reading the total with the lock would have read it as of
    before its wait."""
    at = datetime.now(UTC)
    first = context.serial_sessions()
    try:
        charge_lock.lock(first, scientist.id, [])
        first.connection().execute(insert(LedgerEntry), [_row(scientist, at, 3 * TENTH)])
        with ThreadPoolExecutor(1) as pool:

            def second() -> tuple[int, int, int, datetime | None]:
                with context.serial_sessions() as session:
                    return charge_lock.lock(session, scientist.id, []).total

            waiting = pool.submit(second)
            with contextlib.suppress(TimeoutError):
                waiting.result(timeout=0.5)  # it waits for the lock (SQLite: its BEGIN)
            assert not waiting.done()
            first.commit()
            total = waiting.result(timeout=30)
    finally:
        first.close()
    assert total[0] == 3 * TENTH and total[3] is not None

"""A charge's commit skips the fsync only when the budget mark covers it: on SQLite a covered
charge commits with ``synchronous=NORMAL``, anything else with ``FULL`` or a sync of the log
after it; and a power loss that takes the last charges back refunds nothing: the node
refuses until carry-forward charges at least what was lost (docs/privacy.md)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, func, select

from dpnode.core.errors import BudgetExceededError, BudgetMarkBehindError
from dpnode.node.context import NodeContext
from dpnode.node.db.models import LedgerEntry, User
from dpnode.node.services import budget, datasets
from dpnode.node.services.budget import Cost
from dpnode.node.services.carry_forward import carry_forward
from dpnode.node.services.datasets import DatasetUpload
from dpnode.node.services.spending_mark import read_totals, user_key
from dpnode.node.services.tabular import ColumnSpec
from dpnode.node.settings import Settings
from tests.conftest import REPO_ROOT

ONE = 10**9  # epsilon 1 in ledger units


def _dataset(context: NodeContext, owner: User) -> int:
    spec = ColumnSpec(bounds={"x": (0, 1)}, categories={})
    upload = DatasetUpload("d", "", [], spec, ["x"], {"x": np.zeros(10)})
    with context.sessions() as session:
        return datasets.create_dataset(session, context.store, owner, upload, max_elements=100).id


def _charge(context: NodeContext, user: User, dataset_id: int, *, mark: bool = True) -> None:
    cost = Cost("laplace", ONE, dataset_ids=[dataset_id])
    budget.charge(
        context.serial_sessions,
        context.settings,
        user.id,
        cost,
        mark=context.mark if mark else None,
    )


@contextmanager
def _commits(context: NodeContext) -> Iterator[list[str]]:
    """How each commit on the node's engine meets the disk, read on its connection just
    before it commits: SQLite's ``synchronous`` (1 NORMAL, 2 FULL), PostgreSQL's
    ``synchronous_commit``."""
    seen: list[str] = []
    sqlite = context.engine.dialect.name == "sqlite"

    def at_commit(conn: Any) -> None:
        cursor = conn.connection.dbapi_connection.cursor()
        cursor.execute("PRAGMA synchronous" if sqlite else "SHOW synchronous_commit")
        seen.append(str(cursor.fetchone()[0]))
        cursor.close()

    event.listen(context.engine, "commit", at_commit)
    try:
        yield seen
    finally:
        event.remove(context.engine, "commit", at_commit)


@pytest.fixture
def wal_syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The write-ahead-log files this process fsyncs (SQLite's own syncs are not seen)."""
    synced: list[str] = []
    real: Callable[[int], None] = os.fsync

    def counting(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if name.endswith("-wal"):
            synced.append(name)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return synced


def test_a_charge_the_mark_covers_commits_without_fsync_and_others_with_it(
    context: NodeContext, owner: User, scientist: User, wal_syncs: list[str]
) -> None:
    dataset_id = _dataset(context, owner)
    with _commits(context) as seen:
        _charge(context, scientist, dataset_id)  # the mark covers it
        _charge(context, scientist, dataset_id, mark=False)  # nothing covers it
        _charge(context, scientist, dataset_id)  # the connection is relaxed again
    if context.engine.dialect.name == "sqlite":
        assert seen == ["1", "2", "1"]
    else:  # a database server's crash would lose asynchronous commits while the node runs
        assert seen == ["on", "on", "on"]
    assert wal_syncs == []  # SQLite's commits did what was needed, nothing after them


def test_always_keeps_the_fsync_of_every_charge(
    settings: Settings, owner: User, scientist: User
) -> None:
    context = NodeContext.from_settings(settings.model_copy(update={"ledger_fsync": "always"}))
    try:
        dataset_id = _dataset(context, owner)
        with _commits(context) as seen:
            _charge(context, scientist, dataset_id)
        assert seen == (["2"] if context.engine.dialect.name == "sqlite" else ["on"])
    finally:
        context.close()


def test_a_refusal_in_a_relaxed_charge_transaction_is_synced_after_its_commit(
    settings: Settings, owner: User, scientist: User, wal_syncs: list[str]
) -> None:
    context = NodeContext.from_settings(settings.model_copy(update={"default_epsilon_budget": 1}))
    try:
        if context.engine.dialect.name != "sqlite":
            pytest.skip("PostgreSQL commits every charge transaction synchronously")
        dataset_id = _dataset(context, owner)
        _charge(context, scientist, dataset_id)
        assert wal_syncs == []
        with _commits(context) as seen, pytest.raises(BudgetExceededError):
            _charge(context, scientist, dataset_id)  # its audit line commits, relaxed
        assert seen == ["1"]
        assert wal_syncs == [f"{context.engine.url.database}-wal"]  # then made durable
    finally:
        context.close()


_POWER_LOSS = textwrap.dedent(
    """
    import os, sys
    from dpnode.node.context import NodeContext
    from dpnode.node.services import budget
    from dpnode.node.settings import Settings
    settings = Settings(data_dir=sys.argv[1], database_url=sys.argv[2],
                        default_epsilon_budget=float(sys.argv[6]))
    context = NodeContext.from_settings(settings)
    cost = budget.Cost("laplace", 10**9, dataset_ids=[int(sys.argv[4])])
    for _ in range(int(sys.argv[5])):
        budget.charge(context.serial_sessions, settings, int(sys.argv[3]), cost,
                      mark=context.mark)
    os._exit(0)  # the power fails: no clean stop, the reservation is not returned
    """
)


@pytest.mark.parametrize(
    ("allowed", "lost", "carried"),
    [
        # the lost process reserved 1 and 3.5 more (half of the 7 left after it), of which
        # 3 were charged
        (10, 3, 4.5),
        # with 1 left after its first charge it reserved 1.5 (the chunk), then the 0.5 it
        # lacked for the second: never past the budget
        (4, 2, 2),
    ],
)
def test_charges_a_power_loss_takes_back_are_charged_again_before_any_publish(
    settings: Settings,
    admin: User,
    owner: User,
    scientist: User,
    tmp_path: Path,
    allowed: int,
    lost: int,
    carried: float,
) -> None:
    if not settings.database_url.startswith("sqlite"):
        pytest.skip("a power loss takes back relaxed commits on SQLite only")
    settings = settings.model_copy(update={"default_epsilon_budget": allowed})
    database = Path(settings.database_url.removeprefix("sqlite:///"))
    context = NodeContext.from_settings(settings)
    dataset_id = _dataset(context, owner)
    _charge(context, scientist, dataset_id)
    _charge(context, scientist, dataset_id)
    context.close()  # a clean stop: the mark settles at 2
    assert admin.id  # carry-forward charges the dataset's missing spending to an admin
    on_disk = tmp_path / "on-disk.sqlite3"  # what the disk holds when the power fails
    with sqlite3.connect(database) as source, sqlite3.connect(on_disk) as copy:
        source.backup(copy)
    args = [str(settings.data_dir), settings.database_url, str(scientist.id), str(dataset_id)]
    run = [sys.executable, "-c", _POWER_LOSS, *args, str(lost), str(allowed)]
    subprocess.run(run, cwd=REPO_ROOT, check=True, timeout=120)
    for suffix in ("-wal", "-shm"):
        Path(f"{database}{suffix}").unlink(missing_ok=True)
    on_disk.replace(database)  # the charges after the copy never reached the disk

    context = NodeContext.from_settings(settings)
    try:
        with context.engine.connect() as connection:
            assert read_totals(connection).amounts[user_key(scientist.id)][0] == 2 * ONE
        with pytest.raises(BudgetMarkBehindError, match="stopped without returning"):
            _charge(context, scientist, dataset_id)  # a retry of a lost publish, refused
        with context.sessions() as session:
            rows = session.scalar(select(func.count()).select_from(LedgerEntry))
        assert rows == 2  # the refusal charged nothing
        carry_forward(context.engine, settings.budget_mark_path, operator="t", reason="power")
        with context.engine.connect() as connection:
            spent = read_totals(connection).amounts[user_key(scientist.id)][0]
        assert spent >= (2 + lost) * ONE  # at least what the lost commits had charged
        assert spent == round((2 + carried) * ONE) <= allowed * ONE  # and never past the budget
    finally:
        context.close()


def test_a_killed_process_charges_are_synced_before_its_reservation_is_forfeited(
    context: NodeContext, owner: User, scientist: User, wal_syncs: list[str]
) -> None:
    if context.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL commits every charge synchronously")
    dataset_id = _dataset(context, owner)
    _charge(context, scientist, dataset_id)  # this process verified and serves on
    settings = context.settings
    args = [str(settings.data_dir), settings.database_url, str(scientist.id), str(dataset_id)]
    run = [sys.executable, "-c", _POWER_LOSS, *args, "2", "10"]
    subprocess.run(run, cwd=REPO_ROOT, check=True, timeout=120)  # killed after two charges
    assert wal_syncs == []
    replacement = NodeContext.from_settings(settings)
    try:
        _charge(replacement, scientist, dataset_id)  # forfeits the killed one's reservation
    finally:
        replacement.close()
    # its two charges may not be on the disk yet, and once forfeited nothing marks them behind
    assert wal_syncs == [f"{context.engine.url.database}-wal"]

"""The SQLite pragmas every connection gets: WAL, full sync of commits, foreign keys; the
transactions that commit without a sync; and the process's queue of writers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from dpnode.node.context import NodeContext
from dpnode.node.db import session as session_module
from dpnode.node.db.session import make_engine, read_engine, serial_engine


def test_every_connection_is_wal_with_durable_commits(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'node.sqlite3'}")
    try:
        for _ in range(2):  # each new connection, not only the first
            with engine.connect() as conn:
                pragma = conn.exec_driver_sql
                assert pragma("PRAGMA journal_mode").scalar() == "wal"
                assert pragma("PRAGMA synchronous").scalar() == 2  # FULL: a commit syncs the WAL
                assert pragma("PRAGMA foreign_keys").scalar() == 1
            engine.dispose()
    finally:
        engine.dispose()


def test_a_relaxed_transaction_skips_the_sync_and_the_next_one_syncs_again(
    context: NodeContext,
) -> None:
    """A stored answer commits without waiting for the disk; nothing else does, whichever
    pooled connection the relaxed transaction left behind."""
    postgres = context.engine.dialect.name == "postgresql"
    show = "SHOW synchronous_commit" if postgres else "PRAGMA synchronous"
    durable, relaxed = ("on", "off") if postgres else (2, 1)  # FULL, NORMAL

    def setting(sessions: sessionmaker[Session]) -> object:
        with sessions() as session:
            value = session.connection().exec_driver_sql(show).scalar()
            session.commit()
            return value

    for _ in range(3):
        assert setting(context.relaxed_sessions) == relaxed
        assert setting(context.serial_sessions) == durable
        assert setting(context.sessions) == durable
        assert setting(context.read_sessions) == durable


def test_relaxed_and_durable_commits_switch_no_setting_back_and_forth(
    context: NodeContext,
) -> None:
    """On a SQLite file the relaxed transactions have connections of their own: a publish's
    stored answer and its next charge switch no connection between NORMAL and FULL (a
    statement each, on every publish); on PostgreSQL the setting is one transaction's."""
    relaxed = context.relaxed_sessions.kw["bind"]
    postgres = context.engine.dialect.name == "postgresql"
    assert (relaxed.pool is context.engine.pool) == postgres
    switches: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        if "synchronous" in statement.lower():
            switches.append(statement)

    engines = [context.engine] if postgres else [context.engine, relaxed]
    for engine in engines:
        event.listen(engine, "before_cursor_execute", seen)
    try:
        for _ in range(4):
            for sessions in (context.relaxed_sessions, context.serial_sessions):
                with sessions() as session:
                    session.connection().exec_driver_sql("SELECT 1")
                    session.commit()
    finally:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", seen)
    if postgres:  # SET LOCAL, in each relaxed transaction only
        assert switches == ["SET LOCAL synchronous_commit TO OFF"] * 4
    else:  # once, the first time the relaxed connection is used
        assert switches == ["PRAGMA synchronous=NORMAL"]


def _queue(engine: Engine) -> threading.Lock:
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        assert isinstance(raw, session_module._QueuedConnection)
        assert raw.queue is not None
        return raw.queue


def test_writers_queue_in_the_process_and_every_way_a_transaction_ends_passes_the_turn(
    tmp_path: Path,
) -> None:
    """Writers wait for each other on the process's queue, not in SQLite's sleeping busy
    wait; the turn passes on at a commit, a rollback, an error and a connection closed in a
    transaction. Readers (``BEGIN DEFERRED``) never queue."""
    engine = make_engine(f"sqlite:///{tmp_path / 'node.sqlite3'}")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        queue = _queue(engine)
        assert not queue.locked()
        sessions = sessionmaker(serial_engine(engine))
        reads = sessionmaker(read_engine(engine))

        first = sessions()
        first.execute(text("INSERT INTO t VALUES (1)"))
        assert queue.locked()  # the writer holds the turn
        with reads() as reader:  # a reader does not queue behind it
            assert reader.execute(text("SELECT count(*) FROM t")).scalar() == 0
        entered: list[float] = []

        def second_writer() -> None:
            with sessions() as session:
                session.execute(text("INSERT INTO t VALUES (2)"))
                entered.append(time.monotonic())
                session.commit()

        waiting = threading.Thread(target=second_writer)
        waiting.start()
        time.sleep(0.3)
        assert not entered  # queued behind the first writer
        committed = time.monotonic()
        first.commit()
        first.close()
        waiting.join(timeout=10)
        assert entered and entered[0] >= committed
        assert not queue.locked()

        with sessions() as session:  # a rollback
            session.execute(text("INSERT INTO t VALUES (3)"))
            session.rollback()
        assert not queue.locked()
        with pytest.raises(RuntimeError), sessions() as session:  # an error, closed unended
            session.execute(text("INSERT INTO t VALUES (4)"))
            raise RuntimeError("the request failed")
        assert not queue.locked()
        with sessions() as session:  # a read in a write transaction, the session closed
            session.execute(text("SELECT 1"))
        assert not queue.locked()
        with engine.connect() as conn:  # the connection itself closed in a transaction
            conn.exec_driver_sql("SELECT 1")  # begins, IMMEDIATE as every default transaction
            assert queue.locked()
            conn.connection.dbapi_connection.close()
            assert not queue.locked()
            conn.invalidate()
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 2
    finally:
        engine.dispose()


def test_a_writer_that_waits_too_long_in_the_queue_fails_as_sqlite_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It is told "database is locked" (the node's ``503 database_busy``), holds nothing, and
    the next writer proceeds once the lock is free."""
    monkeypatch.setattr(session_module, "BUSY_TIMEOUT_SECONDS", 0.2)
    engine = make_engine(f"sqlite:///{tmp_path / 'node.sqlite3'}")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        sessions = sessionmaker(serial_engine(engine))
        holder = sessions()
        holder.execute(text("INSERT INTO t VALUES (1)"))
        failed: list[BaseException] = []

        def writer() -> None:
            try:
                with sessions() as session:
                    session.execute(text("INSERT INTO t VALUES (2)"))
                    session.commit()
            except OperationalError as exc:
                failed.append(exc)

        thread = threading.Thread(target=writer)
        thread.start()
        thread.join(timeout=10)
        assert len(failed) == 1 and "database is locked" in str(failed[0])
        holder.commit()
        holder.close()
        writer()  # the turn is free again
        assert len(failed) == 1
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 2
    finally:
        engine.dispose()


def test_engines_on_one_file_share_its_queue_and_other_files_do_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'node.sqlite3'}"
    one, two, other = make_engine(url), make_engine(url), make_engine(url + ".other")
    memory = make_engine("sqlite://")
    try:
        assert _queue(one) is _queue(two)
        assert _queue(one) is not _queue(other)
        with memory.connect() as conn:  # one database per connection: nothing to share
            assert conn.connection.dbapi_connection.queue is None
    finally:
        for engine in (one, two, other, memory):
            engine.dispose()

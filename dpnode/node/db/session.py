"""Engines and sessions. SQLite gets the pragmas that make it a dependable embedded database.

On SQLite every transaction begins with ``BEGIN IMMEDIATE``, taking the database's
write lock up front. A deferred transaction that reads and then writes (a login
reads the user, then appends its audit line) cannot wait for the lock once another
writer has committed since its read: SQLite fails it at once with "database is
locked", so a burst of logins or uploads turned into 500s. Taking the lock first
makes concurrent requests queue instead; the price is that SQLite runs one transaction
at a time, so nothing slow (a computation) should run while a session holds a transaction
open. Transactions that only read (a publish's account and inputs) use ``read_engine`` and
begin deferred: they take no lock. PostgreSQL is unaffected.

The queue: SQLite's own wait for a lock (``busy_timeout``) polls it, sleeping 1, 2, 5, 10
and up to 100 ms between tries, so a transaction that finds the lock taken for a fraction
of a millisecond sleeps for at least one, and under load most of the process's writers
sleep while the lock is free. The writers of one process therefore first queue on a lock
of their own (one per database file), which hands over as soon as a transaction commits
or rolls back; only then do they ``BEGIN IMMEDIATE``, which finds SQLite's lock free but
for other processes (the command line, a second node on the same file), for which
``busy_timeout`` still waits. The queue orders; it protects nothing (SQLite's lock does):
a writer that waits more than :data:`BUSY_TIMEOUT_SECONDS` for it fails as SQLite's own
wait would, with "database is locked" (``503 database_busy``).

Durability: WAL with ``synchronous=FULL``, set explicitly (some SQLite builds default
WAL databases to NORMAL). SQLite's documentation: in WAL mode a committed transaction
survives an application crash whatever ``synchronous`` is (a SIGKILLed node loses no
ledger row either way), but with NORMAL the last commits "might roll back following a
power loss or system crash", because the WAL is synced only at checkpoints. A ledger
row forgotten after a power loss would let its epsilon be spent again on results
already released, so the ledger commit pays one fsync of the WAL (~0.2 ms on the dev
box's disk, busy or not; slower disks pay more) before the publish releases anything;
reads (authentication, resolving inputs) write nothing and sync nothing.

Some writes may be lost to a power failure without harm, because a later request can do
without them: a publish's stored answer (lost, the publish's key lapses and its retries are
told it is lost, never released again) and lease renewals. Their transactions use
``relaxed_engine``: on SQLite they commit with ``synchronous=NORMAL`` (no fsync; the WAL is
synced by the next ``FULL`` commit, the ledger's, so no later ledger row can survive a power
loss that an earlier answer did not), on PostgreSQL with ``synchronous_commit`` off for
that transaction (the same guarantee: a crash may lose the last such commits, never
reorder them after a synchronous one). An application crash loses neither.

A charge (the budget check and its ledger row) is one more such write when the budget mark
covers it (``ledger_fsync = "covered"``, the default): the mark holds the charge durably
before the commit, and a node restarted after a power loss refuses publishes until the
missing spending is carried forward, so the lost commit refunds nothing (docs/privacy.md).
Its transaction begins with ``synchronous=NORMAL`` (``RELAXED``); SQLite cannot change the
setting inside a transaction, so a refusal that commits in it (its audit line, a queued
approval request) is made durable after the commit by :func:`sync_wal`. On PostgreSQL a
charge always commits synchronously (a database server that crashes and restarts while the
node runs would lose asynchronous commits without the node noticing).

Transactions that must be serialised (the budget check and its ledger row) use
``serial_engine``: on SQLite their ``BEGIN IMMEDIATE`` takes the write lock up
front, so two checks can never both read the old balance; on PostgreSQL the
service takes a row lock (``SELECT ... FOR UPDATE``) instead. pysqlite's own
implicit transactions are switched off so that SQLAlchemy emits every BEGIN.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BEGIN = "dpnode_sqlite_begin"
#: Execution option: this transaction's commit need not survive a power failure.
RELAXED = "dpnode_relaxed_commit"
#: How long a SQLite transaction waits for the write lock (in this process's queue, then in
#: SQLite's ``busy_timeout`` for other processes) before failing with "database is locked".
BUSY_TIMEOUT_SECONDS = 30.0

#: The write queue of each SQLite database file this process opened, by its real path.
_QUEUES: dict[str, threading.Lock] = {}
_QUEUES_LOCK = threading.Lock()


def _queue_for(url: str) -> threading.Lock | None:
    """The write queue of ``url``'s database file (``None`` in memory: one per connection)."""
    parsed = make_url(url)
    database = parsed.database or ""
    if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
        return None
    path = os.path.realpath(database.removeprefix("file:"))
    with _QUEUES_LOCK:
        return _QUEUES.setdefault(path, threading.Lock())


class _QueuedConnection(sqlite3.Connection):
    """pysqlite's connection, whose write transactions queue in this process first (see the
    module docstring): :meth:`enter_queue` before ``BEGIN IMMEDIATE``, and the turn passes on
    when the transaction commits, rolls back or the connection closes, whoever ends it."""

    queue: threading.Lock | None = None
    _turn = False

    def enter_queue(self, statement: str) -> None:
        if self.queue is None or self._turn:
            return
        if not self.queue.acquire(timeout=BUSY_TIMEOUT_SECONDS):
            locked = sqlite3.OperationalError("database is locked")
            raise OperationalError(statement, None, locked)
        self._turn = True

    def leave_queue(self) -> None:
        if self._turn:
            self._turn = False
            assert self.queue is not None
            self.queue.release()

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self.leave_queue()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self.leave_queue()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.leave_queue()


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url``; for SQLite, enable foreign keys, WAL and a busy timeout."""
    if url.startswith("sqlite"):
        connect_args = kwargs.pop("connect_args", {})
        connect_args.setdefault("check_same_thread", False)
        connect_args.setdefault("timeout", BUSY_TIMEOUT_SECONDS)
        connect_args.setdefault("factory", _QueuedConnection)
        queue = _queue_for(url)
        engine = create_engine(url, connect_args=connect_args, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")  # see the module docstring
            cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_SECONDS * 1000)}")
            cursor.close()
            if isinstance(dbapi_connection, _QueuedConnection):
                dbapi_connection.queue = queue
            record.info[RELAXED] = "FULL"
            # SQLite's own lower() folds ASCII only; catalog search must match 'Ärzte' to
            # 'ärzte' as PostgreSQL does, so lower() is Python's, Unicode-aware.
            dbapi_connection.create_function("lower", 1, _lower, deterministic=True)
            dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN, not pysqlite

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            options = conn.get_execution_options()
            # set on the connection while no transaction is open, and kept until changed
            synchronous = "NORMAL" if options.get(RELAXED) else "FULL"
            info = conn.connection.info
            if info.get(RELAXED) != synchronous:
                conn.exec_driver_sql(f"PRAGMA synchronous={synchronous}")
                info[RELAXED] = synchronous
            begin = f"BEGIN {options.get(SQLITE_BEGIN, 'IMMEDIATE')}"
            raw = conn.connection.dbapi_connection
            queued = isinstance(raw, _QueuedConnection) and begin != "BEGIN DEFERRED"
            if queued:
                raw.enter_queue(begin)
            try:
                conn.exec_driver_sql(begin)
            except BaseException:
                if queued:
                    raw.leave_queue()
                raise

        return engine
    engine = create_engine(url, pool_pre_ping=True, **kwargs)

    @event.listens_for(engine, "begin")
    def _relaxed_begin(conn: Any) -> None:
        if conn.get_execution_options().get(RELAXED):  # for this transaction only
            conn.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")

    return engine


def sync_wal(connection: Connection) -> None:
    """Make what ``connection`` committed durable now, as a ``synchronous=FULL`` commit would
    have: fsync the SQLite database's write-ahead log (Linux syncs a file's data whichever
    descriptor asks). For a transaction begun ``RELAXED`` whose commit must survive a power
    loss. Nothing to do in memory or on PostgreSQL.

    Raises:
        OSError: the log cannot be synced.
    """
    if connection.dialect.name != "sqlite" or _queue_for(str(connection.engine.url)) is None:
        return
    database = os.path.realpath((connection.engine.url.database or "").removeprefix("file:"))
    try:
        fd = os.open(database + "-wal", os.O_RDONLY)
    except FileNotFoundError:  # checkpointed and removed: the frames are in the database file
        fd = os.open(database, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


#: ``Session.connection(execution_options=READ_ONLY)``: the session's next transaction only
#: reads, so on SQLite it begins ``DEFERRED`` (no lock); later ones begin as usual.
READ_ONLY = {SQLITE_BEGIN: "DEFERRED"}


def read_engine(engine: Engine) -> Engine:
    """The same pool, for transactions that only read: on SQLite they begin ``DEFERRED``, so
    they take no lock (in WAL mode a reader neither waits for the writer nor holds it up),
    and may stay open while the caller computes between reads. A transaction that writes must
    not use it (a deferred one cannot always take the write lock later)."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{SQLITE_BEGIN: "DEFERRED"})
    return engine


def relaxed_engine(engine: Engine, **kwargs: Any) -> Engine:
    """For writes whose commit may be lost to a power failure (see the module docstring): it
    commits without waiting for the disk. Never for the ledger.

    On a SQLite file it is a pool of its own (``kwargs``: its options), whose connections
    switch to ``synchronous=NORMAL`` once and stay there: sharing ``engine``'s pool, a
    publish's stored answer and its next charge each switched their connection over (a
    statement each, on every publish). In memory (a database per pool) and on PostgreSQL
    (``SET LOCAL``, one transaction's setting) it shares ``engine``'s pool."""
    if engine.dialect.name == "sqlite" and _queue_for(str(engine.url)) is not None:
        engine = make_engine(engine.url.render_as_string(hide_password=False), **kwargs)
    return engine.execution_options(**{RELAXED: True})


def serial_engine(engine: Engine) -> Engine:
    """The same pool, with transactions that take SQLite's write lock when they begin."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
    return engine

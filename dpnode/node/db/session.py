"""Engines and sessions. SQLite gets the pragmas that make it a dependable embedded database.

On SQLite every transaction begins with ``BEGIN IMMEDIATE``, taking the database's
write lock up front. A deferred transaction that reads and then writes (a login
reads the user, then appends its audit line) cannot wait for the lock once another
writer has committed since its read: SQLite fails it at once with "database is
locked", so a burst of logins or uploads turned into 500s. Taking the lock first
makes concurrent requests queue behind ``busy_timeout`` instead; the price is that
SQLite runs one transaction at a time, so nothing slow (a computation) should run
while a session holds a transaction open. Transactions that only read (a publish's
account and inputs) use ``read_engine`` and begin deferred: they take no lock.
PostgreSQL is unaffected.

Durability: WAL with ``synchronous=FULL``, set explicitly (some SQLite builds default
WAL databases to NORMAL). SQLite's documentation: in WAL mode a committed transaction
survives an application crash whatever ``synchronous`` is (a SIGKILLed node loses no
ledger row either way), but with NORMAL the last commits "might roll back following a
power loss or system crash", because the WAL is synced only at checkpoints. A ledger
row forgotten after a power loss would let its epsilon be spent again on results
already released, so the ledger commit pays one fsync of the WAL (~0.2 ms on the dev
box's disk, busy or not; slower disks pay more) before the publish releases anything;
reads (authentication, resolving inputs) write nothing and sync nothing.

Transactions that must be serialised (the budget check and its ledger row) use
``serial_engine``: on SQLite their ``BEGIN IMMEDIATE`` takes the write lock up
front, so two checks can never both read the old balance; on PostgreSQL the
service takes a row lock (``SELECT ... FOR UPDATE``) instead. pysqlite's own
implicit transactions are switched off so that SQLAlchemy emits every BEGIN.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BEGIN = "dpnode_sqlite_begin"


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url``; for SQLite, enable foreign keys, WAL and a busy timeout."""
    if url.startswith("sqlite"):
        connect_args = kwargs.pop("connect_args", {})
        connect_args.setdefault("check_same_thread", False)
        connect_args.setdefault("timeout", 30)
        engine = create_engine(url, connect_args=connect_args, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")  # see the module docstring
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()
            # SQLite's own lower() folds ASCII only; catalog search must match 'Ärzte' to
            # 'ärzte' as PostgreSQL does, so lower() is Python's, Unicode-aware.
            dbapi_connection.create_function("lower", 1, _lower, deterministic=True)
            dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN, not pysqlite

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            mode = conn.get_execution_options().get(SQLITE_BEGIN, "IMMEDIATE")
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def read_engine(engine: Engine) -> Engine:
    """The same pool, for transactions that only read: on SQLite they begin ``DEFERRED``, so
    they take no lock (in WAL mode a reader neither waits for the writer nor holds it up),
    and may stay open while the caller computes between reads. A transaction that writes must
    not use it (a deferred one cannot always take the write lock later)."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{SQLITE_BEGIN: "DEFERRED"})
    return engine


def serial_engine(engine: Engine) -> Engine:
    """The same pool, with transactions that take SQLite's write lock when they begin."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(**{SQLITE_BEGIN: "IMMEDIATE"})
    return engine

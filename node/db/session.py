"""Engines and sessions. SQLite gets the pragmas that make it a dependable embedded database."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


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
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.close()
            # SQLite's own lower() folds ASCII only; catalog search must match 'Ärzte' to
            # 'ärzte' as PostgreSQL does, so lower() is Python's, Unicode-aware.
            dbapi_connection.create_function("lower", 1, _lower, deterministic=True)

        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)

"""The SQLite pragmas every connection gets: WAL, full sync of commits, foreign keys; and the
transactions that commit without a sync."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from dpnode.node.context import NodeContext
from dpnode.node.db.session import make_engine


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

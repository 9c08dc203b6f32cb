"""The SQLite pragmas every connection gets: WAL, full sync of commits, foreign keys."""

from __future__ import annotations

from pathlib import Path

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

"""Ids are never reused: on SQLite each table with an id of its own is AUTOINCREMENT

Without AUTOINCREMENT SQLite gives a new row the largest id of its table plus one: deleting
the newest dataset gave its id to the next upload, and an approval or a ledger filter naming
the deleted dataset named the new one. SQLite cannot add AUTOINCREMENT to a table, so each is
copied into a new one (batch mode, ``recreate="always"``) with its rows, indexes and
constraints; SQLite drops a table's triggers with it (the append-only ones, the ledger
totals'), so they are created again as they were. env.py runs migrations with foreign keys
off: with them on, dropping a table that others refer to would delete their rows.

Each table's sequence starts at its largest id. For datasets and models it starts at least at
the largest id the audit log (which records every upload) or the ledger names, so that the id
of one deleted before this migration is not given again either. (The node deletes dataset
columns, model tensors and publish keys too, but nothing outside their rows names their ids.)

PostgreSQL's sequences never reuse an id: nothing changes there.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 10:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The tables whose rows have an id of their own, in the order they were created.
_TABLES = (
    "users",
    "audit_events",
    "datasets",
    "models",
    "dataset_columns",
    "model_tensors",
    "ledger_entries",
    "budget_grants",
    "policy_revisions",
    "budget_requests",
    "publish_approvals",
    "publish_keys",
)

#: Where the database names ids of rows the node has deleted.
_NAMED_ELSEWHERE = {
    "datasets": (
        "SELECT max(target_id) FROM audit_events WHERE target_type = 'dataset'",
        "SELECT max(dataset_id) FROM ledger_entry_datasets",
    ),
    "models": ("SELECT max(target_id) FROM audit_events WHERE target_type = 'model'",),
}


def upgrade() -> None:
    if not _sqlite():
        return
    for table in _TABLES:
        _rebuild(table, autoincrement=True)
        _start_sequence(table)


def downgrade() -> None:
    if not _sqlite():
        return
    for table in reversed(_TABLES):
        _rebuild(table, autoincrement=False)
    sequences = sa.table("sqlite_sequence", sa.column("name", sa.String))
    op.get_bind().execute(sa.delete(sequences).where(sequences.c.name.in_(_TABLES)))


def _sqlite() -> bool:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        return False
    if bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # Dropping a table others refer to would delete their rows (ON DELETE CASCADE).
        raise RuntimeError(
            "rebuilding SQLite tables needs foreign keys off (env.py turns them off unless "
            "the connection it is given is already in a transaction)"
        )
    return True


def _rebuild(table: str, *, autoincrement: bool) -> None:
    """Copy ``table`` into a new one, with or without AUTOINCREMENT, and its triggers."""
    bind = op.get_bind()
    found = sa.text(
        "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = :table ORDER BY rowid"
    )
    triggers = list(bind.execute(found, {"table": table}).scalars())
    with op.batch_alter_table(
        table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}
    ):
        pass
    for sql in triggers:
        bind.exec_driver_sql(sql)  # verbatim: text() would read a ':name' in it as a parameter


def _start_sequence(table: str) -> None:
    """Start ``table``'s sequence at its largest id, or the largest named elsewhere."""
    bind = op.get_bind()
    queries = (f"SELECT max(id) FROM {table}", *_NAMED_ELSEWHERE.get(table, ()))
    start = max(bind.exec_driver_sql(query).scalar() or 0 for query in queries)
    sequences = sa.table("sqlite_sequence", sa.column("name", sa.String), sa.column("seq"))
    bind.execute(sa.delete(sequences).where(sequences.c.name == table))
    if start:
        bind.execute(sa.insert(sequences).values(name=table, seq=start))

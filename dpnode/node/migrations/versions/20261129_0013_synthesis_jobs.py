"""Synthesis jobs: a charged synthesis runs in the background, its state and progress kept

A new table only: no existing row changes.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 14:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    when = sa.DateTime(timezone=True)
    op.create_table(
        "synthesis_jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("source_id", sa.Integer(), nullable=False),
        sa.Column("ledger_id", sa.Integer(), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", when, nullable=False),
        sa.Column("updated_at", when, nullable=False),
        sa.Column("lease_until", when, nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_synthesis_jobs_user_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["ledger_id"],
            ["ledger_entries.id"],
            name=op.f("fk_synthesis_jobs_ledger_id_ledger_entries"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_synthesis_jobs")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_synthesis_jobs_user_id"), "synthesis_jobs", ["user_id"])
    op.create_index(op.f("ix_synthesis_jobs_state"), "synthesis_jobs", ["state"])


def downgrade() -> None:
    op.drop_index(op.f("ix_synthesis_jobs_state"), table_name="synthesis_jobs")
    op.drop_index(op.f("ix_synthesis_jobs_user_id"), table_name="synthesis_jobs")
    op.drop_table("synthesis_jobs")

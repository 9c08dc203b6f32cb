"""Approval detail: what a waiting publish computes, for the admin who answers it

A pending publish keeps a bounded listing of its graph (pseudo-torch, inputs named by dataset
and column), its tracked sensitivity, mechanism and noise scale, so that an admin sees what
they approve. Rows queued before have none (NULL).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-29 10:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("publish_approvals", schema=None) as batch_op:
        batch_op.add_column(sa.Column("detail", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("publish_approvals", schema=None) as batch_op:
        batch_op.drop_column("detail")

"""Publish leases: a charged publish whose node process stopped is lost, not running forever

``publish_keys.lease_until``: until when the node process computing a charged publish vouches
for it (renewed while it runs). Rows written before have none and stay running until purged.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26 03:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("publish_keys", schema=None) as batch_op:
        batch_op.add_column(sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("publish_keys", schema=None) as batch_op:
        batch_op.drop_column("lease_until")

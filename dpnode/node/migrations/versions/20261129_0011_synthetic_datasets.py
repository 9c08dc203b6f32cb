"""Synthetic datasets: a dataset may carry its provenance (``datasets.provenance``)

A dataset made by the node from a differentially private synthesis records where it came
from (source, method, epsilon, delta, rows, ledger row) in a nullable JSON column; uploaded
datasets keep ``NULL``. Adding a nullable column changes no row: a plain ``ADD COLUMN`` on
both databases (batch mode would copy the table and, on SQLite, lose its AUTOINCREMENT).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-29 10:55:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("datasets", sa.Column("provenance", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("datasets", "provenance")

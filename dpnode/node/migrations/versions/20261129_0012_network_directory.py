"""A network of nodes: join tokens and members (on a network), memberships (on a member)

A network (``dpnode serve --network``) keeps the digests of the join tokens its admin issued
and its members with their public catalogs; a member node keeps the networks it joined and
the credential it presents to each. New tables only: no existing row changes.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29 13:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "network_join_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("note", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=320), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("used_by", sa.String(length=100), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_network_join_tokens")),
        sa.UniqueConstraint("digest", name=op.f("uq_network_join_tokens_digest")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "network_members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("url", sa.String(length=300), nullable=False),
        sa.Column("credential_digest", sa.String(length=64), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("catalog", sa.JSON(), nullable=False),
        sa.Column("catalog_digest", sa.String(length=64), nullable=False),
        sa.Column("catalog_updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_network_members")),
        sa.UniqueConstraint("credential_digest", name=op.f("uq_network_members_credential_digest")),
        sa.UniqueConstraint("name", name=op.f("uq_network_members_name")),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "network_memberships",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("network_url", sa.String(length=300), nullable=False),
        sa.Column("member_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("url", sa.String(length=300), nullable=False),
        sa.Column("credential", sa.String(length=100), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_result", sa.String(length=300), nullable=False),
        sa.Column("last_ok_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_network_memberships")),
        sa.UniqueConstraint("network_url", name=op.f("uq_network_memberships_network_url")),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("network_memberships")
    op.drop_table("network_members")
    op.drop_table("network_join_tokens")

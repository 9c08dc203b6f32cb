"""Alembic environment: the URL comes from dpnode's settings unless the caller set one."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from node.db import models  # noqa: F401  (registers the tables on Base.metadata)
from node.db.base import Base, UTCDateTime
from node.db.session import make_engine
from node.settings import get_settings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url


def _render_item(type_: str, obj: object, autogen_context: object) -> str | bool:
    # Migrations must not import application types: render UTCDateTime as its implementation.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        compare_type=True,
        render_item=_render_item,
        render_as_batch=True,  # SQLite alters tables by copying them
    )


def run_migrations_offline() -> None:
    _configure(url=_url())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _configure(conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

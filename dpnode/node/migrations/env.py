"""Alembic environment: the URL comes from dpnode's settings unless the caller set one."""

from __future__ import annotations

from typing import Literal

from alembic import context
from alembic.autogenerate.api import AutogenContext
from sqlalchemy import Connection

from dpnode.node.db import models  # noqa: F401  (registers the tables on Base.metadata)
from dpnode.node.db.base import Base, UTCDateTime
from dpnode.node.db.session import make_engine
from dpnode.node.settings import get_settings

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url


def _render_item(type_: str, obj: object, autogen_context: AutogenContext) -> str | Literal[False]:
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


def _foreign_keys(connection: Connection, on: bool | None = None) -> bool:
    """SQLite's ``foreign_keys`` pragma, set to ``on`` first unless ``None``. Outside a
    transaction only (inside one SQLite ignores it): through the driver's connection, which
    does not begin one as SQLAlchemy's would."""
    driver = connection.connection.driver_connection
    assert driver is not None
    if on is not None:
        driver.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")
    return bool(driver.execute("PRAGMA foreign_keys").fetchone()[0])


def _migrate(connection: Connection) -> None:
    """Run the migrations in one transaction. On SQLite with foreign keys off, as SQLite's
    own procedure for altering a table asks: a table rebuilt in batch mode is dropped and
    created again, and with them on, dropping a table others refer to would delete their
    rows (``ON DELETE CASCADE``) or fail. They are checked before the transaction commits,
    when a migration ran (the check reads every row that has a foreign key)."""
    sqlite = connection.dialect.name == "sqlite" and not connection.in_transaction()
    enforced = sqlite and _foreign_keys(connection)
    _configure(connection)
    if enforced:
        _foreign_keys(connection, on=False)
    try:
        with context.begin_transaction():
            before = context.get_context().get_current_heads()
            context.run_migrations()
            if enforced and context.get_context().get_current_heads() != before:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                if broken:
                    raise RuntimeError(f"the migrated database breaks foreign keys: {broken}")
    finally:
        if enforced:
            _foreign_keys(connection, on=True)


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _migrate(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

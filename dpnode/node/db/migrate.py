"""Run Alembic from code: the CLI, the container's prestart step and the tests use this."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic config for ``url`` that finds the migrations shipped with dpnode."""
    if not (MIGRATIONS_DIR / "env.py").exists():
        raise RuntimeError(f"dpnode's migrations are missing: expected them in {MIGRATIONS_DIR}")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation treats '%' specially (URL-encoded passwords contain it).
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` up to ``revision``."""
    command.upgrade(alembic_config(url), revision)


def check(url: str) -> None:
    """Raise if the models and the migrations disagree (``alembic check``)."""
    command.check(alembic_config(url))

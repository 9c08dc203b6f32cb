"""Backups of a node, and restoring one: the database, the blob files, the token secret.

A backup is a folder: ``database.sqlite3`` (SQLite's online backup API, consistent while the
node serves) or ``database.pgdump`` (``pg_dump`` in its custom format, one snapshot), then
``blobs/`` (the file store's content-addressed files; copied after the database, so every
blob the database names is there: a blob is stored before the rows that name it commit),
and ``manifest.json``. Chunked uploads in progress are not kept (a client resumes or starts
again). With the S3 store the bucket holds the blobs and is backed up as a bucket (its
objects are named by their hash and never rewritten).

The budget mark (``dpnode.node.services.spending_mark``) is never in a backup, and a
restore never touches it: it is how the node notices that a restored database lacks
spending, and refuses publishes until ``dpnode budget carry-forward``.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, make_url, text

from dpnode import __version__
from dpnode.core.errors import ConflictError, InvalidRequestError
from dpnode.node.db.base import utcnow
from dpnode.node.services.spending_mark import live_leases
from dpnode.node.settings import Settings

__all__ = ["MANIFEST", "Manifest", "backup", "restore"]

MANIFEST = "manifest.json"
FORMAT = "dpnode-backup/1"
_SQLITE = "database.sqlite3"
_PGDUMP = "database.pgdump"
#: Files of the data folder a backup keeps besides the database and the blobs.
_KEPT = ("token-secret",)


@dataclass(frozen=True)
class Manifest:
    """What a backup holds."""

    created_at: str
    version: str
    database: str
    schema_revision: str | None
    ledger_sequence: int
    blob_store: str
    blobs: int

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **self.__dict__}


def _sqlite_path(url: str) -> Path:
    database = make_url(url).database
    if not database or database == ":memory:":
        raise InvalidRequestError("an in-memory SQLite database cannot be backed up or restored")
    return Path(database)


def _libpq(url: str) -> tuple[str, dict[str, str]]:
    """``url`` as libpq reads it, its password passed in the environment (not in argv)."""
    parsed = make_url(url)
    env = dict(os.environ)
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    plain = parsed.set(drivername="postgresql", password=None)
    return plain.render_as_string(hide_password=False), env


def _tool(name: str, bin_dir: Path | None) -> str:
    found = str(bin_dir / name) if bin_dir is not None else shutil.which(name)
    if found is None or not Path(found).exists():
        raise InvalidRequestError(
            f"{name} was not found: install the PostgreSQL client (apt-get install "
            f"postgresql-client) or name its folder with --pg-bin"
        )
    return found


def _run(argv: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise InvalidRequestError(f"{Path(argv[0]).name} failed: {done.stderr.strip()}")


def _facts(url: str) -> tuple[str | None, int]:
    """The database's schema revision and newest ledger row id."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            revision = connection.scalar(text("SELECT version_num FROM alembic_version"))
            newest = connection.scalar(text("SELECT max(id) FROM ledger_entries"))
    finally:
        engine.dispose()
    return (None if revision is None else str(revision)), int(newest or 0)


def backup(settings: Settings, destination: Path, *, pg_bin: Path | None = None) -> Manifest:
    """Write a backup of the node to ``destination`` (a new or empty folder) while it serves.

    Raises:
        InvalidRequestError: ``destination`` holds files, or ``pg_dump`` failed.
    """
    if destination.exists() and any(destination.iterdir()):
        raise InvalidRequestError(f"{destination} is not empty: back up into a new folder")
    destination.mkdir(parents=True, exist_ok=True)
    url = settings.resolved_database_url
    if url.startswith("sqlite"):
        kind = "sqlite"
        source = sqlite3.connect(f"file:{_sqlite_path(url)}?mode=ro", uri=True)
        target = sqlite3.connect(destination / _SQLITE)
        try:
            source.backup(target)  # all pages in one step: one consistent snapshot
        finally:
            target.close()
            source.close()
        revision, sequence = _facts(f"sqlite:///{destination / _SQLITE}")
    else:
        kind = "postgresql"
        libpq, env = _libpq(url)
        dump = [_tool("pg_dump", pg_bin), "--format=custom", "--no-owner", "--no-privileges"]
        _run([*dump, f"--file={destination / _PGDUMP}", f"--dbname={libpq}"], env)
        revision, sequence = _facts(url)  # at least the dump's: it only grows
    blobs = 0
    if settings.blob_store == "file" and settings.blob_dir.is_dir():
        for path in settings.blob_dir.rglob("*"):
            if path.is_file() and not path.name.startswith(".tmp-"):
                copy = destination / "blobs" / path.relative_to(settings.blob_dir)
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, copy)
                blobs += 1
    for name in _KEPT:
        if (settings.data_dir / name).is_file():
            shutil.copy2(settings.data_dir / name, destination / name)
    manifest = Manifest(
        utcnow().isoformat(), __version__, kind, revision, sequence, settings.blob_store, blobs
    )
    (destination / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1) + "\n")
    return manifest


def read_manifest(source: Path) -> Manifest:
    """The manifest of the backup in ``source``.

    Raises:
        InvalidRequestError: ``source`` is not a dpnode backup.
    """
    try:
        data = json.loads((source / MANIFEST).read_text())
        if data.pop("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} manifest")
        return Manifest(**data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidRequestError(f"{source} is not a dpnode backup ({exc})") from None


def restore(settings: Settings, source: Path, *, pg_bin: Path | None = None) -> Manifest:
    """Make the node's database the backup's, and put back blob files it lacks. The node
    must be stopped. The budget mark is left as it is (see the module).

    Raises:
        ConflictError: node processes are running.
        InvalidRequestError: ``source`` is not a backup of this kind of database, or
            ``pg_restore`` failed.
    """
    manifest = read_manifest(source)
    running = live_leases(settings.budget_mark_path)
    if running:
        raise ConflictError(
            f"{len(running)} node process(es) are running on this data folder: stop the node "
            "before restoring"
        )
    url = settings.resolved_database_url
    kind = "sqlite" if url.startswith("sqlite") else "postgresql"
    if manifest.database != kind:
        raise InvalidRequestError(
            f"the backup holds a {manifest.database} database and the node uses {kind}"
        )
    if kind == "sqlite":
        path = _sqlite_path(url)
        path.parent.mkdir(parents=True, exist_ok=True)
        backup_db = sqlite3.connect(f"file:{source / _SQLITE}?mode=ro", uri=True)
        live = sqlite3.connect(path)
        try:
            backup_db.backup(live)  # through SQLite: its journal and WAL stay consistent
        finally:
            live.close()
            backup_db.close()
    else:
        engine = create_engine(url)
        try:  # the schema as the backup had it, not merged with a newer one's tables
            with engine.begin() as connection:
                connection.execute(text("DROP SCHEMA public CASCADE"))
                connection.execute(text("CREATE SCHEMA public"))
        finally:
            engine.dispose()
        libpq, env = _libpq(url)
        command = [_tool("pg_restore", pg_bin), "--no-owner", "--no-privileges"]
        _run([*command, "--single-transaction", f"--dbname={libpq}", str(source / _PGDUMP)], env)
    blobs = source / "blobs"
    if settings.blob_store == "file" and blobs.is_dir():
        for path in blobs.rglob("*"):
            target = settings.blob_dir / path.relative_to(blobs)
            if path.is_file() and not target.exists():  # named by hash: an existing one is it
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
    for name in _KEPT:
        if (source / name).is_file() and not (settings.data_dir / name).exists():
            shutil.copy2(source / name, settings.data_dir / name)
    return manifest

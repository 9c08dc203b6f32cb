"""The ``dpnode`` command line: serve, migrate, and operator tasks on the local database."""

from __future__ import annotations

import argparse
import csv
import getpass
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError
from sqlalchemy import select

from node import __version__
from node.context import NodeContext
from node.db import migrate
from node.db.models import Role, User
from node.errors import DPNodeError
from node.services import datasets, users
from node.services.datasets import DatasetUpload
from node.services.tabular import ColumnSpec
from node.settings import Settings, get_settings


class CLIError(Exception):
    """A problem to report in one line, with exit status 2."""


def _migrated_context(settings: Settings) -> NodeContext:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(settings.resolved_database_url)
    return NodeContext.from_settings(settings)


def cmd_migrate(args: argparse.Namespace) -> None:
    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(settings.resolved_database_url)
    if args.check:
        migrate.check(settings.resolved_database_url)
    print(f"database is up to date: {_safe_url(settings.resolved_database_url)}")


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from node import demo
    from node.app import create_app

    settings = get_settings()
    if args.demo and settings.environment != "development":
        raise CLIError("--demo seeds well-known passwords and is refused outside development")
    context = _migrated_context(settings)
    url = f"http://{args.host}:{args.port}"
    if args.demo:
        demo.seed(context)
        print(demo.banner(url), flush=True)
    print(
        f"dpnode {__version__} serving on {url} (database: "
        f"{_safe_url(settings.resolved_database_url)})",
        flush=True,
    )
    uvicorn.run(
        create_app(context=context), host=args.host, port=args.port, log_level=args.log_level
    )


def _password(args: argparse.Namespace) -> str:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\n")
    if args.password:
        return str(args.password)
    if not sys.stdin.isatty():
        raise CLIError("give --password, --password-stdin, or run in a terminal to be asked")
    first = getpass.getpass("Password: ")
    if first != getpass.getpass("Repeat: "):
        raise CLIError("the passwords differ")
    return first


def cmd_user_add(args: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        user = users.create_user(
            session,
            context.hasher,
            None,
            email=args.email,
            password=_password(args),
            role=args.role,
        )
        print(f"created {user.role.value} {user.email} (id {user.id})")


def cmd_user_list(_: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        for user in users.list_users(session):
            state = "active" if user.is_active else "deactivated"
            print(f"{user.id:>5}  {user.email:<32} {user.role.value:<15} {state}")


def read_csv(path: Path, *, strings: set[str]) -> dict[str, npt.NDArray[Any]]:
    """Columns of a CSV file: integers, then floats (empty cells are NaN), else strings."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise CLIError(f"{path} is empty")
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CLIError(f"cannot read {path}: {exc}") from None
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise CLIError(f"{path}:{number}: {len(row)} fields, the header has {len(header)}")
    columns: dict[str, npt.NDArray[Any]] = {}
    for i, name in enumerate(header):
        cells = [row[i].strip() for row in rows]
        columns[name] = _parse_column(cells, as_string=name in strings)
    return columns


def _parse_column(cells: list[str], *, as_string: bool) -> npt.NDArray[Any]:
    if not as_string:
        try:
            return np.array([int(c) for c in cells], dtype=np.int64)
        except ValueError:
            pass
        try:
            return np.array([float(c) if c else np.nan for c in cells], dtype=np.float64)
        except ValueError:
            pass
    return np.array(cells, dtype=object)


def _bounds_file(path: Path) -> dict[str, Any]:
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CLIError(f"cannot read bounds file {path}: {exc}") from None
    unknown = set(spec) - {"bounds", "categories", "fill", "clamp", "subject_id"}
    if unknown:
        raise CLIError(
            f"{path}: unknown keys {sorted(unknown)} (expected bounds, categories, "
            "fill, clamp, subject_id)"
        )
    return spec


def cmd_dataset_add(args: argparse.Namespace) -> None:
    spec = _bounds_file(args.bounds)
    categories = {k: [str(v) for v in vs] for k, vs in spec.get("categories", {}).items()}
    subject_id = spec.get("subject_id")
    strings = set(categories) | ({subject_id} if subject_id else set())
    columns = read_csv(args.file, strings=strings)
    clamp = spec.get("clamp", False) or args.clamp
    mock = read_csv(args.mock, strings=strings) if args.mock else None
    upload = DatasetUpload(
        name=args.name,
        description=args.description,
        tags=[t for t in args.tags.split(",") if t.strip()] if args.tags else [],
        spec=ColumnSpec(
            bounds={k: tuple(v) for k, v in spec.get("bounds", {}).items()},
            categories=categories,
            clamp=clamp if isinstance(clamp, bool) else frozenset(clamp),
            fill=spec.get("fill", {}),
            subject_id=subject_id,
        ),
        order=list(columns),
        columns=columns,
        mock_order=list(mock) if mock else None,
        mock=mock,
    )
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        owner = _owner(session, args.owner)
        dataset = datasets.create_dataset(
            session, context.store, owner, upload, max_elements=context.settings.max_upload_elements
        )
        print(
            f"added dataset {dataset.name!r} (id {dataset.id}): {dataset.row_count} rows, "
            f"{len(dataset.columns)} columns, owner {owner.email}"
        )


def _owner(session: Any, email: str | None) -> User:
    if email:
        owner = session.scalar(select(User).where(User.email == users.normalise_email(email)))
        if owner is None:
            raise CLIError(f"no user {email}; create one with 'dpnode user add'")
        return owner  # type: ignore[no-any-return]
    admin = session.scalar(
        select(User).where(User.role == Role.ADMIN, User.is_active.is_(True)).order_by(User.id)
    )
    if admin is None:
        raise CLIError("no --owner given and no admin exists; create one with 'dpnode user add'")
    return admin  # type: ignore[no-any-return]


def cmd_dataset_list(_: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        for d in datasets.search_datasets(session, limit=1000):
            tags = ",".join(t.tag for t in d.tags)
            print(
                f"{d.id:>5}  {d.name:<24} {d.row_count:>9} rows  {len(d.columns):>4} cols  {tags}"
            )


def _safe_url(url: str) -> str:
    """The database URL without its password.

    >>> _safe_url("postgresql+psycopg://u:secret@h/db")
    'postgresql+psycopg://u:***@h/db'
    """
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpnode", description="A differential-privacy data node.")
    parser.add_argument("--version", action="version", version=f"dpnode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="migrate the database, then serve the API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--demo", action="store_true", help="seed demo accounts and datasets (development only)"
    )
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.set_defaults(func=cmd_serve)

    mig = sub.add_parser("migrate", help="upgrade the database to the latest schema")
    mig.add_argument(
        "--check", action="store_true", help="also fail if models and migrations drift"
    )
    mig.set_defaults(func=cmd_migrate)

    user = sub.add_parser("user", help="manage accounts").add_subparsers(
        dest="user_command", required=True, metavar="ACTION"
    )
    add = user.add_parser("add", help="create an account")
    add.add_argument("--email", required=True)
    add.add_argument("--role", required=True, choices=[r.value for r in Role])
    pw = add.add_mutually_exclusive_group()
    pw.add_argument("--password", help="the password (visible in your shell history)")
    pw.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    add.set_defaults(func=cmd_user_add)
    user.add_parser("list", help="list accounts").set_defaults(func=cmd_user_list)

    dataset = sub.add_parser("dataset", help="manage datasets").add_subparsers(
        dest="dataset_command", required=True, metavar="ACTION"
    )
    dadd = dataset.add_parser("add", help="add a dataset from a CSV file")
    dadd.add_argument("file", type=Path, metavar="FILE.csv")
    dadd.add_argument("--name", required=True)
    dadd.add_argument(
        "--bounds",
        required=True,
        type=Path,
        metavar="FILE.toml",
        help="declared bounds, categories, fill values and subject id",
    )
    dadd.add_argument("--tags", default="", help="comma-separated tags")
    dadd.add_argument("--description", default="")
    dadd.add_argument("--owner", help="owner's email (default: the first admin)")
    dadd.add_argument("--mock", type=Path, metavar="MOCK.csv", help="fake data for dry runs")
    dadd.add_argument("--clamp", action="store_true", help="clip out-of-bounds values")
    dadd.set_defaults(func=cmd_dataset_add)
    dataset.add_parser("list", help="list datasets").set_defaults(func=cmd_dataset_list)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (CLIError, DPNodeError) as exc:
        print(f"dpnode: error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # settings from the environment
        print(f"dpnode: error: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``dpnode`` command line: serve, migrate, and operator tasks on the local database."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from dpnode import __version__
from dpnode.core.errors import DPNodeError
from dpnode.core.ingest import TableSource, arrow_source, chunks_of, session_request
from dpnode.node import cli_admin, cli_synthesis
from dpnode.node.cli_backup import add_commands as add_backup_commands
from dpnode.node.cli_common import CLIError, add_password_options
from dpnode.node.cli_common import fmt as _fmt
from dpnode.node.cli_common import migrated_context as _migrated_context
from dpnode.node.cli_common import number as _number
from dpnode.node.cli_common import operator as _operator
from dpnode.node.cli_common import password as _password
from dpnode.node.cli_common import whole as _whole
from dpnode.node.context import NodeContext
from dpnode.node.db import migrate
from dpnode.node.db.models import PolicyRevision, Role, User
from dpnode.node.network.cli import add_commands as add_network_commands
from dpnode.node.numbers import read_id
from dpnode.node.services import (
    approvals,
    audit,
    budget_requests,
    budget_status,
    costs,
    datasets,
    ledger,
    users,
)
from dpnode.node.services import policy as policy_service
from dpnode.node.services.dataset_budgets import dataset_budget
from dpnode.node.services.uploads import plan_from_request
from dpnode.node.settings import get_settings


def cmd_migrate(args: argparse.Namespace) -> None:
    settings = get_settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(settings.resolved_database_url)
    if args.check:
        migrate.check(settings.resolved_database_url)
    print(f"database is up to date: {_safe_url(settings.resolved_database_url)}")


def cmd_serve(args: argparse.Namespace) -> None:
    import uvicorn

    from dpnode.node import demo
    from dpnode.node.app import create_app

    if args.network:
        if args.demo:
            raise CLIError("--demo seeds datasets, which a network does not hold")
        # the environment, so that worker processes (which read it) serve a network too
        os.environ["DPNODE_ROLE"] = "network"
        get_settings.cache_clear()
    settings = get_settings()
    if args.demo and settings.environment != "development":
        raise CLIError("--demo seeds well-known passwords and is refused outside development")
    if args.workers < 1:
        raise CLIError("--workers must be at least 1")
    if args.workers > 1 and settings.resolved_database_url.startswith("sqlite"):
        raise CLIError(
            "--workers > 1 needs PostgreSQL (DPNODE_DATABASE_URL): SQLite lets one process "
            "write at a time, so more workers would only queue for its lock"
        )
    context = _migrated_context(settings)
    url = f"http://{args.host}:{args.port}"
    if args.demo:
        demo.seed(context)
        print(demo.banner(url), flush=True)
    role = " a network" if settings.role == "network" else ""
    print(
        f"dpnode {__version__} serving{role} on {url} (database: "
        f"{_safe_url(settings.resolved_database_url)})",
        flush=True,
    )
    if args.workers == 1:
        try:
            uvicorn.run(
                create_app(context=context),
                host=args.host,
                port=args.port,
                log_level=args.log_level,
                timeout_keep_alive=settings.keep_alive_seconds,
            )
        finally:  # a clean stop returns the budget mark's reservation
            context.close()
        return
    # Several processes: each builds its own context (engine, caches) from the same settings;
    # everything that must hold across them lives in the database (docs/deploy.md).
    context.close()
    uvicorn.run(
        "dpnode.node.app:create_app",
        factory=True,
        workers=args.workers,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_keep_alive=settings.keep_alive_seconds,
    )


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


def _file_source(
    path: Path, categories: dict[str, list[str]], subject_id: str | None
) -> TableSource:
    """A CSV, Parquet or Arrow file read in record batches (CSV typed by Arrow: integers,
    floats, booleans, empty cells missing; declared category and subject id columns as
    strings)."""
    import pyarrow as pa

    try:
        return arrow_source(path, categories, subject_id)
    except (OSError, pa.ArrowInvalid) as exc:
        raise CLIError(f"cannot read {path}: {exc}") from None


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
    clamp = spec.get("clamp", False) or args.clamp
    manifest = {
        "name": args.name,
        "description": args.description,
        "tags": [t for t in args.tags.split(",") if t.strip()] if args.tags else [],
        "bounds": {k: tuple(v) for k, v in spec.get("bounds", {}).items()},
        "categories": categories,
        "clamp": clamp,
        "fill": spec.get("fill", {}),
        "subject_id": subject_id,
    }
    context = _migrated_context(get_settings())
    source = _file_source(args.file, categories, subject_id)
    try:
        mock = _file_source(args.mock, categories, subject_id) if args.mock else None
        with context.sessions() as session:
            owner = _owner(session, args.owner)
            dataset = _upload(context, session, owner, manifest, source, mock)
            print(
                f"added dataset {dataset.name!r} (id {dataset.id}): {dataset.row_count} rows, "
                f"{len(dataset.columns)} columns, owner {owner.email}"
            )
    except _arrow_errors() as exc:
        raise CLIError(f"cannot read {args.file}: {exc}") from None
    finally:
        for s in (source, mock if args.mock else None):
            if s is not None and s.cleanup is not None:
                s.cleanup()


def _arrow_errors() -> tuple[type[Exception], ...]:
    """What pyarrow raises on a malformed file met while reading it."""
    import pyarrow as pa

    return (pa.ArrowInvalid, OSError)


def _upload(
    context: NodeContext,
    session: Any,
    owner: User,
    manifest: dict[str, Any],
    source: TableSource,
    mock: TableSource | None,
) -> Any:
    """Send a table through an upload session, as the SDK would, one chunk at a time."""
    request, stream = session_request(manifest, source, mock)
    tensors = request.pop("tensors")
    uploads = context.uploads
    created = uploads.create(owner, plan_from_request(request, tensors))
    offset = 0
    try:
        for chunk in chunks_of(stream, 16 * 1024 * 1024):
            uploads.write(owner, created.id, offset, chunk, hashlib.sha256(chunk).hexdigest())
            offset += len(chunk)
        return uploads.finalize(session, context.store, owner, created.id)
    finally:  # nobody resumes or finalizes again from here: free the session at once
        with contextlib.suppress(DPNodeError):
            uploads.delete(owner, created.id)


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


def cmd_dataset_show(args: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        d = datasets.get_dataset(session, args.name)
        cap = dataset_budget(session, context.settings, None, d)
        subjects = f", {d.subject_count} subjects by {d.subject_column}" if d.subject_column else ""
        print(f"dataset {d.id} {d.name!r}, owner {d.owner.email}: {d.row_count} rows{subjects}")
        if d.provenance is not None:
            print(f"synthetic: {_made(d.provenance)} from {d.provenance.get('source')!r}")
        for c in d.columns:
            print(f"  {c.name:<24} {c.dtype:<8} bounds [{c.lower:g}, {c.upper:g}]")
        if d.mock_row_count is None:
            print("mock: none")
        elif d.mock_provenance is None:
            print(f"mock: {d.mock_row_count} rows, uploaded by its owner")
        else:
            made = _made(d.mock_provenance)
            print(f"mock: {d.mock_row_count} rows, synthetic: {made}, paid from the cap")
        print(f"cap: {cap.describe()}")


def _made(provenance: dict[str, Any]) -> str:
    """How a synthetic table was made, in a few words.

    >>> _made({"method": "mst", "epsilon": 2.0, "delta": 1e-06, "ledger_id": 4})
    'mst, epsilon 2, delta 1e-06, ledger row 4'
    """
    return (
        f"{provenance.get('method')}, epsilon {provenance.get('epsilon'):g}, "
        f"delta {provenance.get('delta'):g}, ledger row {provenance.get('ledger_id')}"
    )


def _policy_text(row: PolicyRevision | None, in_force: policy_service.InForce) -> str:
    if row is None:
        head = "# no policy was applied: the built-in default (policies/default.toml) is in force"
        return head + "\n" + json.dumps(in_force.policy.to_dict(), indent=2, sort_keys=True)
    head = (
        f"# revision {row.id} ({row.name or 'unnamed'}), applied {row.at.isoformat()} by "
        f"{row.created_by}: {row.reason}\n# sha256 {row.content_hash}"
    )
    body = row.source or json.dumps(row.document, indent=2, sort_keys=True)
    return head + "\n" + body.rstrip("\n")


def cmd_policy_show(args: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        if args.history:
            for past in policy_service.history(session, limit=args.limit):
                print(
                    f"{past.id:>5}  {past.at.isoformat()}  {past.name or '(unnamed)':<20} "
                    f"{past.created_by:<32} {past.reason}"
                )
            return
        in_force = policy_service.current(session)
        number = args.revision if args.revision is not None else in_force.revision
        row: PolicyRevision | None = None
        if number is not None:
            row = policy_service.get_revision(session, number)
        print(_policy_text(row, in_force))


def cmd_policy_apply(args: argparse.Namespace) -> None:
    try:
        source = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"cannot read policy file {args.file}: {exc}") from None
    policy = policy_service.parse(source)
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        applied = policy_service.apply(
            session, None, policy, reason=args.reason, source=source, operator=_operator()
        )
        row = applied.revision
        for warning in applied.warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if applied.changed:
            print(f"applied policy {row.name or '(unnamed)'!r} as revision {row.id}")
        else:
            print(f"unchanged: this is already revision {row.id}")


def cmd_budget_grant(args: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        grant = budget_requests.grant(
            session,
            None,
            args.user,
            epsilon=args.epsilon,
            delta=args.delta,
            reason=args.reason,
            operator=_operator(),
        )
        print(
            f"granted epsilon {_fmt(grant.epsilon_units, costs.EPSILON_UNIT)}, delta "
            f"{_fmt(grant.delta_units, costs.DELTA_UNIT)} to {args.user} (grant {grant.id})"
        )


def cmd_budget_show(args: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        if args.user:
            chosen = [budget_requests.find_user(session, args.user)]
        else:
            chosen = users.list_users(session)
        for user in chosen:
            status = budget_status.budget_of(session, context.settings, user.id)
            allocation = status.status.allocation
            spent, _ = status.spent()
            renews = status.status.remaining.renews_at
            print(
                f"{user.email:<32} epsilon {spent:.9g} of {status.epsilon:.9g} spent, "
                f"{status.remaining_epsilon:.9g} left ({allocation.epsilon_rule}"
                f"{', renews ' + renews.isoformat() if renews else ''})"
            )
        print(f"policy in force: {status.in_force.label}" if chosen else "no users")


def cmd_ledger(args: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        user_id = None if not args.user else budget_requests.find_user(session, args.user).id
        dataset_id = None
        if args.dataset:
            # an id as JSON writes it, or a name, as /datasets/{ref} reads it (isdigit() took
            # '١' for id 1, and int() could not read '²')
            ident = read_id(args.dataset)
            ref = args.dataset if ident is None else ident
            dataset_id = datasets.get_dataset(session, ref).id
        entries = ledger.ledger_of(session, user_id, dataset_id=dataset_id, limit=args.limit)
        emails = {u.id: u.email for u in users.list_users(session)}
        for e in entries:
            revision = "default" if e.policy_revision is None else str(e.policy_revision)
            print(
                f"{e.id:>6}  {e.at.isoformat()}  {emails.get(e.user_id, e.user_id)!s:<28} "
                f"{e.mechanism:<9} epsilon {_fmt(e.epsilon_units, costs.EPSILON_UNIT):<10} "
                f"rho {_fmt(e.rho_units, costs.RHO_UNIT):<10} datasets {e.dataset_ids} "
                f"policy {revision}"
            )


def cmd_approval_list(args: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        rows = approvals.list_approvals(session, None, status=args.status, limit=args.limit)
        for a in rows:
            what = f"{a.mechanism} publish"
            if a.kind == approvals.RUN:
                what = f"run of {a.steps} steps ({a.steps_used} used)"
            answer = f" by {a.decided_by}: {a.decision_reason}" if a.decided_by else ""
            print(
                f"{a.id:>6}  {a.created_at.isoformat()}  {a.user.email:<28} {a.status.value:<8} "
                f"{what}, epsilon {_fmt(a.epsilon_units, costs.EPSILON_UNIT)} delta "
                f"{_fmt(a.delta_units, costs.DELTA_UNIT)} datasets {a.dataset_ids} "
                f"[{a.rule}]{' ' + repr(a.description) if a.description else ''}{answer}"
            )
        if not rows:
            print("no publish approvals")


def cmd_audit(args: argparse.Namespace) -> None:
    context = _migrated_context(get_settings())
    with context.sessions() as session:
        for event in audit.list_events(session, action=args.action, limit=args.limit):
            who = event.actor_email or "command line"
            detail = json.dumps(event.detail, sort_keys=True, default=str)
            print(f"{event.id:>6}  {event.at.isoformat()}  {who:<28} {event.action:<28} {detail}")


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
    serve.add_argument("--port", type=_whole, default=8000)
    serve.add_argument(
        "--demo", action="store_true", help="seed demo accounts and datasets (development only)"
    )
    serve.add_argument(
        "--workers",
        type=_whole,
        default=1,
        help="worker processes sharing the port (more than 1 needs PostgreSQL)",
    )
    serve.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.add_argument(
        "--network",
        action="store_true",
        help="serve a network: a directory of member nodes and their public catalogs",
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
    add_password_options(add)
    add.set_defaults(func=cmd_user_add)
    user.add_parser("list", help="list accounts").set_defaults(func=cmd_user_list)
    cli_admin.add_user_actions(user)

    dataset = sub.add_parser("dataset", help="manage datasets").add_subparsers(
        dest="dataset_command", required=True, metavar="ACTION"
    )
    dadd = dataset.add_parser(
        "add", help="add a dataset from a CSV, Parquet or Arrow file (read in record batches)"
    )
    dadd.add_argument("file", type=Path, metavar="FILE")
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
    dadd.add_argument("--mock", type=Path, metavar="MOCK", help="fake data for dry runs")
    dadd.add_argument("--clamp", action="store_true", help="clip out-of-bounds values")
    dadd.set_defaults(func=cmd_dataset_add)
    dataset.add_parser("list", help="list datasets").set_defaults(func=cmd_dataset_list)
    cli_synthesis.add_dataset_actions(dataset)
    dshow = dataset.add_parser("show", help="a dataset's columns, and how much of its cap is used")
    dshow.add_argument("name", help="the dataset's name")
    dshow.set_defaults(func=cmd_dataset_show)
    cli_admin.add_dataset_actions(dataset)

    pol = sub.add_parser("policy", help="the budget policy").add_subparsers(
        dest="policy_command", required=True, metavar="ACTION"
    )
    show = pol.add_parser("show", help="print the policy in force (or a revision, or history)")
    show.add_argument("--revision", type=_whole, help="a past revision")
    show.add_argument("--history", action="store_true", help="list every revision")
    show.add_argument("--limit", type=_whole, default=100)
    show.set_defaults(func=cmd_policy_show)
    papply = pol.add_parser("apply", help="validate a TOML policy file and put it in force")
    papply.add_argument("file", type=Path, metavar="FILE.toml")
    papply.add_argument("--reason", required=True, help="why, for the audit log")
    papply.set_defaults(func=cmd_policy_apply)

    bud = sub.add_parser("budget", help="privacy budgets").add_subparsers(
        dest="budget_command", required=True, metavar="ACTION"
    )
    grant = bud.add_parser("grant", help="add budget to a user's allocation")
    grant.add_argument("--user", required=True, help="email or id")
    grant.add_argument("--epsilon", type=_number, required=True)
    grant.add_argument("--delta", type=_number, default=0.0)
    grant.add_argument("--reason", required=True, help="why, for the audit log")
    grant.set_defaults(func=cmd_budget_grant)
    bshow = bud.add_parser("show", help="budgets under the policy in force")
    bshow.add_argument("--user", help="email or id (default: everyone)")
    bshow.set_defaults(func=cmd_budget_show)
    cli_admin.add_budget_actions(bud)
    add_backup_commands(sub, bud)

    led = sub.add_parser("ledger", help="privacy charges, newest first")
    led.add_argument("--user", help="email or id")
    led.add_argument("--dataset", help="name or id")
    led.add_argument("--limit", type=_whole, default=100)
    led.set_defaults(func=cmd_ledger)

    appr = sub.add_parser("approval", help="publishes and training runs waiting for an admin")
    appr_sub = appr.add_subparsers(dest="approval_command", required=True, metavar="ACTION")
    alist = appr_sub.add_parser("list", help="requests, newest first (runs show their steps)")
    alist.add_argument("--status", help="pending, approved, denied or used")
    alist.add_argument("--limit", type=_whole, default=100)
    alist.set_defaults(func=cmd_approval_list)
    cli_admin.add_approval_actions(appr_sub)

    add_network_commands(sub)

    aud = sub.add_parser("audit", help="the audit log, newest first")
    aud.add_argument("--action", help="e.g. privacy.charge, policy.apply, budget.grant")
    aud.add_argument("--limit", type=_whole, default=100)
    aud.set_defaults(func=cmd_audit)
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

"""The ``dpnode`` commands for backups and the budget mark: ``backup``, ``restore``,
``budget carry-forward`` (docs/deploy.md, "Backup, restore and rollback")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from dpnode.node import backup as backups
from dpnode.node.cli_common import operator
from dpnode.node.db import migrate
from dpnode.node.db.session import make_engine
from dpnode.node.services import carry_forward as carrying
from dpnode.node.services.spending_mark import (
    CARRY_FORWARD,
    describe,
    find_gap,
    live_leases,
    read_state,
    read_totals,
)
from dpnode.node.settings import Settings, get_settings

__all__ = ["add_commands"]


def _engine(settings: Settings) -> Engine:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    migrate.upgrade(settings.resolved_database_url)
    return make_engine(settings.resolved_database_url)


def cmd_backup(args: argparse.Namespace) -> None:
    settings = get_settings()
    made = backups.backup(settings, args.destination, pg_bin=args.pg_bin)
    print(
        f"backed up the {made.database} database (schema {made.schema_revision}, ledger up to "
        f"row {made.ledger_sequence}) and {made.blobs} blob files to {args.destination}"
    )
    if made.blob_store == "s3":
        print(f"blobs are in the S3 bucket {settings.s3_bucket!r}: back the bucket up as such")


def _report_gap(settings: Settings, engine: Engine) -> None:
    path = settings.budget_mark_path
    state = read_state(path)
    if state is None:
        print(f"there is no budget mark at {path}: see `{CARRY_FORWARD} --help`")
        return
    with engine.connect() as connection:
        gap = find_gap(state, read_totals(connection), live_leases(path))
    if gap.behind:
        print(
            f"the database is behind the budget mark: {gap.describe()}. The node refuses "
            f"publishes until an admin runs `{CARRY_FORWARD} --reason '...'`"
        )
    else:
        print("the database holds all the spending the budget mark knows of")


def cmd_restore(args: argparse.Namespace) -> None:
    settings = get_settings()
    made = backups.restore(settings, args.source, pg_bin=args.pg_bin)
    print(
        f"restored the {made.database} database of {made.created_at} (schema "
        f"{made.schema_revision}, ledger up to row {made.ledger_sequence})"
    )
    engine = _engine(settings)  # `dpnode migrate`: an older backup's schema is upgraded
    try:
        _report_gap(settings, engine)
    finally:
        engine.dispose()


def cmd_carry_forward(args: argparse.Namespace) -> None:
    settings = get_settings()
    engine = _engine(settings)
    path = settings.budget_mark_path
    try:
        if args.new_mark:
            state = carrying.adopt(engine, path, operator=operator(), reason=args.reason)
            print(
                f"adopted the database as the budget mark {path} (ledger up to row "
                f"{state.sequence}, {len(state.settled)} users and datasets)"
            )
            return
        done = carrying.carry_forward(
            engine, path, operator=operator(), reason=args.reason, admin_email=args.admin
        )
    finally:
        engine.dispose()
    if not done.gap.behind:
        print("nothing to carry forward: the database holds all the spending the mark knows of")
        return
    for key, row in sorted(done.rows.items()):
        print(f"carried {describe(done.gap.missing[key])} forward for {key} (ledger row {row})")
    for key in done.dropped:
        print(f"dropped {key}: the restored database has no such user")
    print("the budget mark is settled: the node serves publishes again")


def add_commands(sub: Any, budget: Any) -> None:
    """Add the commands to the top-level subparsers ``sub`` and ``budget``'s."""
    pg_help = "folder of pg_dump/pg_restore (default: on PATH)"
    back = sub.add_parser("backup", help="back up the database and blobs (while serving)")
    back.add_argument("destination", type=Path, metavar="FOLDER", help="a new or empty folder")
    back.add_argument("--pg-bin", type=Path, help=pg_help)
    back.set_defaults(func=cmd_backup)
    rest = sub.add_parser(
        "restore", help="restore a backup (node stopped); spent epsilon is carried forward"
    )
    rest.add_argument("source", type=Path, metavar="FOLDER", help="a folder `backup` wrote")
    rest.add_argument("--pg-bin", type=Path, help=pg_help)
    rest.set_defaults(func=cmd_restore)
    carry = budget.add_parser(
        "carry-forward",
        help="record spending the database lacks against the budget mark (after a restore)",
    )
    carry.add_argument("--reason", required=True, help="why, for the audit log")
    carry.add_argument(
        "--admin", help="admin account datasets' missing spending is charged to (default: first)"
    )
    carry.add_argument(
        "--new-mark",
        action="store_true",
        help="the mark is missing or corrupt: adopt the database's spending as the new mark "
        "(you vouch that it is current; audited)",
    )
    carry.set_defaults(func=cmd_carry_forward)

"""``dpnode network ...``: a network's join tokens and members (run where the network is
served), and a node's membership of networks (run where the node is served)."""

from __future__ import annotations

import argparse
import socket
from typing import Any

from dpnode.node.cli_common import migrated_context, operator, whole
from dpnode.node.network import directory, membership
from dpnode.node.numbers import read_id


def cmd_token_create(args: argparse.Namespace) -> None:
    context = migrated_context()
    with context.sessions() as session:
        row, token = directory.issue_token(
            session, context.settings, None, args.note, operator=operator()
        )
        print(f"join token {row.id} (expires {row.expires_at.isoformat()}), shown once:")
        print(token)


def cmd_token_list(_: argparse.Namespace) -> None:
    context = migrated_context()
    with context.sessions() as session:
        rows = directory.list_tokens(session)
        for t in rows:
            state = (
                f"revoked {t.revoked_at.isoformat()}" if t.revoked_at
                else f"used by {t.used_by} {t.used_at.isoformat()}" if t.used_at
                else f"expires {t.expires_at.isoformat()}"
            )  # fmt: skip
            print(f"{t.id:>5}  {t.created_at.isoformat()}  {t.created_by:<28} {state}  {t.note!r}")
        if not rows:
            print("no join tokens")


def cmd_token_revoke(args: argparse.Namespace) -> None:
    context = migrated_context()
    with context.sessions() as session:
        row = directory.revoke_token(session, None, args.id, operator=operator())
        print(f"revoked join token {row.id}")


def cmd_members(_: argparse.Namespace) -> None:
    context = migrated_context()
    with context.sessions() as session:
        states = directory.members(session, context.settings)
        for s in states:
            m = s.member
            seen = "reachable" if s.reachable else "unreachable"
            print(
                f"{m.id:>5}  {m.name:<24} {m.url:<32} {seen:<11} last seen "
                f"{m.last_seen_at.isoformat()}  {len(m.catalog)} datasets"
            )
        if not states:
            print("no members")


def cmd_remove(args: argparse.Namespace) -> None:
    context = migrated_context()
    with context.sessions() as session:
        ident = read_id(args.member)  # an id as JSON writes it, or a name
        ref: int | str = args.member if ident is None else ident
        member = directory.remove_member(session, None, ref, operator=operator())
        print(f"removed member {member.name!r} ({member.url})")


def cmd_join(args: argparse.Namespace) -> None:
    context = migrated_context()
    try:
        name = args.name or context.settings.node_name or socket.gethostname()
        row = membership.join(
            context.sessions, args.network, args.token, name=name, url=args.url,
            operator=operator(),
        )  # fmt: skip
        print(
            f"joined {row.network_url} as {row.name!r} (member {row.member_id}); the serving "
            f"node sends a heartbeat every {context.settings.network_heartbeat_seconds:g} s"
        )
    finally:
        context.close()


def cmd_leave(args: argparse.Namespace) -> None:
    context = migrated_context()
    try:
        membership.leave(context.sessions, args.network, force=args.force, operator=operator())
        print(f"left {args.network.rstrip('/')}")
    finally:
        context.close()


def cmd_status(_: argparse.Namespace) -> None:
    context = migrated_context()
    try:
        with context.sessions() as session:
            rows = membership.memberships(session)
            for m in rows:
                last = m.last_heartbeat_at.isoformat() if m.last_heartbeat_at else "never"
                print(
                    f"{m.network_url:<32} as {m.name!r} ({m.url}), joined "
                    f"{m.joined_at.isoformat()}; last heartbeat {last}: {m.last_result}"
                )
            if not rows:
                print("this node is in no network")
    finally:
        context.close()


def add_commands(sub: Any) -> None:
    """``dpnode network token|members|remove|join|leave|status``."""
    net = sub.add_parser("network", help="a network of nodes: its tokens and members, or joining")
    actions = net.add_subparsers(dest="network_command", required=True, metavar="ACTION")

    token = actions.add_parser("token", help="(on a network) join tokens").add_subparsers(
        dest="token_command", required=True, metavar="ACTION"
    )
    create = token.add_parser("create", help="issue a join token for one node (shown once)")
    create.add_argument("--note", default="", help="whom it is for, for the audit log")
    create.set_defaults(func=cmd_token_create)
    token.add_parser("list", help="join tokens, newest first").set_defaults(func=cmd_token_list)
    revoke = token.add_parser("revoke", help="revoke an unused join token")
    revoke.add_argument("id", type=whole, metavar="ID")
    revoke.set_defaults(func=cmd_token_revoke)

    actions.add_parser("members", help="(on a network) its members").set_defaults(func=cmd_members)
    remove = actions.add_parser("remove", help="(on a network) remove a member")
    remove.add_argument("member", metavar="NAME_OR_ID")
    remove.set_defaults(func=cmd_remove)

    join = actions.add_parser("join", help="(on a node) join a network with a token")
    join.add_argument("network", metavar="NETWORK_URL")
    join.add_argument("--token", required=True, help="from the network's admin")
    join.add_argument(
        "--url", required=True, help="this node's address, as data scientists reach it"
    )
    join.add_argument(
        "--name", help="this node's name there (default: DPNODE_NODE_NAME, or the host name)"
    )
    join.set_defaults(func=cmd_join)
    leave = actions.add_parser("leave", help="(on a node) leave a network")
    leave.add_argument("network", metavar="NETWORK_URL")
    leave.add_argument(
        "--force", action="store_true", help="forget the network even if it cannot be reached"
    )
    leave.set_defaults(func=cmd_leave)
    actions.add_parser("status", help="(on a node) the networks it joined").set_defaults(
        func=cmd_status
    )

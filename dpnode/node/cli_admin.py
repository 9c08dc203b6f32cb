"""The ``dpnode`` commands an admin would otherwise need the API for: accounts (deactivate,
role, password), answers to publish approvals and budget requests, and deleting a dataset.

Each goes through the service the API route calls, with the operator as the actor (``None``)
and their login name in the audit event, so the command line is no second path around the
checks (the last active admin, a reason for every answer, charges on a dataset).
"""

from __future__ import annotations

import argparse
from typing import Any

from dpnode.core.errors import NotFoundError
from dpnode.node.cli_common import (
    add_password_options,
    fmt,
    migrated_context,
    number,
    operator,
    password,
    whole,
)
from dpnode.node.db.models import PublishApproval, Role
from dpnode.node.numbers import read_id
from dpnode.node.services import (
    approval_review,
    approvals,
    budget,
    budget_requests,
    datasets,
    users,
)


def _update(ref: str, **change: Any) -> str:
    """Change one account through ``users.update_user``; its email."""
    context = migrated_context()
    with context.sessions() as session:
        user = budget_requests.find_user(session, ref)
        users.update_user(session, context.hasher, None, user.id, **change)
        return user.email


def cmd_user_deactivate(args: argparse.Namespace) -> None:
    print(f"deactivated {_update(args.user, is_active=False)}: its tokens stop working now")


def cmd_user_activate(args: argparse.Namespace) -> None:
    print(f"activated {_update(args.user, is_active=True)}")


def cmd_user_role(args: argparse.Namespace) -> None:
    print(f"{_update(args.user, role=args.role)} is now {args.role}")


def cmd_user_password(args: argparse.Namespace) -> None:
    print(f"set a new password for {_update(args.user, password=password(args))}")


def cmd_approval_answer(args: argparse.Namespace) -> None:
    context = migrated_context()
    with context.sessions() as session:
        row = approvals.answer(
            session,
            context.settings,
            None,
            args.id,
            approve=args.approve,
            reason=args.reason,
            operator=operator(),
        )
        then = ": the same publish, sent again, now runs" if args.approve else ""
        print(f"{row.status.value} publish approval request {row.id} of {row.user.email}{then}")


def cmd_budget_requests(args: argparse.Namespace) -> None:
    context = migrated_context()
    with context.sessions() as session:
        rows = budget_requests.list_requests(session, None, status=args.status, limit=args.limit)
        for r in rows:
            answer = f" by {r.decided_by}: {r.decision_reason}" if r.decided_by else ""
            print(
                f"{r.id:>6}  {r.created_at.isoformat()}  {r.user.email:<28} "
                f"{r.status.value:<8} epsilon {fmt(r.epsilon_units, budget.EPSILON_UNIT)} "
                f"delta {fmt(r.delta_units, budget.DELTA_UNIT)} {r.reason!r}{answer}"
            )
        if not rows:
            print("no budget requests")


def cmd_budget_answer(args: argparse.Namespace) -> None:
    context = migrated_context()
    with context.sessions() as session:
        row = budget_requests.answer_request(
            session,
            None,
            args.id,
            approve=args.approve,
            epsilon=getattr(args, "epsilon", None),
            delta=getattr(args, "delta", None),
            reason=args.reason,
            operator=operator(),
        )
        print(f"{row.status.value} budget request {row.id}")


def cmd_dataset_delete(args: argparse.Namespace) -> None:
    ident = read_id(args.dataset)  # an id as JSON writes it, or a name (as /datasets/{ref})
    context = migrated_context()
    with context.sessions() as session:
        dataset = datasets.get_dataset(session, args.dataset if ident is None else ident)
        name, ident = dataset.name, dataset.id
        datasets.delete_dataset(
            session,
            context.store,
            None,
            ident,
            uncharged_only=not args.charged,
            operator=operator(),
        )
        print(f"deleted dataset {name!r} (id {ident})")


def add_user_actions(user: Any) -> None:
    """``dpnode user deactivate|activate|role|password``."""
    for action, func, text in (
        ("deactivate", cmd_user_deactivate, "deactivate an account (its tokens stop working)"),
        ("activate", cmd_user_activate, "activate a deactivated account again"),
    ):
        parser = user.add_parser(action, help=text)
        parser.add_argument("user", metavar="EMAIL_OR_ID")
        parser.set_defaults(func=func)
    role = user.add_parser("role", help="change an account's role")
    role.add_argument("user", metavar="EMAIL_OR_ID")
    role.add_argument("role", choices=[r.value for r in Role])
    role.set_defaults(func=cmd_user_role)
    reset = user.add_parser("password", help="set a new password for an account")
    reset.add_argument("user", metavar="EMAIL_OR_ID")
    add_password_options(reset)
    reset.set_defaults(func=cmd_user_password)


def cmd_approval_show(args: argparse.Namespace) -> None:
    context = migrated_context()
    with context.sessions() as session:
        row = session.get(PublishApproval, args.id)
        if row is None:
            raise NotFoundError(f"no publish approval request {args.id}")
        review = approval_review.reviews(session, context.settings, None, [row])[row.id]
        print(_render(review, row))


def _render(review: approval_review.Review, row: PublishApproval) -> str:
    """A request as an admin reads it: who asks for what, with which noise, the
    computation's listing, the requester's remaining budget and the datasets' caps."""
    what = f"{row.mechanism} publish"
    if row.kind == approvals.RUN:
        what = f"training run of {row.steps} steps ({row.steps_used} used)"
    lines = [f"request {row.id} by {row.user.email}: {what}, {row.status.value}"]
    if row.description:
        lines.append(f"description: {row.description}")
    if review.sensitivity is not None:
        noise = "" if review.noise_scale is None else f", noise scale {review.noise_scale:.6g}"
        lines.append(f"sensitivity {review.sensitivity:.6g}{noise}")
    lines.append("computation:")
    lines.extend(f"    {line}" for line in review.computation or ["(not recorded)"])
    lines.append(
        f"remaining budget of {row.user.email}: epsilon {review.remaining_epsilon:.6g}, "
        f"delta {review.remaining_delta:.3g}"
    )
    for read in review.datasets:
        cap = "" if read.budget is None else f": {read.budget.describe()}"
        lines.append(f"reads {read.name or f'dataset {read.dataset_id} (deleted)'}{cap}")
    return "\n".join(lines)


def add_approval_actions(approval: Any) -> None:
    """``dpnode approval show ID`` and ``dpnode approval approve|deny ID --reason ...``."""
    show = approval.add_parser("show", help="what a request computes, its noise and budgets")
    show.add_argument("id", type=whole, metavar="ID", help="from 'dpnode approval list'")
    show.set_defaults(func=cmd_approval_show)
    for action, approve in (("approve", True), ("deny", False)):
        parser = approval.add_parser(action, help=f"{action} a pending publish or training run")
        parser.add_argument("id", type=whole, metavar="ID", help="from 'dpnode approval list'")
        parser.add_argument("--reason", required=True, help="why, for the audit log")
        parser.set_defaults(func=cmd_approval_answer, approve=approve)


def add_budget_actions(bud: Any) -> None:
    """``dpnode budget requests`` and ``dpnode budget approve|deny ID --reason ...``."""
    listing = bud.add_parser("requests", help="budget requests, newest first")
    listing.add_argument("--status", help="pending, approved or denied")
    listing.add_argument("--limit", type=whole, default=100)
    listing.set_defaults(func=cmd_budget_requests)
    approve = bud.add_parser("approve", help="grant a budget request (by default what it asks)")
    deny = bud.add_parser("deny", help="deny a budget request")
    for parser, yes in ((approve, True), (deny, False)):
        parser.add_argument("id", type=whole, metavar="ID", help="from 'dpnode budget requests'")
        parser.add_argument("--reason", required=True, help="why, for the audit log")
        parser.set_defaults(func=cmd_budget_answer, approve=yes)
    approve.add_argument("--epsilon", type=number, help="grant this instead of what was asked")
    approve.add_argument("--delta", type=number, help="grant this instead of what was asked")


def add_dataset_actions(dataset: Any) -> None:
    """``dpnode dataset delete NAME_OR_ID [--charged]``."""
    delete = dataset.add_parser(
        "delete", help="delete a dataset (refused while the ledger has charges on it)"
    )
    delete.add_argument("dataset", metavar="NAME_OR_ID")
    delete.add_argument(
        "--charged",
        action="store_true",
        help="delete it even though publishes read it (the ledger keeps their charges)",
    )
    delete.set_defaults(func=cmd_dataset_delete)


__all__ = [
    "add_approval_actions",
    "add_budget_actions",
    "add_dataset_actions",
    "add_user_actions",
]

"""Admin pages: users and roles, budgets, approvals, the policy and the audit log.

Every route takes :data:`~dpnode.node.console.session.ConsoleAdmin`, which refuses anyone but
an admin with the API's own check (``dpnode.node.api.deps.get_admin``) before any data is read;
the pages then call the API's route functions, so what they show and change is what the admin
API shows and changes.
"""

from __future__ import annotations

import difflib
import json

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dpnode.core.errors import InvalidRequestError
from dpnode.node.api.deps import HasherDep, Limit, PathId, SessionDep, SettingsDep
from dpnode.node.api.numbers import is_number
from dpnode.node.api.routes import approvals as approval_routes
from dpnode.node.api.routes import audit as audit_routes
from dpnode.node.api.routes import budget as budget_routes
from dpnode.node.api.routes import policy as policy_routes
from dpnode.node.api.routes import users as user_routes
from dpnode.node.api.schemas import (
    ApprovalAnswer,
    BudgetRequestAnswer,
    PolicyApply,
    PolicyRevisionPublic,
    UserCreate,
    UserUpdate,
)
from dpnode.node.console.history import budget_view
from dpnode.node.console.render import PREFIX, ConsoleRoute, optional_int, page, redirect
from dpnode.node.console.session import ConsoleAdmin, Form

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

#: Fixed notices a redirect may ask a page to show (never text taken from the URL).
NOTICES = {
    "approved": "Approved.",
    "denied": "Denied.",
    "applied": "The policy was applied; it is in force from the next publish.",
    "unchanged": "That policy is already in force; nothing was stored.",
    "created": "The account was created.",
    "updated": "The account was updated.",
    # tokens carry no password: those issued before stay valid until they expire
    "password": "The password was changed (signed-in sessions stay valid until they expire).",
}


def _notice(done: str | None) -> str:
    return NOTICES.get(done or "", "")


def _amount(form: dict[str, str], name: str) -> float | None:
    raw = form.get(name, "").strip()
    if not raw:
        return None
    if not is_number(raw):  # float() reads 1_0 as 10, and other scripts' digits
        raise InvalidRequestError(f"{name} must be a number such as 0.5 or 1e-6, not {raw!r}")
    return float(raw)


@router.get("/users")
def user_list(
    request: Request, session: SessionDep, admin: ConsoleAdmin, done: str | None = None
) -> Response:
    found = user_routes.list_users(session, admin)
    return page(request, "users.html", title="Users and roles", users=found, notice=_notice(done))


@router.post("/users")
def user_create(
    session: SessionDep, hasher: HasherDep, admin: ConsoleAdmin, form: Form
) -> Response:
    body = UserCreate(
        email=form.get("email", ""), password=form.get("password", ""), role=form.get("role", "")
    )
    user_routes.create_user(body, session, hasher, admin)
    return redirect(f"{PREFIX}/users?done=created")


@router.post("/users/{user_id}")
def user_update(
    user_id: PathId, session: SessionDep, hasher: HasherDep, admin: ConsoleAdmin, form: Form
) -> Response:
    active = form.get("is_active")
    body = UserUpdate(
        role=form.get("role") or None,
        is_active=None if active is None else active == "true",
    )
    user_routes.update_user(user_id, body, session, hasher, admin)
    return redirect(f"{PREFIX}/users?done=updated")


@router.post("/users/{user_id}/password")
def user_password(
    user_id: PathId, session: SessionDep, hasher: HasherDep, admin: ConsoleAdmin, form: Form
) -> Response:
    """Set a new password for an account (``PATCH /api/v1/users/{id}``, audited)."""
    body = UserUpdate(password=form.get("password", ""))
    user_routes.update_user(user_id, body, session, hasher, admin)
    return redirect(f"{PREFIX}/users?done=password")


@router.get("/budgets")
def budgets(
    request: Request, session: SessionDep, settings: SettingsDep, admin: ConsoleAdmin
) -> Response:
    rows = [
        (u, budget_routes.get_budget(session, settings, admin, user_id=u.id))
        for u in user_routes.list_users(session, admin)
    ]
    return page(request, "budgets.html", title="Budgets", rows=rows)


@router.get("/budgets/{user_id}")
def user_budget(
    request: Request,
    user_id: PathId,
    session: SessionDep,
    settings: SettingsDep,
    admin: ConsoleAdmin,
) -> Response:
    view = budget_view(session, settings, admin, user_id)
    requests = budget_routes.list_budget_requests(session, admin, user_id=user_id, limit=50)
    grants = budget_routes.list_grants(session, admin, user_id=user_id, limit=50)
    return page(
        request,
        "budget.html",
        title=f"Budget of {view.subject.email}",
        view=view,
        requests=requests,
        grants=grants,
        approvals=None,
    )


@router.get("/approvals")
def pending(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    admin: ConsoleAdmin,
    done: str | None = None,
) -> Response:
    publishes = approval_routes.list_publish_approvals(session, settings, admin, status="pending")
    requests = budget_routes.list_budget_requests(session, admin, status="pending")
    return page(
        request,
        "approvals.html",
        title="Pending approvals",
        publishes=publishes,
        requests=requests,
        notice=_notice(done),
    )


@router.post("/approvals/{approval_id}/{answer}")
def answer_publish(
    approval_id: PathId,
    answer: str,
    session: SessionDep,
    settings: SettingsDep,
    admin: ConsoleAdmin,
    form: Form,
) -> Response:
    body = ApprovalAnswer(reason=form.get("reason", ""))
    if answer == "approve":
        approval_routes.approve_publish(session, settings, admin, approval_id, body)
    elif answer == "deny":
        approval_routes.deny_publish(session, settings, admin, approval_id, body)
    else:
        raise InvalidRequestError(f"unknown answer {answer!r}: approve or deny")
    return redirect(f"{PREFIX}/approvals?done={'approved' if answer == 'approve' else 'denied'}")


@router.post("/budget-requests/{request_id}/{answer}")
def answer_budget_request(
    request_id: PathId, answer: str, session: SessionDep, admin: ConsoleAdmin, form: Form
) -> Response:
    reason = form.get("reason", "")
    if answer == "approve":
        body = BudgetRequestAnswer(
            epsilon=_amount(form, "epsilon"), delta=_amount(form, "delta"), reason=reason
        )
        budget_routes.approve_budget_request(session, admin, request_id, body)
    elif answer == "deny":
        budget_routes.deny_budget_request(
            session, admin, request_id, BudgetRequestAnswer(reason=reason)
        )
    else:
        raise InvalidRequestError(f"unknown answer {answer!r}: approve or deny")
    return redirect(f"{PREFIX}/approvals?done={'approved' if answer == 'approve' else 'denied'}")


def _text(revision: PolicyRevisionPublic) -> list[str]:
    """A revision as lines to compare: its TOML source, or its document as sorted JSON."""
    text = revision.source or json.dumps(revision.document, indent=2, sort_keys=True)
    return text.splitlines()


def diff_lines(old: PolicyRevisionPublic, new: PolicyRevisionPublic) -> list[str]:
    """A unified diff between two revisions (the older first)."""
    return list(
        difflib.unified_diff(
            _text(old),
            _text(new),
            fromfile=f"revision {old.revision}",
            tofile=f"revision {new.revision}",
            lineterm="",
        )
    )


@router.get("/policy")
def policy(
    request: Request,
    session: SessionDep,
    admin: ConsoleAdmin,
    old: int | None = None,
    new: int | None = None,
    done: str | None = None,
) -> Response:
    in_force = policy_routes.get_policy(session, admin)
    revisions = policy_routes.list_revisions(session, admin)
    diff: list[str] | None = None
    if old is not None and new is not None:
        diff = diff_lines(
            policy_routes.get_revision(session, admin, old),
            policy_routes.get_revision(session, admin, new),
        )
    return page(
        request,
        "policy.html",
        title="Budget policy",
        in_force=in_force,
        revisions=revisions,
        diff=diff,
        compare={"old": old, "new": new},
        notice=_notice(done),
        in_force_text="\n".join(_text(in_force)),
    )


@router.post("/policy")
def apply(session: SessionDep, admin: ConsoleAdmin, form: Form) -> Response:
    body = PolicyApply(toml=form.get("toml", ""), reason=form.get("reason", ""))
    applied = policy_routes.apply_policy(session, admin, body)
    return redirect(f"{PREFIX}/policy?done={'applied' if applied.changed else 'unchanged'}")


@router.get("/audit")
def audit_log(
    request: Request,
    session: SessionDep,
    admin: ConsoleAdmin,
    action: str | None = None,
    actor_id: str | None = None,
    before_id: str | None = None,
    limit: Limit = 100,
) -> Response:
    events = audit_routes.list_audit_events(
        session,
        admin,
        action=action or None,
        actor_id=optional_int(actor_id, "actor"),
        before_id=optional_int(before_id, "before"),
        limit=limit,
    )
    return page(
        request,
        "audit.html",
        title="Audit log",
        events=events,
        filters={"action": action or "", "actor_id": actor_id or ""},
        limit=limit,
    )

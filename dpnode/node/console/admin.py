"""Admin pages: users and roles, budgets, approvals, the policy, the audit log and the network.

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
from sqlalchemy.orm import Session

from dpnode.core.errors import InvalidRequestError
from dpnode.node.api.deps import HasherDep, Limit, PathId, SessionDep, SettingsDep
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
from dpnode.node.console import budgets, network
from dpnode.node.console.forms import FormError, amount, form_error, notice
from dpnode.node.console.render import (
    PREFIX,
    REFUSALS,
    ConsoleRoute,
    optional_int,
    page,
    redirect,
)
from dpnode.node.console.session import ConsoleAdmin, Form
from dpnode.node.db.models import User
from dpnode.node.settings import Settings

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)
router.include_router(budgets.router)
router.include_router(network.router)


def _users_page(
    request: Request,
    session: Session,
    admin: User,
    *,
    notice: str = "",
    error: FormError | None = None,
    status: int = 200,
) -> Response:
    found = user_routes.list_users(session, admin)
    shown = {"new-user"} | {f"{form}-{u.id}" for u in found for form in ("user", "password")}
    if error is not None and error.form not in shown:  # no such account: say it on top
        error = FormError("page", "", error.message)
    return page(
        request,
        "users.html",
        status,
        title="Users and roles",
        users=found,
        notice=notice,
        error=error,
    )


@router.get("/users")
def user_list(
    request: Request, session: SessionDep, admin: ConsoleAdmin, done: str | None = None
) -> Response:
    return _users_page(request, session, admin, notice=notice(done))


@router.post("/users")
def user_create(
    request: Request, session: SessionDep, hasher: HasherDep, admin: ConsoleAdmin, form: Form
) -> Response:
    try:
        body = UserCreate(
            email=form.get("email", "").strip(),
            password=form.get("password", ""),
            role=form.get("role", ""),
        )
        user_routes.create_user(body, session, hasher, admin)
    except REFUSALS as exc:
        session.rollback()
        status, error = form_error(exc, "new-user", form, ["email", "password", "role"])
        return _users_page(request, session, admin, error=error, status=status)
    return redirect(f"{PREFIX}/users?done=created")


@router.post("/users/{user_id}")
def user_update(
    request: Request,
    user_id: PathId,
    session: SessionDep,
    hasher: HasherDep,
    admin: ConsoleAdmin,
    form: Form,
) -> Response:
    active = form.get("is_active")
    try:
        body = UserUpdate(
            role=form.get("role") or None,
            is_active=None if active is None else active == "true",
        )
        user_routes.update_user(user_id, body, session, hasher, admin)
    except REFUSALS as exc:
        session.rollback()
        status, error = form_error(exc, f"user-{user_id}", form, ["role", "is_active"])
        return _users_page(request, session, admin, error=error, status=status)
    return redirect(f"{PREFIX}/users?done=updated")


@router.post("/users/{user_id}/password")
def user_password(
    request: Request,
    user_id: PathId,
    session: SessionDep,
    hasher: HasherDep,
    admin: ConsoleAdmin,
    form: Form,
) -> Response:
    """Set a new password for an account (``PATCH /api/v1/users/{id}``, audited)."""
    try:
        body = UserUpdate(password=form.get("password", ""))
        user_routes.update_user(user_id, body, session, hasher, admin)
    except REFUSALS as exc:
        session.rollback()
        status, error = form_error(exc, f"password-{user_id}", form, ["password"])
        return _users_page(request, session, admin, error=error, status=status)
    return redirect(f"{PREFIX}/users?done=password")


def _approvals_page(
    request: Request,
    session: Session,
    settings: Settings,
    admin: User,
    *,
    notice: str = "",
    error: FormError | None = None,
    status: int = 200,
) -> Response:
    publishes = approval_routes.list_publish_approvals(session, settings, admin, status="pending")
    requests = budget_routes.list_budget_requests(session, admin, status="pending")
    if error is not None:
        # A form answered meanwhile (or never there) is gone from the page: say it on top.
        shown = {f"publish-{a.id}" for a in publishes} | {f"request-{r.id}" for r in requests}
        if error.form.rsplit("-", 1)[0] not in shown:
            error = FormError("page", "", error.message)
    return page(
        request,
        "approvals.html",
        status,
        title="Pending approvals",
        publishes=publishes,
        requests=requests,
        notice=notice,
        error=error,
    )


@router.get("/approvals")
def pending(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    admin: ConsoleAdmin,
    done: str | None = None,
) -> Response:
    return _approvals_page(request, session, settings, admin, notice=notice(done))


def _answer(answer: str) -> str:
    if answer not in ("approve", "deny"):
        raise InvalidRequestError(f"unknown answer {answer!r}: approve or deny")
    return answer


@router.post("/approvals/{approval_id}/{answer}")
def answer_publish(
    request: Request,
    approval_id: PathId,
    answer: str,
    session: SessionDep,
    settings: SettingsDep,
    admin: ConsoleAdmin,
    form: Form,
) -> Response:
    try:
        body = ApprovalAnswer(reason=form.get("reason", ""))
        if _answer(answer) == "approve":
            approval_routes.approve_publish(session, settings, admin, approval_id, body)
        else:
            approval_routes.deny_publish(session, settings, admin, approval_id, body)
    except REFUSALS as exc:
        session.rollback()
        where = f"publish-{approval_id}-{answer}"
        status, error = form_error(exc, where, form, ["reason"])
        return _approvals_page(request, session, settings, admin, error=error, status=status)
    return redirect(f"{PREFIX}/approvals?done={'approved' if answer == 'approve' else 'denied'}")


@router.post("/budget-requests/{request_id}/{answer}")
def answer_budget_request(
    request: Request,
    request_id: PathId,
    answer: str,
    session: SessionDep,
    settings: SettingsDep,
    admin: ConsoleAdmin,
    form: Form,
) -> Response:
    reason = form.get("reason", "")
    try:
        if _answer(answer) == "approve":
            body = BudgetRequestAnswer(
                epsilon=amount(form, "epsilon"), delta=amount(form, "delta"), reason=reason
            )
            budget_routes.approve_budget_request(session, admin, request_id, body)
        else:
            budget_routes.deny_budget_request(
                session, admin, request_id, BudgetRequestAnswer(reason=reason)
            )
    except REFUSALS as exc:
        session.rollback()
        where = f"request-{request_id}-{answer}"
        status, error = form_error(exc, where, form, ["reason", "epsilon", "delta"])
        return _approvals_page(request, session, settings, admin, error=error, status=status)
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


def _policy_page(
    request: Request,
    session: Session,
    admin: User,
    *,
    old: int | None = None,
    new: int | None = None,
    notice: str = "",
    error: FormError | None = None,
    status: int = 200,
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
        status,
        title="Budget policy",
        in_force=in_force,
        revisions=revisions,
        diff=diff,
        compare={"old": old, "new": new},
        notice=notice,
        error=error,
        in_force_text="\n".join(_text(in_force)),
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
    return _policy_page(request, session, admin, old=old, new=new, notice=notice(done))


@router.post("/policy")
def apply(request: Request, session: SessionDep, admin: ConsoleAdmin, form: Form) -> Response:
    """Apply the policy typed in the form; a refused one is shown again, with the parser's
    message next to it, on the same page."""
    try:
        body = PolicyApply(toml=form.get("toml", ""), reason=form.get("reason", ""))
        applied = policy_routes.apply_policy(session, admin, body)
    except REFUSALS as exc:
        session.rollback()
        status, error = form_error(exc, "policy", form, ["toml", "reason"])
        return _policy_page(request, session, admin, error=error, status=status)
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

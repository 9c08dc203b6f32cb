"""Budget requests and grants: users ask for more budget, admins grant it (or refuse).

A grant is append-only and adds to the user's allocation from the moment it is made, in
every later renewal window too (``policies.apply_grant``). A request changes state once,
pending -> approved (with the grant it made) or denied; each step is in the audit log.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from dpnode.core.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)
from dpnode.node.db.base import utcnow
from dpnode.node.db.models import BudgetGrant, BudgetRequest, RequestStatus, Role, User
from dpnode.node.numbers import read_id
from dpnode.node.services import audit, costs, users
from dpnode.node.services.approvals import decider

__all__ = [
    "answer_request",
    "find_user",
    "grant",
    "list_grants",
    "list_requests",
    "request_budget",
]


def _amounts(epsilon: float, delta: float) -> tuple[int, int]:
    eps = costs.units_down(epsilon, costs.EPSILON_UNIT, "epsilon")
    costs.check_epsilon_size(epsilon)
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 <= delta < 1:
        raise InvalidRequestError(f"delta must be a number in [0, 1), got {delta!r}")
    return eps, costs.units_down(delta, costs.DELTA_UNIT, "delta")


def _reason(reason: str, what: str) -> str:
    if not reason.strip():
        raise InvalidRequestError(f"say why: a reason is required to {what}")
    return reason.strip()


def find_user(session: Session, ref: int | str) -> User:
    """A user by id or email: a text that spells an id as JSON writes one (``"42"``, from the
    command line or a JSON body) is an id, any other an email.

    Raises:
        NotFoundError: no such user.
        InvalidRequestError: a text that is neither an id nor an email (``"²"``, ``"042"``).
    """
    ident = ref if isinstance(ref, int) else read_id(ref)  # isdigit() took '²' and '١'
    if ident is None:
        email = users.normalise_email(str(ref))
        found = session.scalar(select(User).where(User.email == email))
        if found is None:
            raise NotFoundError(f"no user with email {email}")
        return found
    user = session.get(User, ident)
    if user is None:
        raise NotFoundError(f"no user with id {ident}")
    return user


def request_budget(
    session: Session, actor: User, *, epsilon: float, delta: float = 0.0, reason: str
) -> BudgetRequest:
    """Ask the admins for more budget; commits.

    Raises:
        InvalidRequestError: a bad amount (negative, NaN, nothing at all) or no reason.
    """
    eps, dlt = _amounts(epsilon, delta)
    if eps == 0 and dlt == 0:
        raise InvalidRequestError("ask for some epsilon (or delta): both are 0")
    row = BudgetRequest(
        user_id=actor.id,
        epsilon_units=eps,
        delta_units=dlt,
        reason=_reason(reason, "ask for budget"),
    )
    session.add(row)
    session.flush()
    audit.record(
        session,
        actor,
        "budget.request",
        target_type="budget_request",
        target_id=row.id,
        epsilon_units=eps,
        delta_units=dlt,
        reason=row.reason,
    )
    session.commit()
    return row


def list_requests(
    session: Session,
    actor: User | None,
    *,
    status: str | None = None,
    user_id: int | None = None,
    limit: int = 100,
) -> list[BudgetRequest]:
    """Requests, newest first: admins (and the operator's command line, ``None``) see
    everyone's, anyone else their own."""
    query = select(BudgetRequest).order_by(BudgetRequest.id.desc()).limit(limit)
    if actor is not None and actor.role is not Role.ADMIN:
        query = query.where(BudgetRequest.user_id == actor.id)
    elif user_id is not None:
        query = query.where(BudgetRequest.user_id == user_id)
    if status is not None:
        try:
            query = query.where(BudgetRequest.status == RequestStatus(status))
        except ValueError:
            raise InvalidRequestError(
                f"unknown status {status!r}; choose one of: pending, approved, denied"
            ) from None
    return list(session.scalars(query))


def _grant(
    session: Session,
    admin: User | None,
    user: User,
    eps: int,
    dlt: int,
    reason: str,
    *,
    operator: str | None,
    request_id: int | None = None,
) -> BudgetGrant:
    by = decider(admin, operator)
    row = BudgetGrant(
        at=utcnow(),
        user_id=user.id,
        epsilon_units=eps,
        delta_units=dlt,
        granted_by_id=admin.id if admin is not None else None,
        granted_by=by,
        reason=reason,
        request_id=request_id,
    )
    session.add(row)
    session.flush()
    return row


def grant(
    session: Session,
    admin: User | None,
    user_ref: int | str,
    *,
    epsilon: float,
    delta: float = 0.0,
    reason: str,
    operator: str | None = None,
) -> BudgetGrant:
    """Add budget to a user's allocation, without a request; commits.

    Args:
        admin: who grants, or ``None`` for the node's operator on the command line.
        operator: who ran the command line, when ``admin`` is None.

    Raises:
        PermissionDeniedError: ``admin`` is not an admin.
        NotFoundError: no such user.
        InvalidRequestError: a bad amount or no reason.
    """
    if admin is not None and admin.role is not Role.ADMIN:
        raise PermissionDeniedError("only admins may grant budget")
    eps, dlt = _amounts(epsilon, delta)
    if eps == 0 and dlt == 0:
        raise InvalidRequestError("grant some epsilon (or delta): both are 0")
    text = _reason(reason, "grant budget")
    user = find_user(session, user_ref)
    row = _grant(session, admin, user, eps, dlt, text, operator=operator)
    audit.record(
        session,
        admin,
        "budget.grant",
        target_type="user",
        target_id=user.id,
        grant_id=row.id,
        user_email=user.email,
        epsilon_units=eps,
        delta_units=dlt,
        reason=text,
        **({"operator": operator} if admin is None else {}),
    )
    session.commit()
    return row


def answer_request(
    session: Session,
    admin: User | None,
    request_id: int,
    *,
    approve: bool,
    epsilon: float | None = None,
    delta: float | None = None,
    reason: str = "",
    operator: str | None = None,
) -> BudgetRequest:
    """Approve (granting ``epsilon``/``delta``, by default what was asked) or deny; commits.

    Args:
        admin: who answers, or ``None`` for the node's operator on the command line.
        operator: who ran the command line, when ``admin`` is None.

    Raises:
        PermissionDeniedError: not an admin.
        NotFoundError: no such request.
        ConflictError: it was already answered.
        InvalidRequestError: no reason (the audit log says who answered, and why), or a bad
            amount.
    """
    if admin is not None and admin.role is not Role.ADMIN:
        raise PermissionDeniedError("only admins may answer budget requests")
    query = select(BudgetRequest).where(BudgetRequest.id == request_id)
    if session.get_bind().dialect.name != "sqlite":
        query = query.with_for_update()  # two admins answering at once: one wins
    row = session.scalar(query)
    if row is None:
        raise NotFoundError(f"no budget request {request_id}")
    if row.status is not RequestStatus.PENDING:
        raise ConflictError(f"budget request {request_id} was already {row.status.value}")
    _reason(reason, "approve a budget request" if approve else "deny a budget request")
    user = session.get(User, row.user_id)
    assert user is not None
    row.decided_at = utcnow()
    row.decided_by_id = admin.id if admin is not None else None
    row.decided_by = decider(admin, operator)
    row.decision_reason = reason.strip()
    if approve:
        # By default exactly what was asked, in units (no round trip through a float).
        eps = row.epsilon_units if epsilon is None else _amounts(epsilon, 0.0)[0]
        dlt = row.delta_units if delta is None else _amounts(0.0, delta)[1]
        if eps == 0 and dlt == 0:
            raise InvalidRequestError("an approval grants something: epsilon and delta are 0")
        made = _grant(
            session,
            admin,
            user,
            eps,
            dlt,
            row.decision_reason or row.reason,
            operator=operator,
            request_id=row.id,
        )
        row.status = RequestStatus.APPROVED
        row.grant_id = made.id
        action = "budget.request_approved"
        more = {"grant_id": made.id, "epsilon_units": eps, "delta_units": dlt}
    else:
        row.status = RequestStatus.DENIED
        action, more = "budget.request_denied", {}
    audit.record(
        session,
        admin,
        action,
        target_type="budget_request",
        target_id=row.id,
        user_id=user.id,
        user_email=user.email,
        asked_epsilon_units=row.epsilon_units,
        asked_delta_units=row.delta_units,
        reason=row.decision_reason,
        **more,
        **({"operator": operator} if admin is None else {}),
    )
    session.commit()
    return row


def list_grants(
    session: Session, *, user_id: int | None = None, limit: int = 100
) -> list[BudgetGrant]:
    """Grants, newest first (one user's, or everyone's)."""
    query = select(BudgetGrant).order_by(BudgetGrant.id.desc()).limit(limit)
    if user_id is not None:
        query = query.where(BudgetGrant.user_id == user_id)
    return list(session.scalars(query))

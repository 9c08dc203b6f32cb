from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import AwareDatetime
from sqlalchemy import select

from dpnode.core.errors import PermissionDeniedError
from dpnode.node.api.deps import (
    AdminUser,
    CurrentUser,
    Limit,
    PathId,
    QueryFlag,
    QueryId,
    SessionDep,
    SettingsDep,
)
from dpnode.node.api.numbers import TimeText
from dpnode.node.api.openapi import errors
from dpnode.node.api.schemas import (
    BudgetGrantCreate,
    BudgetGrantPublic,
    BudgetPublic,
    BudgetRequestAnswer,
    BudgetRequestCreate,
    BudgetRequestPublic,
    LedgerEntryPublic,
    LedgerLinePublic,
    LedgerRunPublic,
)
from dpnode.node.db.models import BudgetGrant, BudgetRequest, LedgerEntry, Role, User
from dpnode.node.services import budget_requests, budget_status, ledger
from dpnode.node.services.budget_status import Status
from dpnode.node.services.costs import DELTA_UNIT, EPSILON_UNIT, RHO_UNIT, TV_UNIT

router = APIRouter(tags=["budget"])


def budget_public(b: Status) -> BudgetPublic:
    spent_epsilon, spent_delta = b.spent()
    allocation, used = b.status.allocation, b.status.spent
    return BudgetPublic(
        epsilon=b.epsilon,
        delta=b.delta,
        spent_epsilon=spent_epsilon,
        spent_delta=spent_delta,
        remaining_epsilon=b.remaining_epsilon,
        pure_epsilon=float(used.epsilon_units * EPSILON_UNIT),
        rho=float(used.rho_units * RHO_UNIT),
        sampler_tv=float(b.spent_tv_units * TV_UNIT),
        remaining_delta=b.remaining_delta,
        epsilon_rule=allocation.epsilon_rule,
        delta_rule=allocation.delta_rule,
        granted_epsilon=float(sum(g.epsilon_units for g in allocation.grants) * EPSILON_UNIT),
        granted_delta=float(sum(g.delta_units for g in allocation.grants) * DELTA_UNIT),
        period_start=b.status.period_start,
        renews_at=b.status.remaining.renews_at,
        policy=b.in_force.name,
        policy_revision=b.in_force.revision,
    )


def ledger_public(
    e: LedgerEntry, email: str | None = None, used: ledger.Used | None = None
) -> LedgerEntryPublic:
    used = ledger.NOTHING if used is None else used
    return LedgerEntryPublic(
        id=e.id,
        at=e.at,
        user_id=e.user_id,
        mechanism=e.mechanism,
        epsilon=float(e.epsilon_units * EPSILON_UNIT),
        rho=float(e.rho_units * RHO_UNIT),
        sampler_tv=float(e.tv_units * DELTA_UNIT),  # the ledger keeps the samplers' delta
        dataset_ids=e.dataset_ids,
        graph_hash=e.graph_hash,
        detail=e.detail,
        policy_revision=e.policy_revision,
        user_email=email,
        run_id=e.run_id,
        cap_only=bool(e.cap_only),
        epsilon_used=_epsilon(used.epsilon_units),
        delta_used=float(used.delta_units * DELTA_UNIT),
    )


def _epsilon(units: int | None) -> float | None:
    return None if units is None else float(units * EPSILON_UNIT)


def line_public(line: ledger.Line, emails: dict[int, str]) -> LedgerLinePublic:
    entries, run = line.entries, line.run
    newest, oldest = entries[0], entries[-1]
    total = line.total
    mechanisms = sorted({e.mechanism for e in entries})
    return LedgerLinePublic(
        id=newest.id,
        at=newest.at,
        first_at=oldest.at,
        kind="charge" if run is None else "run",
        user_id=newest.user_id,
        user_email=emails.get(newest.user_id),
        mechanism=", ".join(mechanisms),
        steps=len(entries),
        epsilon_used=_epsilon(total.epsilon_units),
        delta_used=float(total.delta_units * DELTA_UNIT),
        epsilon=float(sum(e.epsilon_units for e in entries) * EPSILON_UNIT),
        rho=float(sum(e.rho_units for e in entries) * RHO_UNIT),
        sampler_tv=float(sum(e.tv_units for e in entries) * DELTA_UNIT),
        dataset_ids=sorted({d for e in entries for d in e.dataset_ids}),
        policy_revision=newest.policy_revision,
        run=None
        if run is None
        else LedgerRunPublic(
            id=run.id,
            created_at=run.created_at,
            description=run.description,
            steps=run.steps,
            step_epsilon=float(run.step_epsilon_units * EPSILON_UNIT),
            step_delta=float(run.step_delta_units * DELTA_UNIT),
            approval_id=run.approval_id,
        ),
        entries=[ledger_public(e, emails.get(e.user_id), line.used[e.id]) for e in entries],
    )


def request_public(r: BudgetRequest, grant: BudgetGrant | None) -> BudgetRequestPublic:
    return BudgetRequestPublic(
        id=r.id,
        user_id=r.user_id,
        user_email=r.user.email,
        created_at=r.created_at,
        epsilon=float(r.epsilon_units * EPSILON_UNIT),
        delta=float(r.delta_units * DELTA_UNIT),
        reason=r.reason,
        status=r.status.value,
        decided_at=r.decided_at,
        decided_by=r.decided_by,
        decision_reason=r.decision_reason,
        granted_epsilon=None if grant is None else float(grant.epsilon_units * EPSILON_UNIT),
        granted_delta=None if grant is None else float(grant.delta_units * DELTA_UNIT),
    )


def grant_public(g: BudgetGrant) -> BudgetGrantPublic:
    return BudgetGrantPublic(
        id=g.id,
        at=g.at,
        user_id=g.user_id,
        epsilon=float(g.epsilon_units * EPSILON_UNIT),
        delta=float(g.delta_units * DELTA_UNIT),
        granted_by=g.granted_by,
        reason=g.reason,
        request_id=g.request_id,
    )


def _subject(user: User, user_id: int | None) -> int:
    if user_id is None or user_id == user.id:
        return user.id
    if user.role is not Role.ADMIN:
        raise PermissionDeniedError("only admins may read another user's budget or ledger")
    return user_id


@router.get("/budget", responses=errors(403))
def get_budget(
    session: SessionDep, settings: SettingsDep, user: CurrentUser, user_id: QueryId = None
) -> BudgetPublic:
    """Your privacy budget under the policy in force (admins: anyone's, with ``user_id``)."""
    return budget_public(budget_status.budget_of(session, settings, _subject(user, user_id)))


def _utc(at: datetime | None) -> datetime | None:
    """``at`` in UTC; a time whose UTC falls outside the years 1 to 9999 (``9999-12-31T23:59
    -05:00``), at the end of that range: no charge is beyond it."""
    if at is None:
        return None
    try:
        return at.astimezone(UTC)
    except OverflowError:
        return (datetime.max if at.year == datetime.max.year else datetime.min).replace(tzinfo=UTC)


def _emails(session: SessionDep, user_ids: set[int]) -> dict[int, str]:
    owners = select(User).where(User.id.in_(user_ids))
    return {u.id: u.email for u in session.scalars(owners)}


def _ledger_subject(user: User, user_id: int | None, all_users: bool) -> int | None:
    if all_users and user.role is not Role.ADMIN:
        raise PermissionDeniedError("only admins may read everyone's ledger")
    return None if all_users and user_id is None else _subject(user, user_id)


@router.get("/ledger", responses=errors(403))
def get_ledger(
    session: SessionDep,
    settings: SettingsDep,
    user: CurrentUser,
    user_id: QueryId = None,
    all_users: QueryFlag = False,
    dataset_id: QueryId = None,
    run_id: QueryId = None,
    before_id: QueryId = None,
    since: Annotated[AwareDatetime | None, Query(), TimeText] = None,
    until: Annotated[AwareDatetime | None, Query(), TimeText] = None,
    limit: Limit = 100,
) -> list[LedgerEntryPublic]:
    """Your privacy charges, newest first, one row each. Admins: anyone's (``user_id``) or
    everyone's (``all_users=true``), optionally only those reading ``dataset_id``, the steps
    of training run ``run_id``, or charged at or after ``since`` and before ``until``;
    ``before_id`` pages. Each row's ``epsilon_used`` is what it added to the user's epsilon
    used: the rows of the budget's window add up to its ``spent_epsilon``."""
    subject = _ledger_subject(user, user_id, all_users)
    entries = ledger.ledger_of(
        session,
        subject,
        dataset_id=dataset_id,
        run_id=run_id,
        before_id=before_id,
        since=_utc(since),
        until=_utc(until),
        limit=limit,
    )
    used = ledger.used_by_row(session, ledger.statuses(session, settings), entries)
    emails = _emails(session, {e.user_id for e in entries})
    return [ledger_public(e, emails.get(e.user_id), used[e.id]) for e in entries]


@router.get("/ledger/grouped", responses=errors(403))
def get_ledger_grouped(
    session: SessionDep,
    settings: SettingsDep,
    user: CurrentUser,
    user_id: QueryId = None,
    all_users: QueryFlag = False,
    dataset_id: QueryId = None,
    before_id: QueryId = None,
    since: Annotated[AwareDatetime | None, Query(), TimeText] = None,
    until: Annotated[AwareDatetime | None, Query(), TimeText] = None,
    limit: Limit = 100,
) -> list[LedgerLinePublic]:
    """The ledger with each training run's steps on one line (``kind`` ``"run"``: its
    ``steps``, their ``epsilon_used`` summed, the steps themselves in ``entries``) and every
    other charge on a line of its own, newest first. The filters are ``GET /ledger``'s;
    ``limit`` counts lines, and ``before_id`` (a line's ``id``) pages."""
    subject = _ledger_subject(user, user_id, all_users)
    lines = ledger.lines_of(
        session,
        settings,
        subject,
        dataset_id=dataset_id,
        before_id=before_id,
        since=_utc(since),
        until=_utc(until),
        limit=limit,
    )
    emails = _emails(session, {e.user_id for line in lines for e in line.entries})
    return [line_public(line, emails) for line in lines]


@router.post("/budget/requests", status_code=201)
def create_budget_request(
    session: SessionDep, user: CurrentUser, body: BudgetRequestCreate
) -> BudgetRequestPublic:
    """Ask the admins for more budget, saying why."""
    row = budget_requests.request_budget(
        session, user, epsilon=body.epsilon, delta=body.delta, reason=body.reason
    )
    return request_public(row, None)


@router.get("/budget/requests")
def list_budget_requests(
    session: SessionDep,
    user: CurrentUser,
    status: str | None = None,
    user_id: QueryId = None,
    limit: Limit = 100,
) -> list[BudgetRequestPublic]:
    """Budget requests, newest first: admins see everyone's, anyone else their own."""
    rows = budget_requests.list_requests(session, user, status=status, user_id=user_id, limit=limit)
    return [request_public(r, _grant_of(session, r)) for r in rows]


def _grant_of(session: SessionDep, row: BudgetRequest) -> BudgetGrant | None:
    return None if row.grant_id is None else session.get(BudgetGrant, row.grant_id)


@router.post("/budget/requests/{request_id}/approve", responses=errors(404, 409))
def approve_budget_request(
    session: SessionDep, admin: AdminUser, request_id: PathId, body: BudgetRequestAnswer
) -> BudgetRequestPublic:
    """Approve a pending request, granting what was asked or ``epsilon``/``delta`` (admins)."""
    row = budget_requests.answer_request(
        session,
        admin,
        request_id,
        approve=True,
        epsilon=body.epsilon,
        delta=body.delta,
        reason=body.reason,
    )
    return request_public(row, _grant_of(session, row))


@router.post("/budget/requests/{request_id}/deny", responses=errors(404, 409))
def deny_budget_request(
    session: SessionDep, admin: AdminUser, request_id: PathId, body: BudgetRequestAnswer
) -> BudgetRequestPublic:
    """Deny a pending request, saying why (admins)."""
    row = budget_requests.answer_request(
        session, admin, request_id, approve=False, reason=body.reason
    )
    return request_public(row, None)


@router.post("/budget/grants", status_code=201, responses=errors(404))
def create_grant(
    session: SessionDep, admin: AdminUser, body: BudgetGrantCreate
) -> BudgetGrantPublic:
    """Add budget to a user's allocation directly, saying why (admins)."""
    row = budget_requests.grant(
        session, admin, body.user, epsilon=body.epsilon, delta=body.delta, reason=body.reason
    )
    return grant_public(row)


@router.get("/budget/grants", responses=errors(403))
def list_grants(
    session: SessionDep, user: CurrentUser, user_id: QueryId = None, limit: Limit = 100
) -> list[BudgetGrantPublic]:
    """Budget grants, newest first: yours (admins: anyone's, or everyone's without ``user_id``)."""
    subject = user_id if user.role is Role.ADMIN else _subject(user, user_id)
    return [
        grant_public(g) for g in budget_requests.list_grants(session, user_id=subject, limit=limit)
    ]

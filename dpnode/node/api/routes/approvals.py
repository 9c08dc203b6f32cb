from __future__ import annotations

from fastapi import APIRouter

from dpnode.node.api.deps import AdminUser, CurrentUser, Limit, PathId, SessionDep
from dpnode.node.api.openapi import errors
from dpnode.node.api.schemas import ApprovalAnswer, PublishApprovalPublic
from dpnode.node.db.models import PublishApproval
from dpnode.node.services import approvals
from dpnode.node.services.budget import DELTA_UNIT, EPSILON_UNIT

router = APIRouter(prefix="/publish/approvals", tags=["publish"])


def approval_public(a: PublishApproval) -> PublishApprovalPublic:
    return PublishApprovalPublic(
        id=a.id,
        user_id=a.user_id,
        user_email=a.user.email,
        created_at=a.created_at,
        mechanism=a.mechanism,
        epsilon=float(a.epsilon_units * EPSILON_UNIT),
        delta=float(a.delta_units * DELTA_UNIT),
        dataset_ids=a.dataset_ids,
        graph_hash=a.graph_hash,
        rule=a.rule,
        reason=a.reason,
        policy_revision=a.policy_revision,
        status=a.status.value,
        decided_at=a.decided_at,
        decided_by=a.decided_by,
        decision_reason=a.decision_reason,
        ledger_id=a.ledger_id,
        kind=a.kind,
        description=a.description,
        steps=a.steps,
        steps_used=a.steps_used,
        step_epsilon=None
        if a.step_epsilon_units is None
        else float(a.step_epsilon_units * EPSILON_UNIT),
        step_delta=None if a.step_delta_units is None else float(a.step_delta_units * DELTA_UNIT),
    )


@router.get("")
def list_publish_approvals(
    session: SessionDep,
    user: CurrentUser,
    status: str | None = None,
    limit: Limit = 100,
) -> list[PublishApprovalPublic]:
    """Publishes and training runs waiting for (or answered by) an admin: admins see all,
    others their own."""
    rows = approvals.list_approvals(session, user, status=status, limit=limit)
    return [approval_public(a) for a in rows]


@router.post("/{approval_id}/approve", responses=errors(404, 409))
def approve_publish(
    session: SessionDep, admin: AdminUser, approval_id: PathId, body: ApprovalAnswer
) -> PublishApprovalPublic:
    """Approve a waiting publish: the user's next identical publish runs, once; or a
    training run: its planned steps run (admins)."""
    row = approvals.answer(session, admin, approval_id, approve=True, reason=body.reason)
    return approval_public(row)


@router.post("/{approval_id}/deny", responses=errors(404, 409))
def deny_publish(
    session: SessionDep, admin: AdminUser, approval_id: PathId, body: ApprovalAnswer
) -> PublishApprovalPublic:
    """Deny a waiting publish, saying why (admins)."""
    row = approvals.answer(session, admin, approval_id, approve=False, reason=body.reason)
    return approval_public(row)

from __future__ import annotations

from collections.abc import Sequence

from fastapi import APIRouter
from sqlalchemy.orm import Session

from dpnode.node.api.deps import AdminUser, CurrentUser, Limit, PathId, SessionDep, SettingsDep
from dpnode.node.api.openapi import errors
from dpnode.node.api.schemas import (
    ApprovalAnswer,
    DatasetBudgetPublic,
    DatasetReadPublic,
    PublishApprovalPublic,
)
from dpnode.node.db.models import PublishApproval, User
from dpnode.node.services import approvals
from dpnode.node.services.approval_review import Review, reviews
from dpnode.node.services.costs import DELTA_UNIT, EPSILON_UNIT
from dpnode.node.services.dataset_budgets import DatasetBudget
from dpnode.node.settings import Settings

router = APIRouter(prefix="/publish/approvals", tags=["publish"])


def budget_public(b: DatasetBudget) -> DatasetBudgetPublic:
    return DatasetBudgetPublic(
        dataset_id=b.dataset_id,
        name=b.name,
        capped=b.capped,
        epsilon=b.epsilon,
        delta=b.delta,
        epsilon_used=b.epsilon_used,
        delta_used=b.delta_used,
        epsilon_remaining=b.epsilon_remaining,
        delta_remaining=b.delta_remaining,
        renews_at=b.renews_at,
    )


def approval_public(a: PublishApproval, review: Review) -> PublishApprovalPublic:
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
        computation=review.computation,
        sensitivity=review.sensitivity,
        noise_scale=review.noise_scale,
        outputs=review.outputs,
        remaining_epsilon=review.remaining_epsilon,
        remaining_delta=review.remaining_delta,
        datasets=[
            DatasetReadPublic(
                dataset_id=d.dataset_id,
                name=d.name,
                budget=None if d.budget is None else budget_public(d.budget),
            )
            for d in review.datasets
        ],
    )


def _public(
    session: Session, settings: Settings, viewer: User, rows: Sequence[PublishApproval]
) -> list[PublishApprovalPublic]:
    found = reviews(session, settings, viewer, rows)
    return [approval_public(a, found[a.id]) for a in rows]


@router.get("")
def list_publish_approvals(
    session: SessionDep,
    settings: SettingsDep,
    user: CurrentUser,
    status: str | None = None,
    limit: Limit = 100,
) -> list[PublishApprovalPublic]:
    """Publishes and training runs waiting for (or answered by) an admin: admins see all,
    others their own. Each says what it computes (``computation``: pseudo-torch lines), its
    sensitivity and noise scale, the requester's description and remaining budget, and the
    datasets it reads with their caps (caps: for admins and the datasets' owners)."""
    rows = approvals.list_approvals(session, user, status=status, limit=limit)
    return _public(session, settings, user, rows)


@router.post("/{approval_id}/approve", responses=errors(404, 409))
def approve_publish(
    session: SessionDep,
    settings: SettingsDep,
    admin: AdminUser,
    approval_id: PathId,
    body: ApprovalAnswer,
) -> PublishApprovalPublic:
    """Approve a waiting publish: the user's next identical publish runs, once; or a
    training run: its planned steps run (admins)."""
    row = approvals.answer(session, settings, admin, approval_id, approve=True, reason=body.reason)
    return _public(session, settings, admin, [row])[0]


@router.post("/{approval_id}/deny", responses=errors(404, 409))
def deny_publish(
    session: SessionDep,
    settings: SettingsDep,
    admin: AdminUser,
    approval_id: PathId,
    body: ApprovalAnswer,
) -> PublishApprovalPublic:
    """Deny a waiting publish, saying why (admins)."""
    row = approvals.answer(session, settings, admin, approval_id, approve=False, reason=body.reason)
    return _public(session, settings, admin, [row])[0]

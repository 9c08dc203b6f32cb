"""Publishes that wait for an admin: queued by the publish transaction, answered by admins.

The design keeps nothing private on hold. A publish above the policy's approval threshold is
refused with ``approval_required`` and a request id; its result is discarded. An admin
approves or denies the request; the user then publishes the same computation again (same
frame bytes, epsilon and delta), and the publish transaction decides it with the admin's
answer (:func:`policies.decide_approved`: every cap and budget still applies at that time).
An approval covers one execution: it is used up by the publish it lets through, so a second
run of the same computation waits again. A denial is reported once, to the next attempt.

A training run is judged once, as a whole, before its first step (``dpnode.node.services.runs``):
when its total is above a threshold, its plan is queued here as one request (``kind``
``"run"``, identified by the hash of the plan). Once approved, planning the same run again
records the run with this approval (``TrainingRun.approval_id``); each step's publish names
the run, and the publish transaction lets up to ``steps`` publishes of exactly the planned
per-step amount through
under it (:func:`run_step`, counted by :func:`use` in that same serialised transaction),
every cap and the budget still applying to each. A step beyond the plan, or asking for
anything else, is judged as an ordinary publish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dpnode import policies
from dpnode.core.errors import (
    ApprovalRequiredError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)
from dpnode.node.db.base import utcnow
from dpnode.node.db.models import PublishApproval, RequestStatus, Role, User
from dpnode.node.services import approval_review, audit
from dpnode.node.settings import Settings

if TYPE_CHECKING:
    from dpnode.node.services.costs import Cost
    from dpnode.node.services.policy import InForce

__all__ = [
    "MAX_DESCRIPTION",
    "PUBLISH",
    "RUN",
    "answer",
    "answer_of",
    "check_description",
    "find",
    "find_run",
    "list_approvals",
    "queue",
    "queue_run",
    "run_step",
    "use",
    "waiting",
]

_OPEN = (RequestStatus.PENDING, RequestStatus.APPROVED, RequestStatus.DENIED)
#: ``PublishApproval.kind``: one publish, or a training run's steps together.
PUBLISH, RUN = "publish", "run"
#: The longest description a publish or a run may carry (what it is for, in the requester's words).
MAX_DESCRIPTION = 500


def check_description(text: str, what: str = "a publish's description") -> str:
    """``text`` without surrounding blanks, refused when too long or holding control characters
    other than newlines and tabs (it is shown to admins).

    >>> check_description("  mean bmi for the report ")
    'mean bmi for the report'
    >>> check_description("x" * 501, "it")
    Traceback (most recent call last):
    ...
    dpnode.core.errors.InvalidRequestError: it is at most 500 characters, got 501
    """
    if len(text) > MAX_DESCRIPTION:
        raise InvalidRequestError(
            f"{what} is at most {MAX_DESCRIPTION} characters, got {len(text)}"
        )
    if any(ord(c) < 32 and c not in "\n\t" for c in text):
        raise InvalidRequestError(f"{what} may not hold control characters (newlines are fine)")
    return text.strip()


def _key(cost: Cost) -> str:
    key = cost.frame_hash() if callable(cost.frame_hash) else cost.frame_hash
    return key or cost.graph_hash or ""


def find(session: Session, user_id: int, cost: Cost) -> PublishApproval | None:
    """The newest open request for exactly this computation and amount, if any."""
    query = (
        select(PublishApproval)
        .where(
            PublishApproval.user_id == user_id,
            PublishApproval.kind == PUBLISH,
            PublishApproval.frame_hash == _key(cost),
            PublishApproval.mechanism == cost.mechanism,
            PublishApproval.epsilon_units == cost.asked_epsilon,
            PublishApproval.delta_units == cost.asked_delta_units,
            PublishApproval.status.in_(_OPEN),
        )
        .order_by(PublishApproval.id.desc())
        .limit(1)
    )
    return session.scalar(query)


def answer_of(row: PublishApproval) -> policies.Approval | None:
    """The admin's answer as the policies read it; ``None`` while pending."""
    if row.status is RequestStatus.PENDING or row.decided_at is None:
        return None
    run = row.kind == RUN  # covers each step's amount (its total was judged at planning)
    return policies.Approval(
        approved=row.status is RequestStatus.APPROVED,
        by=row.decided_by or "",
        at=row.decided_at,
        reason=row.decision_reason,
        epsilon_units=row.step_epsilon_units if run else row.epsilon_units,
        delta_units=row.step_delta_units if run else row.delta_units,
    )


def queue(
    session: Session,
    user: audit.Actor,
    cost: Cost,
    decision: policies.Decision,
    revision: int | None,
) -> PublishApproval:
    """Store a pending request for this publish (in the caller's transaction)."""
    row = PublishApproval(
        user_id=user.id,
        frame_hash=_key(cost),
        graph_hash=cost.graph_hash,
        mechanism=cost.mechanism,
        epsilon_units=cost.asked_epsilon,
        delta_units=cost.asked_delta_units,
        dataset_ids=sorted(set(cost.dataset_ids)),
        rule=decision.rule,
        reason=decision.reason,
        policy_revision=revision,
        description=cost.description,
        detail=_detail(cost),
    )
    session.add(row)
    session.flush()
    return row


def _detail(cost: Cost) -> dict[str, Any]:
    """What an admin reads of a queued publish: its listing, sensitivity, noise scale and
    output shapes (public: made from the graph and the public metadata alone)."""
    computation = cost.computation() if callable(cost.computation) else cost.computation
    return {**cost.detail, "computation": computation or []}


def find_run(session: Session, user_id: int, plan_hash: str) -> PublishApproval | None:
    """The newest open request for exactly this run's plan, if any."""
    query = (
        select(PublishApproval)
        .where(
            PublishApproval.user_id == user_id,
            PublishApproval.kind == RUN,
            PublishApproval.frame_hash == plan_hash,
            PublishApproval.status.in_(_OPEN),
        )
        .order_by(PublishApproval.id.desc())
        .limit(1)
    )
    return session.scalar(query)


def queue_run(
    session: Session,
    user: audit.Actor,
    plan: policies.RunRequest,
    *,
    plan_hash: str,
    values: int,
    dataset_ids: list[int],
    description: str,
    total: tuple[int, int],
    decision: policies.Decision,
    revision: int | None,
) -> PublishApproval:
    """Store a pending request for a whole run (in the caller's transaction)."""
    row = PublishApproval(
        user_id=user.id,
        kind=RUN,
        frame_hash=plan_hash,
        graph_hash=None,
        mechanism="gaussian",
        epsilon_units=total[0],
        delta_units=total[1],
        dataset_ids=sorted(set(dataset_ids)),
        rule=decision.rule,
        reason=decision.reason,
        policy_revision=revision,
        description=description,
        steps=plan.steps,
        steps_used=0,
        step_epsilon_units=plan.step.epsilon_units,
        step_delta_units=plan.step.delta_units,
        step_values=values,
    )
    session.add(row)
    session.flush()
    return row


def run_step(
    session: Session, user_id: int, cost: Cost, *, approval_id: int, values: int
) -> PublishApproval | None:
    """The run approval ``approval_id`` when this publish is one of its planned steps: the
    user's, steps left, a Gaussian release of exactly the planned epsilon and delta, of at
    most the planned number of ``values``, reading only datasets the plan named. ``None``
    otherwise (the publish is then judged as any other)."""
    row = session.get(PublishApproval, approval_id)
    if (
        row is None
        or row.kind != RUN
        or row.user_id != user_id
        or row.status is not RequestStatus.APPROVED
        or row.steps is None
        or row.steps_used >= row.steps
    ):
        return None
    same = (
        cost.mechanism == "gaussian"
        and cost.asked_epsilon == row.step_epsilon_units
        and cost.asked_delta_units == row.step_delta_units
        and values <= (row.step_values or 0)
        and set(cost.dataset_ids) <= set(row.dataset_ids)
    )
    return row if same else None


def waiting(
    session: Session,
    user: audit.Actor,
    row: PublishApproval,
    *,
    queued: bool,
    action: str,
    decision: policies.Decision,
    in_force: InForce,
    summary: dict[str, Any],
    what: str,
    again: str,
) -> ApprovalRequiredError:
    """The error of a request that waits for an admin (``what``: "this publish"), after
    auditing it (``action``) and committing when it was just ``queued``; otherwise nothing
    is written. ``again`` says what to do once it is approved."""
    if queued:
        audit.record(
            session,
            user,
            action,
            target_type="publish_approval",
            target_id=row.id,
            reason=decision.reason,
            **summary,
        )
        session.commit()
    else:
        session.rollback()
    return ApprovalRequiredError(
        f"{what} waits for an admin's approval (request {row.id}): {decision.reason}; "
        f"{again} [policy {in_force.label}, rule {decision.rule}]",
        rule=decision.rule,
        policy=in_force.name,
        policy_revision=in_force.revision,
        reason=decision.reason,
        approval_id=row.id,
    )


def use(row: PublishApproval, ledger_id: int | None) -> None:
    """Mark an answered request as used by the publish that read it (a run's approval: one
    more of its steps used, and used up by the last)."""
    row.ledger_id = ledger_id
    if row.kind == RUN and ledger_id is not None:
        row.steps_used += 1
        if row.steps is not None and row.steps_used < row.steps:
            return
    row.status = RequestStatus.USED


def list_approvals(
    session: Session, actor: User | None, *, status: str | None = None, limit: int = 100
) -> list[PublishApproval]:
    """Requests, newest first: an admin (or the operator's command line, ``None``) sees
    everyone's, anyone else their own."""
    query = select(PublishApproval).order_by(PublishApproval.id.desc()).limit(limit)
    if actor is not None and actor.role is not Role.ADMIN:
        query = query.where(PublishApproval.user_id == actor.id)
    if status is not None:
        query = query.where(PublishApproval.status == _status(status))
    return list(session.scalars(query))


def _status(status: str) -> RequestStatus:
    try:
        return RequestStatus(status)
    except ValueError:
        names = ", ".join(s.value for s in RequestStatus)
        raise InvalidRequestError(f"unknown status {status!r}; choose one of: {names}") from None


def answer(
    session: Session,
    settings: Settings,
    admin: User | None,
    approval_id: int,
    *,
    approve: bool,
    reason: str,
    operator: str | None = None,
) -> PublishApproval:
    """Approve or deny a pending publish, once, and audit it with what was answered (the
    computation, its noise, the requester's budget, the datasets' caps); commits.

    Args:
        admin: who answers, or ``None`` for the node's operator on the command line.
        operator: who ran the command line, when ``admin`` is None.

    Raises:
        PermissionDeniedError: not an admin.
        NotFoundError: no such request.
        ConflictError: it was already answered.
        InvalidRequestError: no reason (the audit log says who answered, and why).
    """
    if admin is not None and admin.role is not Role.ADMIN:
        raise PermissionDeniedError("only admins may answer publish approvals")
    query = select(PublishApproval).where(PublishApproval.id == approval_id)
    if session.get_bind().dialect.name != "sqlite":
        query = query.with_for_update()
    row = session.scalar(query)
    if row is None:
        raise NotFoundError(f"no publish approval request {approval_id}")
    if row.status is not RequestStatus.PENDING:
        raise ConflictError(
            f"publish approval request {approval_id} was already answered ({row.status.value})"
        )
    if not reason.strip():
        verb = "approved" if approve else "denied"
        raise InvalidRequestError(f"say why the publish is {verb}: a reason is required")
    review = approval_review.reviews(session, settings, admin, [row])[row.id]
    row.status = RequestStatus.APPROVED if approve else RequestStatus.DENIED
    row.decided_at = utcnow()
    row.decided_by_id = admin.id if admin is not None else None
    row.decided_by = decider(admin, operator)
    row.decision_reason = reason.strip()
    audit.record(
        session,
        admin,
        "publish.approved" if approve else "publish.denied",
        target_type="publish_approval",
        target_id=row.id,
        kind=row.kind,
        steps=row.steps,
        user_id=row.user_id,
        epsilon_units=row.epsilon_units,
        delta_units=row.delta_units,
        graph_hash=row.graph_hash,
        datasets=row.dataset_ids,
        reason=row.decision_reason,
        **approval_review.audit_terms(review, row),
        **({"operator": operator} if admin is None else {}),
    )
    session.commit()
    return row


def decider(admin: User | None, operator: str | None) -> str:
    """Who answered a request, as the request records it.

    >>> decider(None, "ops")
    'command line (ops)'
    """
    return admin.email if admin is not None else f"command line ({operator or 'operator'})"

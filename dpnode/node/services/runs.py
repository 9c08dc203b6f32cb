"""Training runs judged as a whole: planned on the node before their first step.

A private training run is ``steps`` Gaussian publishes of one per-step (epsilon, delta),
each small, so a policy judging publishes one at a time never sees the run. Planning
shows it whole: the node costs one step exactly as a publish of it will be charged
(:func:`dpnode.node.services.publish.gaussian_cost`), and the policy judges the run
(:func:`policies.decide_run`): each step against the per-publish caps; the run's total, as
the user's privacy filter counts its steps (rho summed, converted at the allowance's delta),
against the budget, every dataset cap and the approval thresholds. A run that does not fit
is refused before any step; one above a threshold is queued as one request for an admin
(``dpnode.node.services.approvals``, kind ``"run"``). Nothing is charged here: each step is
charged when it is published, every cap and the budget applying again.

Planning the same run again (same steps, per-step amounts, values, datasets and
description) finds the same request: it reports it waiting, the admin's denial (once), or
that it was approved.

A run the policy lets start is recorded (``dpnode.node.db.models.TrainingRun``), approved or
not: its id is the run's identity, which each step's publish names (``run=``), the charge
writes on the step's ledger row, and the ledger groups the steps by
(``dpnode.node.services.ledger``). A publish naming a run that is not the caller's is refused
(``dpnode.node.services.budget.charge``). Planning stays idempotent: a run under an approval
is the one recorded with that approval, whatever was run of it; any other is the newest run
of the same plan not yet started, so that planning twice before the first step (a retry, a
second look) names one run, while planning again after steps were taken starts a new one,
judged whole again.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from dpnode import policies
from dpnode.core.errors import InvalidRequestError, NotFoundError
from dpnode.node.db.base import utcnow
from dpnode.node.db.models import LedgerEntry, PublishApproval, TrainingRun
from dpnode.node.services import approvals, audit, charge_lock, costs
from dpnode.node.services import policy as policy_service
from dpnode.node.services.budget_status import _defaults
from dpnode.node.services.ledger_sums import _load
from dpnode.node.services.publish import gaussian_cost
from dpnode.node.settings import Settings

__all__ = ["MAX_STEPS", "Planned", "RunPlan", "plan"]

#: The most steps one run may plan (each is a publish: far more than any run needs).
MAX_STEPS = 1_000_000


@dataclass(frozen=True)
class RunPlan:
    """A run's public plan: ``steps`` Gaussian publishes at ``(epsilon, delta)`` each, every
    one noising at most ``values`` values and reading only ``dataset_ids``."""

    steps: int
    epsilon: float
    delta: float
    values: int
    dataset_ids: tuple[int, ...] = ()
    description: str = ""

    def key(self) -> str:
        """The hash that identifies this plan (and its approval), a sha256 in hex."""
        canonical = {
            "kind": approvals.RUN,
            "steps": self.steps,
            "epsilon_units": costs.units_down(self.epsilon, costs.EPSILON_UNIT, "epsilon"),
            "delta_units": costs.units_down(self.delta, costs.DELTA_UNIT, "delta"),
            "values": self.values,
            "dataset_ids": sorted(set(self.dataset_ids)),
            "description": self.description,
        }
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Planned:
    """A run the policy lets start. ``run_id`` is the recorded run each step's publish names;
    ``approval_id`` the admin's approval it runs under (``None``: it needed none), of which
    ``steps_used`` steps were taken; ``epsilon`` and ``delta`` its total as the ledger will
    count it; ``remaining_epsilon`` what is left of the budget once every step has run."""

    run_id: int
    steps: int
    steps_used: int
    epsilon: float
    delta: float
    step_epsilon: float
    step_delta: float
    remaining_epsilon: float
    policy: str
    policy_revision: int | None
    approval_id: int | None = None


def _check(run: RunPlan) -> None:
    steps = run.steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise InvalidRequestError(f"steps must be a whole number in [1, {MAX_STEPS}], got {steps}")
    approvals.check_description(run.description, "a run's description")


def plan(
    serial_sessions: sessionmaker[Session],
    settings: Settings,
    user_id: int,
    run: RunPlan,
) -> Planned:
    """Judge ``run`` as a whole under the policy in force, in a serialised transaction.

    Raises:
        InvalidRequestError: a bad plan (steps, epsilon, delta, values).
        BudgetExceededError: the run's total does not fit the user's budget or a dataset's
            cap; nothing is recorded. ``rule`` says which.
        PolicyRefusedError: a step is over a per-publish cap, or an admin denied the run
            (reported once, with the admin's reason).
        ApprovalRequiredError: the run waits for an admin; one pending request is stored.
        AuthenticationError: the account no longer exists or was deactivated.
        NotFoundError: no such dataset.
    """
    _check(run)
    step_cost = gaussian_cost(run.epsilon, run.delta, run.values)
    sampler_epsilon, sampler_delta = costs.sampler_units(step_cost)
    key = run.key()
    # The same steps as the publish transaction (budget.charge): lock, read, decide.
    with serial_sessions() as session:
        locked = charge_lock.lock(session, user_id, run.dataset_ids)
        user, found, in_force, puser = locked.user, locked.found, locked.in_force, locked.puser
        missing = sorted(set(run.dataset_ids) - set(found))
        if missing:
            raise NotFoundError(f"no dataset with id {missing[0]}")
        at = utcnow()
        defaults = _defaults(settings)
        step = policies.PublishRequest(
            at=at,
            datasets={name: ident for ident, name in found.items()},
            epsilon_units=step_cost.asked_epsilon,
            delta_units=step_cost.asked_delta_units,
            rho_units=step_cost.rho_units,
            extra_delta_units=sampler_delta,
            extra_epsilon_units=sampler_epsilon,
        )
        full = policies.RunRequest(run.steps, step)
        waiting = approvals.find_run(session, user.id, key)
        answer = None if waiting is None else approvals.answer_of(waiting)
        approved = waiting if answer is not None and answer.approved else None
        judged = full
        if approved is not None and approved.steps_used:
            # the steps already taken under it are in the ledger: judge the steps left
            judged = policies.RunRequest(max(1, run.steps - approved.steps_used), step)
        ledger = _load(session, in_force.policy, step, puser, locked.total)
        decision = policies.decide_run(
            in_force.policy, puser, judged, ledger.charges, defaults=defaults, approval=answer
        )
        epsilon_units, delta_units = policies.run_total(
            in_force.policy, puser, full, defaults=defaults
        )
        total_units = (epsilon_units or 0, delta_units)
        summary = {
            "policy": in_force.name,
            "policy_revision": in_force.revision,
            "rule": decision.rule,
            "steps": run.steps,
            "step_epsilon_units": step.epsilon_units,
            "step_delta_units": step.delta_units,
            "epsilon_units": total_units[0],
            "delta_units": total_units[1],
            "datasets": sorted(found),
            "description": run.description,
        }
        if decision.outcome is policies.Outcome.NEEDS_APPROVAL:
            queued = waiting is None
            if waiting is None:
                waiting = approvals.queue_run(
                    session,
                    user,
                    full,
                    plan_hash=key,
                    values=run.values,
                    dataset_ids=sorted(found),
                    description=run.description,
                    total=total_units,
                    decision=decision,
                    revision=in_force.revision,
                )
            raise approvals.waiting(
                session,
                user,
                waiting,
                queued=queued,
                action="run.approval_requested",
                decision=decision,
                in_force=in_force,
                summary=summary,
                what="this training run",
                again="nothing was run or charged: plan the same run again once it is approved",
            )
        if not decision.allowed:
            if waiting is not None and answer is not None and not answer.approved:
                approvals.use(waiting, None)  # a denial is answered once; planning again queues
            audit.record(
                session,
                user,
                "run.refused",
                target_type="user",
                target_id=user.id,
                reason=decision.reason,
                **summary,
            )
            session.commit()
            raise policy_service.refusal(decision, in_force)
        remaining = decision.remaining.epsilon_units
        recorded = _recorded(session, user, run, key, approved, in_force.revision, summary)
        planned = Planned(
            run_id=recorded.id,
            approval_id=None if approved is None else approved.id,
            steps=run.steps,
            steps_used=0 if approved is None else approved.steps_used,
            epsilon=float(total_units[0] * costs.EPSILON_UNIT),
            delta=float(total_units[1] * costs.DELTA_UNIT),
            step_epsilon=float(step.epsilon_units * costs.EPSILON_UNIT),
            step_delta=float(step.delta_units * costs.DELTA_UNIT),
            remaining_epsilon=math.inf if remaining < 0 else float(remaining * costs.EPSILON_UNIT),
            policy=in_force.name,
            policy_revision=in_force.revision,
        )
        session.commit()
        return planned


def _recorded(
    session: Session,
    user: audit.Actor,
    run: RunPlan,
    key: str,
    approved: PublishApproval | None,
    revision: int | None,
    summary: Mapping[str, Any],
) -> TrainingRun:
    """The run a plan allowed to start names (see the module): found, or recorded and
    audited (in the caller's transaction)."""
    query = select(TrainingRun).where(TrainingRun.user_id == user.id)
    if approved is not None:
        query = query.where(TrainingRun.approval_id == approved.id)
    else:
        stepped = select(LedgerEntry.id).where(LedgerEntry.run_id == TrainingRun.id).exists()
        query = query.where(
            TrainingRun.plan_hash == key, TrainingRun.approval_id.is_(None), ~stepped
        )
    found = session.scalar(query.order_by(TrainingRun.id.desc()).limit(1))
    if found is not None:
        return found
    row = TrainingRun(
        user_id=user.id,
        plan_hash=key,
        description=run.description,
        steps=run.steps,
        step_epsilon_units=costs.units_down(run.epsilon, costs.EPSILON_UNIT, "epsilon"),
        step_delta_units=costs.units_down(run.delta, costs.DELTA_UNIT, "delta"),
        step_values=run.values,
        dataset_ids=sorted(set(run.dataset_ids)),
        approval_id=None if approved is None else approved.id,
        policy_revision=revision,
    )
    session.add(row)
    session.flush()
    audit.record(
        session,
        user,
        "run.planned",
        target_type="training_run",
        target_id=row.id,
        approval_id=row.approval_id,
        **summary,
    )
    return row

"""Training runs judged as a whole before their first step: one admin approval covers every
planned step (and no more), a denial is reported with its reason, a run that does not fit is
refused with nothing in the ledger, and concurrent steps cannot use more than the plan."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from sqlalchemy import func, select

from dpnode.core.errors import (
    ApprovalRequiredError,
    BudgetExceededError,
    NotFoundError,
    PolicyRefusedError,
)
from dpnode.node.context import NodeContext
from dpnode.node.db.models import LedgerEntry, PublishApproval, RequestStatus, User
from dpnode.node.services import approvals, budget, budget_status, runs
from dpnode.node.services.budget import Cost
from dpnode.node.services.publish import gaussian_cost
from tests.node.test_policy_concurrency import _apply, _dataset

STEP_EPSILON, STEP_DELTA, VALUES = 0.1, 1e-6, 50


def _plan(context: NodeContext, user: User, steps: int, **change: object) -> runs.Planned:
    plan = runs.RunPlan(steps, STEP_EPSILON, STEP_DELTA, VALUES, description="a test run")
    return runs.plan(context.serial_sessions, context.settings, user.id, replace(plan, **change))


def _step(dataset_id: int, run_id: int | None, epsilon: float = STEP_EPSILON) -> Cost:
    """A step's publish as the publish service costs it (the frame stands for its graph)."""
    cost = gaussian_cost(epsilon, STEP_DELTA, VALUES)
    return replace(cost, dataset_ids=[dataset_id], frame_hash="f" * 64, run_id=run_id)


def _charge(context: NodeContext, user: User, cost: Cost) -> LedgerEntry:
    return budget.charge(context.serial_sessions, context.settings, user.id, cost)[0]


def _answer(context: NodeContext, admin: User, approval_id: int, approve: bool, why: str) -> None:
    with context.sessions() as session:
        approvals.answer(session, context.settings, admin, approval_id, approve=approve, reason=why)


def _row(context: NodeContext, approval_id: int) -> PublishApproval:
    with context.sessions() as session:
        row = session.get(PublishApproval, approval_id)
        assert row is not None
        session.expunge(row)
        return row


def _ledger_rows(context: NodeContext) -> int:
    with context.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(LedgerEntry)) or 0)


def test_an_approved_run_lets_its_planned_steps_through_and_no_more(
    context: NodeContext, admin: User, owner: User, scientist: User
) -> None:
    points = _dataset(context, owner, "points")
    # Each step (epsilon 0.1) is above the threshold too: a plain publish of that size waits.
    _apply(context, "[approval]\nepsilon_above = 0.05\n")
    with pytest.raises(ApprovalRequiredError) as waiting:
        _plan(context, scientist, 4, dataset_ids=(points,))
    approval_id = waiting.value.more["approval_id"]
    assert waiting.value.rule == "approval.epsilon_above"
    assert "this run of 4 steps totals" in str(waiting.value)
    assert "nothing was run or charged" in str(waiting.value)
    with pytest.raises(ApprovalRequiredError) as again:  # the same plan: the same request
        _plan(context, scientist, 4, dataset_ids=(points,))
    assert again.value.more["approval_id"] == approval_id
    with context.sessions() as session:
        (pending,) = approvals.list_approvals(session, admin, status="pending")
        assert (pending.id, pending.kind, pending.steps, pending.steps_used) == (
            approval_id,
            "run",
            4,
            0,
        )
        assert pending.description == "a test run" and pending.dataset_ids == [points]
        assert pending.step_epsilon_units == 10**8
    assert _ledger_rows(context) == 0
    _answer(context, admin, approval_id, True, "a reviewed training run")

    planned = _plan(context, scientist, 4, dataset_ids=(points,))
    assert planned.approval_id == approval_id and planned.steps_used == 0
    run_id = planned.run_id
    # The run's total is what the ledger will count for its four steps.
    assert 0.1 < planned.epsilon < 4 * 0.1 * 10
    before = budget_spent(context, scientist)
    for _ in range(4):
        _charge(context, scientist, _step(points, run_id))
    spent = budget_spent(context, scientist) - before
    assert spent == pytest.approx(planned.epsilon, abs=1e-6)
    row = _row(context, approval_id)
    assert (row.status, row.steps_used) == (RequestStatus.USED, 4)
    # A fifth step under the same run is judged alone: it waits, like any plain publish.
    with pytest.raises(ApprovalRequiredError) as fifth:
        _charge(context, scientist, _step(points, run_id))
    assert fifth.value.more["approval_id"] != approval_id
    assert _ledger_rows(context) == 4


def budget_spent(context: NodeContext, user: User) -> float:
    with context.sessions() as session:
        return budget_status.budget_of(session, context.settings, user.id).spent()[0]


def test_a_plain_publish_or_another_amount_does_not_ride_on_an_approved_run(
    context: NodeContext, admin: User, owner: User, scientist: User
) -> None:
    points = _dataset(context, owner, "points")
    other = _dataset(context, owner, "other")
    _apply(context, "[approval]\nepsilon_above = 0.05\n")
    with pytest.raises(ApprovalRequiredError) as waiting:
        _plan(context, scientist, 3, dataset_ids=(points,))
    approval_id = waiting.value.more["approval_id"]
    _answer(context, admin, approval_id, True, "ok")
    planned = _plan(context, scientist, 3, dataset_ids=(points,))
    run_id = planned.run_id
    assert planned.approval_id == approval_id
    refused = [
        _step(points, None),  # no run named
        _step(points, run_id, epsilon=0.2),  # another amount
        replace(_step(points, run_id), dataset_ids=[other]),  # a dataset the plan did not name
        replace(_step(points, run_id), tv_units=_step(points, run_id).tv_units * 2),  # more values
    ]
    for cost in refused:
        with pytest.raises(ApprovalRequiredError):
            _charge(context, scientist, cost)
    assert _row(context, approval_id).steps_used == 0
    # Someone else's run is not theirs to name: refused, nothing charged.
    colleague = _make(context, "ds2@example.org")
    with pytest.raises(NotFoundError, match="not a run you planned"):
        _charge(context, colleague, _step(points, run_id))
    _charge(context, scientist, _step(points, run_id))
    assert _row(context, approval_id).steps_used == 1
    # Planning it again names the same run, the steps taken counted.
    again = _plan(context, scientist, 3, dataset_ids=(points,))
    assert (again.run_id, again.approval_id, again.steps_used) == (run_id, approval_id, 1)


def _make(context: NodeContext, email: str) -> User:
    from tests.conftest import make_user

    return make_user(context, email, "data_scientist")


def test_a_denied_run_is_reported_with_the_reason_then_asked_anew(
    context: NodeContext, admin: User, scientist: User
) -> None:
    _apply(context, "[approval]\nepsilon_above = 0.5\n")
    with pytest.raises(ApprovalRequiredError) as waiting:
        _plan(context, scientist, 40)
    approval_id = waiting.value.more["approval_id"]
    _answer(context, admin, approval_id, False, "train on the mock data first")
    with pytest.raises(PolicyRefusedError) as denied:
        _plan(context, scientist, 40)
    assert type(denied.value) is PolicyRefusedError
    assert denied.value.rule == "approval"
    assert "denied this run of 40 steps: train on the mock data first" in str(denied.value)
    assert _row(context, approval_id).status is RequestStatus.USED
    with pytest.raises(ApprovalRequiredError) as asked_again:
        _plan(context, scientist, 40)
    assert asked_again.value.more["approval_id"] != approval_id
    assert _ledger_rows(context) == 0


def test_a_run_within_the_thresholds_needs_no_approval(
    context: NodeContext, scientist: User
) -> None:
    _apply(context, "[approval]\nepsilon_above = 5.0\n")
    planned = _plan(context, scientist, 10)
    assert planned.approval_id is None and 0 < planned.epsilon < 5.0
    # Recorded all the same: planning again before a step names the same run.
    assert _plan(context, scientist, 10).run_id == planned.run_id
    with context.sessions() as session:
        assert approvals.list_approvals(session, scientist) == []


def test_a_run_that_does_not_fit_is_refused_at_planning_with_nothing_recorded(
    context: NodeContext, owner: User, scientist: User
) -> None:
    points = _dataset(context, owner, "points")
    _apply(context, "[approval]\nepsilon_above = 0.5\n")
    # 200 steps of epsilon 1 cost far more than the default budget of 10: refused outright,
    # not queued for an admin (no approval could make it fit).
    with pytest.raises(BudgetExceededError) as refused:
        _plan(context, scientist, 200, epsilon=1.0, dataset_ids=(points,))
    assert refused.value.rule == "defaults.epsilon"
    assert "this run of 200 steps costs" in str(refused.value)
    assert _ledger_rows(context) == 0
    with context.sessions() as session:
        assert approvals.list_approvals(session, scientist) == []
    # A dataset's cap across all users counts the whole run too.
    _apply(context, "[datasets.points]\nmax_epsilon = 0.2\n")
    with pytest.raises(BudgetExceededError) as capped:
        _plan(context, scientist, 10, dataset_ids=(points,))
    assert capped.value.rule == "datasets.points.max_epsilon"
    # Per-publish caps apply to each step.
    _apply(context, "[publish]\nmax_epsilon = 0.05\n")
    with pytest.raises(PolicyRefusedError) as step_cap:
        _plan(context, scientist, 2)
    assert step_cap.value.rule == "publish.max_epsilon"
    assert "each step of this run asks for epsilon 0.1" in str(step_cap.value)
    with pytest.raises(NotFoundError):
        _plan(context, scientist, 2, epsilon=0.01, dataset_ids=(points + 100,))
    assert _ledger_rows(context) == 0


def test_concurrent_steps_cannot_use_more_than_the_planned_steps(
    context: NodeContext, admin: User, owner: User, scientist: User
) -> None:
    points = _dataset(context, owner, "points")
    _apply(context, "[approval]\nepsilon_above = 0.05\n")
    with pytest.raises(ApprovalRequiredError) as waiting:
        _plan(context, scientist, 5, dataset_ids=(points,))
    approval_id = waiting.value.more["approval_id"]
    _answer(context, admin, approval_id, True, "ok")
    run_id = _plan(context, scientist, 5, dataset_ids=(points,)).run_id

    def attempt(_: int) -> str:
        try:
            _charge(context, scientist, _step(points, run_id))
        except ApprovalRequiredError:
            return "waits"
        return "ran"

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(attempt, range(12)))
    assert sorted(results) == ["ran"] * 5 + ["waits"] * 7
    assert _ledger_rows(context) == 5
    row = _row(context, approval_id)
    assert (row.status, row.steps_used) == (RequestStatus.USED, 5)
    with context.sessions() as session:
        charges = session.scalars(select(LedgerEntry)).all()
        assert {e.id for e in charges} >= {row.ledger_id}

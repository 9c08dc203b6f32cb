"""Deciding a publish, re-deciding it after an admin's answer, judging a training run as a
whole before its first step, and reading a user's budget.

These are the functions the node calls inside its publish transaction. They are pure: the
same policy, user, request and ledger always give the same decision, so a decision can be
replayed from the audit log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from dpnode.policies._budget import Allocation, Limit, Spent, allocation_for
from dpnode.policies._conversion import RhoToEpsilon, filter_epsilon
from dpnode.policies._document import Policy
from dpnode.policies._periods import as_utc, parse_period
from dpnode.policies._records import (
    Allowance,
    Approval,
    Charge,
    Decision,
    Outcome,
    PublishRequest,
    Remaining,
    RunRequest,
    User,
)
from dpnode.policies._rules import RULES, Context

__all__ = [
    "BudgetStatus",
    "LedgerScope",
    "budget_status",
    "decide",
    "decide_approved",
    "decide_cap",
    "decide_run",
    "ledger_scope",
    "run_total",
]


def _context(
    policy: Policy,
    user: User,
    request: PublishRequest,
    ledger: Iterable[Charge],
    defaults: Allowance,
    convert: RhoToEpsilon,
    approval: Approval | None,
    *,
    what: str = "this publish",
    run_steps: int | None = None,
) -> Context:
    cost = request.charge(user.id)
    return Context(
        policy=policy,
        user=user,
        request=request,
        charges=tuple(ledger),
        defaults=defaults,
        convert=convert,
        approval=approval,
        allocation=allocation_for(policy, user, defaults=defaults, at=request.at),
        period=None if policy.renewal is None else policy.renewal.period(),
        cost=Spent(cost.epsilon_units, cost.delta_units, cost.rho_units),
        what=what,
        run_steps=run_steps,
    )


def _objection(ctx: Context, outcome: Outcome, rule: str, reason: str) -> Decision:
    """A refusal (or a wait): nothing granted, the budget as it stands."""
    return Decision(outcome, rule, reason, None, ctx.user_remaining(ctx.user_spent))


def _denial(ctx: Context, approval: Approval) -> Decision:
    """An admin's denial of what ``ctx`` judges, with their reason."""
    why = f": {approval.reason}" if approval.reason else ""
    return _objection(
        ctx, Outcome.REFUSE, "approval", f"an admin ({approval.by}) denied {ctx.what}{why}"
    )


def decide(
    policy: Policy,
    user: User,
    request: PublishRequest,
    ledger: Iterable[Charge],
    *,
    defaults: Allowance,
    rho_to_epsilon: RhoToEpsilon = filter_epsilon,
    approval: Approval | None = None,
) -> Decision:
    """Whether ``user`` may run ``request`` now, under ``policy``, given the ledger.

    Args:
        policy: the policy in force.
        user: who publishes, with their budget grants.
        request: what is asked; ``request.at`` is the decision time.
        ledger: the charges already recorded. It must include at least every charge of this
            user in the current period and in the rate-limit window, and every charge on each
            dataset the request reads that has a cap (all users); more is harmless.
        defaults: the node's default budget (``default_epsilon_budget``,
            ``default_delta_budget``) for roles and users the policy does not set.
        rho_to_epsilon: converts a zCDP total to epsilon (see :mod:`dpnode.policies._conversion`).
        approval: an admin's approval, when this publish waited for one; prefer
            :func:`decide_approved`, which also refuses a denied request.

    Returns:
        The first objection of the rules in order (per-publish caps, rate limit, the user's
        budget, dataset caps, approval), or ``allow`` with the ledger row to write.
    """
    ctx = _context(policy, user, request, ledger, defaults, rho_to_epsilon, approval)
    for _family, check in RULES:
        for verdict in check(ctx):
            return _objection(ctx, verdict.outcome, verdict.rule, verdict.reason)
    granted = request.charge(user.id)
    label = f"policy {policy.name!r}" if policy.name else "the policy"
    return Decision(
        Outcome.ALLOW,
        "allow",
        f"within every rule of {label}",
        granted,
        ctx.user_remaining(ctx.user_spent + ctx.cost),
    )


def decide_approved(
    policy: Policy,
    user: User,
    request: PublishRequest,
    ledger: Iterable[Charge],
    approval: Approval,
    *,
    defaults: Allowance,
    rho_to_epsilon: RhoToEpsilon = filter_epsilon,
) -> Decision:
    """Re-decide a publish that waited, once an admin has answered.

    A denial refuses it (rule ``"approval"``, with the admin's reason). An approval lifts only
    the approval threshold: the request is decided again against the ledger as it stands at
    ``request.at`` (the execution time), so every cap and budget still applies.
    """
    if not approval.approved:
        return _denial(
            _context(policy, user, request, ledger, defaults, rho_to_epsilon, None), approval
        )
    return decide(
        policy,
        user,
        request,
        ledger,
        defaults=defaults,
        rho_to_epsilon=rho_to_epsilon,
        approval=approval,
    )


def decide_cap(
    policy: Policy,
    user: User,
    request: PublishRequest,
    ledger: Iterable[Charge],
    *,
    defaults: Allowance,
    rho_to_epsilon: RhoToEpsilon = filter_epsilon,
    what: str = "this synthetic mock",
) -> Decision:
    """Whether a release paid from the caps of the datasets it reads, not from ``user``'s
    budget (a data owner's synthetic mock), may be charged now.

    Only the caps decide: every dataset ``request`` reads must have one (a dataset without
    a cap has nothing to pay from), and the release must fit each (the ``datasets`` rule).
    The user's own budget, the per-publish caps, the rate limit and the approval thresholds
    govern what users spend of their budgets, so they do not apply. ``remaining`` is the
    user's budget, unchanged.

    >>> from datetime import UTC, datetime
    >>> from dpnode.policies._document import Policy
    >>> at = datetime(2026, 1, 1, tzinfo=UTC)
    >>> owner = User(1, "o@x", "data_owner")
    >>> ask = PublishRequest(at, datasets={"d": 7}, epsilon_units=10**9)
    >>> decide_cap(Policy.from_dict({}), owner, ask, [], defaults=Allowance(0, 0)).rule
    'datasets.d'
    >>> capped = Policy.from_dict({"datasets": {"d": {"max_epsilon": 2.0}}})
    >>> decide_cap(capped, owner, ask, [], defaults=Allowance(0, 0)).outcome.value
    'allow'
    """
    ctx = _context(policy, user, request, ledger, defaults, rho_to_epsilon, None, what=what)
    for name in sorted(request.datasets):
        cap = policy.datasets.get(name)
        if cap is None or (cap.max_epsilon is None and cap.max_delta is None):
            label = f"policy {policy.name!r}" if policy.name else "the policy in force"
            return _objection(
                ctx,
                Outcome.REFUSE,
                f"datasets.{name}",
                f"{what} is paid from dataset {name!r}'s cap, and {label} sets none: an admin "
                f"sets one in the policy's datasets table ([datasets.{name}] max_epsilon = ..., "
                "max_delta = ...); nothing was charged",
            )
    for family, check in RULES:
        if family == "datasets":
            for verdict in check(ctx):
                return _objection(ctx, verdict.outcome, verdict.rule, verdict.reason)
    granted = request.charge(user.id)
    return Decision(
        Outcome.ALLOW,
        "allow",
        f"within the caps of {', '.join(repr(n) for n in sorted(request.datasets))}",
        granted,
        ctx.user_remaining(ctx.user_spent),
    )


def run_total(
    policy: Policy,
    user: User,
    run: RunRequest,
    *,
    defaults: Allowance,
    rho_to_epsilon: RhoToEpsilon = filter_epsilon,
) -> tuple[int | None, int]:
    """The run's (epsilon, delta) units as the user's privacy filter counts its ``steps``
    charges alone: their rho summed and converted at the allowance's delta share, plus the
    samplers' epsilon; their samplers' deltas plus that share. Epsilon ``None`` where the
    allowance has no delta to convert rho at.

    >>> from datetime import UTC, datetime
    >>> from dpnode.policies._document import default_policy
    >>> step = PublishRequest(datetime(2026, 1, 1, tzinfo=UTC), rho_units=10**7)
    >>> one, two = (
    ...     run_total(default_policy(), User(1, "a@x", "data_scientist"), RunRequest(n, step),
    ...               defaults=Allowance(10**10, 10**12))
    ...     for n in (1, 2)
    ... )
    >>> one[0] < two[0] < 2 * one[0], one[1] == two[1]  # zCDP totals compose sublinearly
    (True, True)
    """
    allocation = allocation_for(policy, user, defaults=defaults, at=run.step.at)
    limit = Limit.for_policy(policy, None, allocation.delta_units)
    one = run.step.charge(user.id)
    n = run.steps
    spent = Spent(one.epsilon_units * n, one.delta_units * n, one.rho_units * n)
    return limit.epsilon_used(spent, rho_to_epsilon), spent.delta_units + (
        limit.conversion_delta_units if spent.rho_units else 0
    )


def decide_run(
    policy: Policy,
    user: User,
    run: RunRequest,
    ledger: Iterable[Charge],
    *,
    defaults: Allowance,
    rho_to_epsilon: RhoToEpsilon = filter_epsilon,
    approval: Approval | None = None,
) -> Decision:
    """Whether ``user`` may start the training run ``run``, judged as a whole.

    Each step must pass the per-publish caps; the run's total (:func:`run_total`: every step
    charged on top of the ledger) must fit the user's budget and every dataset cap; and it
    waits for an admin when its total, or one step on its own, is above an approval
    threshold. The rate limit is not checked here: a plan is not a publish, and each step
    is rate-limited as it runs (as every cap and the budget are, step by step).

    Args:
        approval: the admin's answer to this exact plan, if it waited. A denial refuses it
            (rule ``"approval"``, with the admin's reason); an approval lifts the thresholds
            only.

    Returns:
        The first objection, or ``allow`` with ``granted`` ``None`` (a plan writes no ledger
        row) and ``remaining`` the budget once every step has run.
    """
    n = run.steps
    whole = f"this run of {n} step{'s' if n != 1 else ''}"
    epsilon, delta = run_total(policy, user, run, defaults=defaults, rho_to_epsilon=rho_to_epsilon)
    total = run.total(0 if epsilon is None else epsilon, delta)
    ctx = _context(
        policy, user, total, ledger, defaults, rho_to_epsilon, None, what=whole, run_steps=n
    )
    step = _context(
        policy, user, run.step, ctx.charges, defaults, rho_to_epsilon, None,
        what="each step of this run",
    )  # fmt: skip
    if approval is not None and not approval.approved:
        return _denial(ctx, approval)
    for family, check in RULES:
        if family == "rate_limit":
            continue
        judged = [step] if family == "publish" else [ctx]
        if family == "approval":
            judged = [] if approval is not None else [ctx, step]
        for one in judged:
            for verdict in check(one):
                return _objection(ctx, verdict.outcome, verdict.rule, verdict.reason)
    label = f"policy {policy.name!r}" if policy.name else "the policy"
    return Decision(
        Outcome.ALLOW,
        "allow",
        f"{whole} is within every rule of {label}",
        None,
        ctx.user_remaining(ctx.user_spent + ctx.cost),
    )


@dataclass(frozen=True)
class BudgetStatus:
    """A user's budget as a policy sees it at one instant (for ``client.budget()``)."""

    allocation: Allocation
    spent: Spent
    remaining: Remaining
    period_start: datetime | None


def budget_status(
    policy: Policy,
    user: User,
    ledger: Iterable[Charge],
    *,
    at: datetime,
    defaults: Allowance,
    rho_to_epsilon: RhoToEpsilon = filter_epsilon,
) -> BudgetStatus:
    """The user's allocation, what they spent in the current period and what remains."""
    ctx = _context(policy, user, PublishRequest(as_utc(at)), ledger, defaults, rho_to_epsilon, None)
    start = None if ctx.period is None else ctx.period.window(ctx.request.at)[0]
    spent = ctx.user_spent
    return BudgetStatus(ctx.allocation, spent, ctx.user_remaining(spent), start)


@dataclass(frozen=True)
class LedgerScope:
    """Which ledger rows :func:`decide` needs; ``None`` means "since the beginning".

    Attributes:
        user_id: load this user's rows with ``at >= user_since``.
        user_since: the start of the current period or of the rate-limit window, the earlier.
        datasets: for each capped dataset id the request reads, load every user's rows that
            list it with ``at >= since``.
    """

    user_id: int
    user_since: datetime | None
    datasets: Mapping[int, datetime | None]


def ledger_scope(policy: Policy, user: User, request: PublishRequest) -> LedgerScope:
    """The smallest set of ledger rows that decides ``request`` as the whole ledger would.

    Passing these rows (or any superset) to :func:`decide` gives the same decision; the node
    can use it to keep the query in its publish transaction short.
    """
    since: datetime | None = None
    if policy.renewal is not None:
        since = policy.renewal.period().window(request.at)[0]
        if policy.rate_limit is not None:
            since = min(since, request.at - parse_period(policy.rate_limit.window))
    datasets: dict[int, datetime | None] = {}
    for name, dataset_id in request.datasets.items():
        cap = policy.datasets.get(name)
        if cap is not None and (cap.max_epsilon is not None or cap.max_delta is not None):
            start = None if cap.renewal is None else cap.renewal.period().window(request.at)[0]
            datasets[dataset_id] = start
    return LedgerScope(user.id, since, datasets)

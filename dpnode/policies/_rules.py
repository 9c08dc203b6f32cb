"""The rules a publish must pass, as a registry evaluated in order.

Each rule reads a :class:`Context` (the policy, the user, the request and the relevant ledger)
and returns a :class:`Verdict` when it objects, ``None`` otherwise; the first objection decides.
Refusing rules come before the approval rule, so a publish that could never run is refused at
once instead of being queued for an admin, and an approved publish still passes every cap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dpnode.policies._budget import Allocation, Limit, Spent
from dpnode.policies._caps import cap_limit, cap_spent
from dpnode.policies._conversion import RhoToEpsilon
from dpnode.policies._document import Policy
from dpnode.policies._periods import Period, parse_period
from dpnode.policies._records import (
    Allowance,
    Approval,
    Charge,
    Outcome,
    PublishRequest,
    Remaining,
    User,
)
from dpnode.policies._units import (
    DELTA_UNIT,
    delta_units,
    epsilon_units,
    format_delta,
    format_epsilon,
)

__all__ = ["RULES", "Context", "Verdict", "rule"]


@dataclass(frozen=True)
class Verdict:
    """An objection: what to do, the rule's dotted name and the reason."""

    outcome: Outcome
    rule: str
    reason: str


@dataclass(frozen=True)
class Context:
    """Everything a rule may read; built once per decision by :func:`policies.decide`."""

    policy: Policy
    user: User
    request: PublishRequest
    charges: tuple[Charge, ...]
    defaults: Allowance
    convert: RhoToEpsilon
    approval: Approval | None
    allocation: Allocation
    period: Period | None
    cost: Spent
    #: How the messages name what is judged ("this publish", "this run of 40 steps", ...).
    what: str = "this publish"
    #: The number of steps, when what is judged is a training run as a whole.
    run_steps: int | None = None

    @property
    def user_limit(self) -> Limit:
        """The user's allocation as a limit."""
        a = self.allocation
        return Limit.for_policy(self.policy, a.epsilon_units, a.delta_units)

    def in_window(self, period: Period | None, charge: Charge) -> bool:
        """Whether ``charge`` counts in the request's window of ``period`` (always, if none)."""
        return period is None or period.counts_at(self.request.at, charge.at)

    @property
    def user_spent(self) -> Spent:
        """The user's charges in the current period."""
        mine = (c for c in self.charges if c.user_id == self.user.id)
        return Spent.of(c for c in mine if self.in_window(self.period, c))

    def user_remaining(self, spent: Spent) -> Remaining:
        """The user's remaining budget after ``spent``."""
        epsilon, delta = self.user_limit.remaining(spent, self.convert)
        renews = None if self.period is None else self.period.window(self.request.at)[1]
        return Remaining(epsilon, delta, renews)


Rule = Callable[[Context], Iterator[Verdict]]
#: The rules, in the order they are checked.
RULES: list[tuple[str, Rule]] = []


def rule(family: str) -> Callable[[Rule], Rule]:
    """Register a rule (a generator of objections) under a family name."""

    def register(fn: Rule) -> Rule:
        RULES.append((family, fn))
        return fn

    return register


def describe_cost(cost: Spent) -> str:
    """``"epsilon 0.5"``, ``"rho 0.01 (zCDP)"``, with any directly charged delta."""
    parts = []
    if cost.rho_units:
        parts.append(f"rho {format_epsilon(cost.rho_units)} (zCDP)")
    if cost.epsilon_units or not cost.rho_units:
        parts.append(f"epsilon {format_epsilon(cost.epsilon_units)}")
    if cost.delta_units:
        vacuous = cost.delta_units * DELTA_UNIT >= 1
        parts.append(
            f"delta {format_delta(cost.delta_units)}"
            + (" (a delta of 1 or more promises nothing)" if vacuous else "")
        )
    return ", ".join(parts)


@rule("publish")
def _publish_caps(ctx: Context) -> Iterator[Verdict]:
    caps, req = ctx.policy.publish, ctx.request
    if caps.max_epsilon is not None and req.epsilon_units > epsilon_units(caps.max_epsilon):
        yield Verdict(
            Outcome.REFUSE,
            "publish.max_epsilon",
            f"{ctx.what} asks for epsilon {format_epsilon(req.epsilon_units)}; the policy "
            f"allows at most {format_epsilon(epsilon_units(caps.max_epsilon))} per publish",
        )
    if caps.max_delta is not None and req.delta_units > delta_units(caps.max_delta):
        yield Verdict(
            Outcome.REFUSE,
            "publish.max_delta",
            f"{ctx.what} asks for delta {format_delta(req.delta_units)}; the policy "
            f"allows at most {format_delta(delta_units(caps.max_delta))} per publish",
        )


@rule("rate_limit")
def _rate_limit(ctx: Context) -> Iterator[Verdict]:
    limit = ctx.policy.rate_limit
    if limit is None:
        return
    window = parse_period(limit.window)
    # Every charge later than at - window counts, even one dated after the request: then no
    # window of this length can ever hold more than max_publishes, whatever the arrival order.
    since = ctx.request.at - window
    recent = sorted(c.at for c in ctx.charges if c.user_id == ctx.user.id and c.at > since)
    if len(recent) < limit.max_publishes:
        return
    if limit.max_publishes == 0:
        when = "publishing is disabled"
    else:
        free = recent[len(recent) - limit.max_publishes] + window
        when = f"the next one is possible at {free.isoformat().replace('+00:00', 'Z')}"
    yield Verdict(
        Outcome.REFUSE,
        "rate_limit.max_publishes",
        f"rate limit: at most {limit.max_publishes} publishes per {limit.window}; you have made "
        f"{len(recent)} in the last {limit.window}; {when}",
    )


def _granted(amount: str) -> str:
    return f" (of which {amount} granted on request)"


def _sampler_note(ctx: Context) -> str:
    """Why a release's delta is what it is, when the noise samplers' deviation is in it."""
    extra = ctx.request.extra_delta_units
    if not extra:
        return ""
    return (
        f"; of its delta, {format_delta(extra)} is what the noise samplers' finite precision "
        "costs at this release's own epsilon (or rho), which grows steeply with it: several "
        "releases at a smaller epsilon (or rho) each cost far less"
    )


@rule("budget")
def _user_budget(ctx: Context) -> Iterator[Verdict]:
    limit, after, a = ctx.user_limit, ctx.user_spent + ctx.cost, ctx.allocation
    renewal = ctx.policy.renewal
    scope = "in total" if renewal is None else f"per {renewal.every}"
    granted_eps = sum(g.epsilon_units for g in a.grants)
    granted_delta = sum(g.delta_units for g in a.grants)
    left = ctx.user_remaining(ctx.user_spent).describe()
    if limit.epsilon_used(after, ctx.convert) is None:
        yield Verdict(
            Outcome.REFUSE,
            a.delta_rule,
            f"{ctx.what} costs {describe_cost(ctx.cost)}, which needs a delta budget to "
            f"convert to epsilon, and your delta budget is {format_delta(a.delta_units)}",
        )
    if not limit.epsilon_fits(after, ctx.convert):
        yield Verdict(
            Outcome.REFUSE,
            a.epsilon_rule,
            f"{ctx.what} costs {describe_cost(ctx.cost)} and does not fit your epsilon budget "
            f"of {format_epsilon(a.epsilon_units)} {scope}"
            f"{_granted(format_epsilon(granted_eps)) if granted_eps else ''}; {left}",
        )
    if not limit.delta_fits(after):
        yield Verdict(
            Outcome.REFUSE,
            a.delta_rule,
            f"{ctx.what} costs {describe_cost(ctx.cost)} and does not fit your delta budget "
            f"of {format_delta(a.delta_units)} {scope}"
            f"{_granted(format_delta(granted_delta)) if granted_delta else ''}; {left}"
            f"{_sampler_note(ctx)}",
        )


@rule("datasets")
def _dataset_caps(ctx: Context) -> Iterator[Verdict]:
    for name, dataset_id in sorted(ctx.request.datasets.items()):
        cap = ctx.policy.datasets.get(name)
        if cap is None:
            continue
        limit, default_delta = cap_limit(ctx.policy, cap, ctx.defaults)
        epsilon, delta = limit.epsilon_units, limit.delta_units
        implicit = " (the node's default delta)" if default_delta else ""
        every = "" if cap.renewal is None else f" per {cap.renewal.every}"
        spent = cap_spent(cap, dataset_id, ctx.charges, ctx.request.at)
        after = spent + ctx.cost
        left_eps, left_delta = limit.remaining(spent, ctx.convert)
        scope = f"across all users{every}"
        if limit.epsilon_used(after, ctx.convert) is None:
            yield Verdict(
                Outcome.REFUSE,
                f"datasets.{name}.max_delta",
                f"dataset {name!r} is capped at delta 0, so it admits no zCDP (Gaussian) release",
            )
        if not limit.epsilon_fits(after, ctx.convert):
            yield Verdict(
                Outcome.REFUSE,
                f"datasets.{name}.max_epsilon",
                f"dataset {name!r} is capped at epsilon {format_epsilon(epsilon or 0)} {scope}; "
                f"{format_epsilon(left_eps)} is left and {ctx.what} costs "
                f"{describe_cost(ctx.cost)}",
            )
        if not limit.delta_fits(after):
            yield Verdict(
                Outcome.REFUSE,
                f"datasets.{name}.max_delta",
                f"dataset {name!r} is capped at delta {format_delta(delta or 0)}{implicit} "
                f"{scope}; {format_delta(left_delta)} is left and {ctx.what} costs "
                f"{describe_cost(ctx.cost)}{_sampler_note(ctx)}",
            )


def _gated(ctx: Context) -> str:
    return "publishes" if ctx.run_steps is None else "training runs (in total)"


def _asks(ctx: Context) -> str:
    """Who asks for how much: a publish, or a run's total as the privacy filter counts it."""
    if ctx.run_steps is not None:
        return f"{ctx.what} totals"
    return "this one asks for" if ctx.what == "this publish" else f"{ctx.what} asks for"


@rule("approval")
def _approval(ctx: Context) -> Iterator[Verdict]:
    if ctx.approval is not None and ctx.approval.covers(ctx.request):
        return
    gate, req = ctx.policy.approval, ctx.request
    if gate.epsilon_above is not None:
        above = epsilon_units(gate.epsilon_above)
        if req.epsilon_units > above:
            yield Verdict(
                Outcome.NEEDS_APPROVAL,
                "approval.epsilon_above",
                f"{_gated(ctx)} above epsilon {format_epsilon(above)} wait for an admin's "
                f"approval; {_asks(ctx)} {format_epsilon(req.epsilon_units)}",
            )
    if gate.delta_above is not None:
        above = delta_units(gate.delta_above)
        if req.delta_units > above:
            yield Verdict(
                Outcome.NEEDS_APPROVAL,
                "approval.delta_above",
                f"{_gated(ctx)} above delta {format_delta(above)} wait for an admin's "
                f"approval; {_asks(ctx)} {format_delta(req.delta_units)}",
            )

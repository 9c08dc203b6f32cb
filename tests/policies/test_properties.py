"""Invariants of evaluation, by hypothesis: random policies, users, datasets, amounts and times.

The simulation plays a node: it decides each request, records the allowed ones in the ledger,
and answers approval-gated ones at random. The checks then read the final ledger with their own
arithmetic, independent of the rule code: no window of any budget or cap is ever exceeded, no
rate window holds too many publishes, no gated publish ran without approval, and every refusal
names a rule that the oracle agrees was violated.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.policies import (
    Approval,
    Charge,
    Decision,
    Grant,
    LedgerScope,
    Outcome,
    Policy,
    PublishRequest,
    User,
    budget_status,
    decide,
    decide_approved,
    filter_epsilon,
    ledger_scope,
    parse_period,
)
from tests.policies.conftest import DEFAULTS, T0

USERS = [
    User(1, "ann@example.org", "data_scientist"),
    User(2, "ben@example.org", "data_scientist"),
    User(3, "cat@example.org", "data_owner"),
]
DATASETS = {"a": 1, "b": 2, "c": 3}
E9, D18 = 10**9, 10**18
EPS = [0.05, 0.1, 0.25, 0.4, 0.5, 0.75, 1.0, 1.5]


def _units(value: float, scale: int) -> int:
    return math.floor(Fraction(Decimal(repr(value))) * scale)


renewals = st.fixed_dictionaries(
    {
        "every": st.sampled_from(["1h", "6h", "1d", "10d"]),
        "anchor": st.integers(-(10**6), 10**6).map(lambda s: T0 + timedelta(seconds=s)),
    }
)
policy_dicts = st.fixed_dictionaries(
    {
        "roles": st.fixed_dictionaries(
            {
                "data_scientist": st.fixed_dictionaries(
                    {"epsilon": st.sampled_from([0.5, 1.0, 2.0, 3.0])},
                    optional={"delta": st.sampled_from([0.0, 1e-7, 1e-6])},
                )
            },
            optional={"data_owner": st.fixed_dictionaries({"epsilon": st.sampled_from([0, 1.0])})},
        ),
    },
    optional={
        "renewal": renewals,
        "users": st.just({"ben@example.org": {"epsilon": 4.0}}),
        "publish": st.fixed_dictionaries({"max_epsilon": st.sampled_from([0.5, 1.0])}),
        "approval": st.fixed_dictionaries({"epsilon_above": st.sampled_from([0.25, 0.5])}),
        "rate_limit": st.fixed_dictionaries(
            {"max_publishes": st.integers(0, 4), "window": st.sampled_from(["1h", "6h"])}
        ),
        "datasets": st.fixed_dictionaries(
            {"a": st.fixed_dictionaries({"max_epsilon": st.sampled_from([0.5, 1.0, 2.0, 4.0])})},
            optional={
                "b": st.fixed_dictionaries(
                    {"max_epsilon": st.sampled_from([0.5, 1.0, 3.0]), "renewal": renewals}
                )
            },
        ),
    },
)


@dataclass(frozen=True)
class Step:
    user: int
    datasets: tuple[str, ...]
    epsilon: float
    gaussian: bool
    seconds: int
    answer: bool | None
    extra_delta: int = 0


steps = st.builds(
    Step,
    user=st.integers(0, 2),
    datasets=st.sets(st.sampled_from(sorted(DATASETS)), min_size=1).map(lambda s: tuple(sorted(s))),
    epsilon=st.sampled_from(EPS),
    gaussian=st.booleans(),
    seconds=st.integers(0, 30 * 86400),
    answer=st.sampled_from([None, True, False]),
    extra_delta=st.sampled_from([0, 0, 10**7, 10**8]),  # e.g. a sampler's deviation
)


def in_scope(scope: LedgerScope, charge: Charge) -> bool:
    """What a node's query for ``scope`` would return."""
    since = scope.user_since
    if charge.user_id == scope.user_id and (since is None or charge.at >= since):
        return True
    for dataset_id, since in scope.datasets.items():
        if dataset_id in charge.dataset_ids and (since is None or charge.at >= since):
            return True
    return False


def request_of(step: Step) -> PublishRequest:
    eps = _units(step.epsilon, E9)
    names = {name: DATASETS[name] for name in step.datasets}
    when = T0 + timedelta(seconds=step.seconds)
    if step.gaussian:  # a Gaussian asked for (epsilon, 1e-7), charged as a small rho
        rho = eps * eps // (50 * E9)
        return PublishRequest(when, names, eps, 10**11, rho, step.extra_delta)
    return PublishRequest(when, names, eps, extra_delta_units=step.extra_delta)


def fits(limit_eps: int | None, limit_delta: int | None, share: Fraction, spent: Charge) -> bool:
    """The oracle: pure epsilon + converted rho, and direct delta, within a limit."""
    if limit_eps is not None and limit_delta is None:
        limit_delta = DEFAULTS.delta_units
    delta_z = 0 if limit_delta is None else math.floor(limit_delta * share)
    if limit_delta is not None and spent.delta_units > limit_delta - delta_z:
        return False
    if limit_eps is None:
        return True
    converted = 0
    if spent.rho_units:
        if delta_z == 0:
            return False
        rho = float(Fraction(spent.rho_units, E9))
        converted = math.ceil(Fraction(filter_epsilon(rho, float(Fraction(delta_z, D18)))) * E9)
    return spent.epsilon_units + converted <= limit_eps


def total(charges: Iterable[Charge]) -> Charge:
    items = list(charges)
    return Charge(
        T0,
        0,
        (),
        sum(c.epsilon_units for c in items),
        sum(c.delta_units for c in items),
        sum(c.rho_units for c in items),
    )


def windows(
    charges: list[Charge], renewal: dict[str, Any] | None, at: datetime | None = None
) -> Iterable[list[Charge]]:
    """Charges grouped by renewal window (one group without renewal); if ``at`` is given, what
    counts at ``at``: its window's and any later (dated ahead: spent already)."""
    if renewal is None:
        yield charges
        return
    length = parse_period(renewal["every"])
    anchor: datetime = renewal["anchor"]
    groups: dict[int, list[Charge]] = defaultdict(list)
    for c in charges:
        groups[(c.at - anchor) // length].append(c)
    if at is None:
        yield from groups.values()
    else:
        now = (at - anchor) // length
        yield [c for k, group in groups.items() if k >= now for c in group]


def user_limits(data: dict[str, Any], user: User) -> tuple[int, int]:
    role = data["roles"].get(user.role, {})
    override = data.get("users", {}).get(user.email, {})
    eps = override.get("epsilon", role.get("epsilon", 10.0))
    delta = override.get("delta", role.get("delta", 1e-6))
    return _units(eps, E9), _units(delta, D18)


def violated(
    data: dict[str, Any],
    policy: Policy,
    rule: str,
    user: User,
    req: PublishRequest,
    ledger: list[Charge],
) -> bool:
    """Whether the oracle agrees that ``rule`` objects to ``req``."""
    share = Fraction(Decimal(repr(policy.zcdp_delta_share)))
    cost = req.charge(user.id)
    if rule == "publish.max_epsilon":
        return req.epsilon_units > _units(data["publish"]["max_epsilon"], E9)
    if rule == "rate_limit.max_publishes":
        limit = data["rate_limit"]
        since = req.at - parse_period(limit["window"])
        recent = [c for c in ledger if c.user_id == user.id and c.at > since]
        return len(recent) >= int(limit["max_publishes"])
    if rule.startswith(("roles.", "users.", "defaults.")):
        mine = [c for c in ledger if c.user_id == user.id]
        (window,) = windows(mine, data.get("renewal"), req.at)
        return not fits(*user_limits(data, user), share, total([*window, cost]))
    if rule.startswith("datasets."):
        name = rule.split(".")[1]
        cap = data["datasets"][name]
        touching = [c for c in ledger if DATASETS[name] in c.dataset_ids]
        (window,) = windows(touching, cap.get("renewal"), req.at)
        return not fits(_units(cap["max_epsilon"], E9), None, share, total([*window, cost]))
    if rule == "approval.epsilon_above":
        return req.epsilon_units > _units(data["approval"]["epsilon_above"], E9)
    raise AssertionError(f"unexpected rule {rule}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_dicts, st.lists(steps, max_size=40))
def test_no_sequence_of_requests_exceeds_any_cap(data: dict[str, Any], plan: list[Step]) -> None:
    policy = Policy.from_dict(data)
    ledger: list[Charge] = []
    ran: list[tuple[PublishRequest, bool]] = []  # (request, approved) of every executed publish
    for step in plan:
        user, req = USERS[step.user], request_of(step)
        d = decide(policy, user, req, ledger, defaults=DEFAULTS)
        assert d == decide(policy, user, req, ledger, defaults=DEFAULTS)  # pure
        scoped = [c for c in ledger if in_scope(ledger_scope(policy, user, req), c)]
        assert d == decide(policy, user, req, scoped, defaults=DEFAULTS)
        approved = False
        if d.outcome is Outcome.NEEDS_APPROVAL:
            assert violated(data, policy, d.rule, user, req, ledger)
            if step.answer is None:
                continue  # still queued: never runs
            answer = Approval(step.answer, "root@example.org", req.at)
            d = decide_approved(policy, user, req, ledger, answer, defaults=DEFAULTS)
            assert d.outcome is not Outcome.NEEDS_APPROVAL
            if not step.answer:
                assert (d.outcome, d.rule) == (Outcome.REFUSE, "approval")
            approved = step.answer
        if d.outcome is Outcome.REFUSE:
            assert d.granted is None
            if d.rule != "approval":
                assert violated(data, policy, d.rule, user, req, ledger), d
            continue
        assert d.granted == req.charge(user.id)  # all or nothing, never degraded
        ledger.append(d.granted)
        ran.append((req, approved))
    check_ledger(data, policy, ledger, ran)


def check_ledger(
    data: dict[str, Any],
    policy: Policy,
    ledger: list[Charge],
    ran: list[tuple[PublishRequest, bool]],
) -> None:
    share = Fraction(Decimal(repr(policy.zcdp_delta_share)))
    for req, approved in ran:
        if "publish" in data:
            assert req.epsilon_units <= _units(data["publish"]["max_epsilon"], E9)
        if "approval" in data and req.epsilon_units > _units(data["approval"]["epsilon_above"], E9):
            assert approved
    for user in USERS:
        mine = [c for c in ledger if c.user_id == user.id]
        for window in windows(mine, data.get("renewal")):
            assert fits(*user_limits(data, user), share, total(window))
        if "rate_limit" in data:
            length = parse_period(data["rate_limit"]["window"])
            times = sorted(c.at for c in mine)
            for t in times:  # the busiest window starts at some publish
                assert (
                    sum(t <= u < t + length for u in times) <= data["rate_limit"]["max_publishes"]
                )
    for name, cap in data.get("datasets", {}).items():
        touching = [c for c in ledger if DATASETS[name] in c.dataset_ids]
        for window in windows(touching, cap.get("renewal")):
            assert fits(_units(cap["max_epsilon"], E9), None, share, total(window))


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(1, 10**7),
    anchor=st.integers(-(10**8), 10**8),
    allocation=st.integers(1, 10**11),
    parts=st.lists(st.integers(1, 10**6), min_size=1, max_size=6),
    periods_later=st.integers(0, 5),
    with_grant=st.booleans(),
)
def test_renewal_gives_back_exactly_the_allocation_at_the_boundary(
    length: int,
    anchor: int,
    allocation: int,
    parts: list[int],
    periods_later: int,
    with_grant: bool,
) -> None:
    every = f"{length}s"
    start = T0 + timedelta(seconds=anchor)
    policy = Policy.from_dict(
        {
            "renewal": {"every": every, "anchor": start},
            "roles": {"data_scientist": {"epsilon": float(Fraction(allocation, E9))}},
        }
    )
    user = USERS[0]
    base = _units(float(Fraction(allocation, E9)), E9)
    if with_grant:
        user = User(user.id, user.email, user.role, (Grant(start, 7),))
        base += 7
    # Spend everything, in pieces, inside one period (the k-th after the anchor).
    k = periods_later
    period_start = start + k * timedelta(seconds=length)
    boundary = period_start + timedelta(seconds=length)
    weights = sum(parts)
    amounts = [base * p // weights for p in parts]
    amounts[-1] += base - sum(amounts)
    ledger: list[Charge] = []
    for i, amount in enumerate(amounts):
        when = period_start + timedelta(seconds=length) * i / len(amounts)
        req = PublishRequest(when, {"a": 1}, amount)
        d = decide(policy, user, req, ledger, defaults=DEFAULTS)
        assert d.allowed, d
        assert d.granted is not None
        ledger.append(d.granted)
    assert d.remaining.epsilon_units == 0 and d.remaining.renews_at == boundary
    just_before = boundary - timedelta(microseconds=1)
    one = PublishRequest(just_before, {"a": 1}, 1)
    refused = decide(policy, user, one, ledger, defaults=DEFAULTS)
    assert refused.outcome is Outcome.REFUSE and refused.remaining.epsilon_units == 0
    status = budget_status(policy, user, ledger, at=boundary, defaults=DEFAULTS)
    assert status.remaining.epsilon_units == base  # exactly the allocation, no more
    assert status.period_start == boundary
    everything = PublishRequest(boundary, {"a": 1}, base)
    assert decide(policy, user, everything, ledger, defaults=DEFAULTS).allowed
    more = PublishRequest(boundary, {"a": 1}, base + 1)
    assert not decide(policy, user, more, ledger, defaults=DEFAULTS).allowed


@settings(max_examples=100, deadline=None)
@given(
    threshold=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    plan=st.lists(st.tuples(st.sampled_from(EPS), st.booleans()), max_size=30),
)
def test_gated_publishes_never_run_without_approval(
    threshold: float, plan: list[tuple[float, bool]]
) -> None:
    policy = Policy.from_dict({"approval": {"epsilon_above": threshold}})
    ledger: list[Charge] = []
    for i, (epsilon, gaussian) in enumerate(plan):
        step = Step(i % 3, ("a",), epsilon, gaussian, i * 60, None)
        req, user = request_of(step), USERS[step.user]
        d: Decision = decide(policy, user, req, ledger, defaults=DEFAULTS)
        gated = req.epsilon_units > _units(threshold, E9)
        if gated:
            assert not d.allowed
        if d.allowed and d.granted is not None:
            ledger.append(d.granted)

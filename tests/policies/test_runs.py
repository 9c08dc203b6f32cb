"""A training run judged as a whole (:func:`policies.decide_run`): each step against the
per-publish caps, the total against the budget, dataset caps and approval thresholds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dpnode.policies import (
    Allowance,
    Approval,
    Charge,
    Outcome,
    RunRequest,
    decide,
    decide_run,
    epsilon_units,
    filter_epsilon,
    load_policy,
    run_total,
)
from tests.policies.conftest import ALICE, T0, publish

#: A Gaussian step: epsilon 0.1 at delta 1e-6 asked, charged rho 2e-4 (roughly what the
#: node calibrates for it).
STEP = publish(0.1, delta_units=10**12, rho_units=200_000)


def test_the_total_is_the_steps_rho_converted_by_the_filter_at_the_allowance(
    defaults: Allowance,
) -> None:
    policy = load_policy("")
    eps, delta = run_total(policy, ALICE, RunRequest(40, STEP), defaults=defaults)
    share = policy.zcdp_delta_share
    delta_z = int(defaults.delta_units * share)
    assert delta == delta_z
    expected = filter_epsilon(40 * 2e-4, delta_z * 1e-18)
    assert eps is not None and eps == pytest.approx(epsilon_units(expected), abs=2)
    # As the ledger counts it after the steps: one decide() per step agrees.
    ledger: list[Charge] = []
    for _ in range(40):
        d = decide(policy, ALICE, STEP, ledger, defaults=defaults)
        assert d.granted is not None
        ledger.append(d.granted)
    whole = decide_run(policy, ALICE, RunRequest(40, STEP), [], defaults=defaults)
    assert whole.allowed and whole.granted is None
    assert whole.remaining == decide(policy, ALICE, STEP, ledger[:-1], defaults=defaults).remaining
    assert whole.reason == "this run of 40 steps is within every rule of the policy"


def test_the_threshold_compares_the_total_and_an_approval_lifts_it(
    defaults: Allowance,
) -> None:
    policy = load_policy("[approval]\nepsilon_above = 0.5\n")
    run = RunRequest(400, STEP)
    assert decide(policy, ALICE, STEP, [], defaults=defaults).allowed  # each step alone passes
    d = decide_run(policy, ALICE, run, [], defaults=defaults)
    assert d.outcome is Outcome.NEEDS_APPROVAL and d.rule == "approval.epsilon_above"
    assert d.reason.startswith(
        "training runs (in total) above epsilon 0.5 wait for an admin's approval; "
        "this run of 400 steps totals "
    )
    yes = Approval(True, "root@example.org", T0, "reviewed")
    assert decide_run(policy, ALICE, run, [], defaults=defaults, approval=yes).allowed
    no = Approval(False, "root@example.org", T0, "not this quarter")
    denied = decide_run(policy, ALICE, run, [], defaults=defaults, approval=no)
    assert (denied.outcome, denied.rule) == (Outcome.REFUSE, "approval")
    assert denied.reason == (
        "an admin (root@example.org) denied this run of 400 steps: not this quarter"
    )


def test_caps_apply_to_each_step_and_the_budget_to_the_total(defaults: Allowance) -> None:
    capped = load_policy("[publish]\nmax_epsilon = 0.05\n")
    d = decide_run(capped, ALICE, RunRequest(2, STEP), [], defaults=defaults)
    assert d.rule == "publish.max_epsilon"
    assert d.reason.startswith("each step of this run asks for epsilon 0.1;")
    # An approval does not lift a budget: a run that cannot fit is refused, never queued.
    gated = load_policy("[approval]\nepsilon_above = 0.5\n")
    huge = RunRequest(10**6, STEP)
    yes = Approval(True, "root@example.org", T0)
    for approval in (None, yes):
        d = decide_run(gated, ALICE, huge, [], defaults=defaults, approval=approval)
        assert (d.outcome, d.rule) == (Outcome.REFUSE, "defaults.epsilon")
        assert d.reason.startswith("this run of 1000000 steps costs rho 200 (zCDP)")
    # The dataset's cap across all users counts the whole run, on top of what others spent.
    cap = load_policy("[datasets.diabetes]\nmax_epsilon = 1.0\n")
    others = [Charge(T0, 99, (1,), epsilon_units(0.9))]
    assert decide_run(cap, ALICE, RunRequest(2, STEP), [], defaults=defaults).allowed
    d = decide_run(cap, ALICE, RunRequest(2, STEP), others, defaults=defaults)
    assert d.rule == "datasets.diabetes.max_epsilon"


def test_the_rate_limit_is_left_to_the_steps(defaults: Allowance) -> None:
    policy = load_policy("[rate_limit]\nmax_publishes = 1\nwindow = '1h'\n")
    ledger = [Charge(T0, ALICE.id, (), epsilon_units(0.1))]
    assert not decide(policy, ALICE, STEP, ledger, defaults=defaults).allowed
    assert decide_run(policy, ALICE, RunRequest(5, STEP), ledger, defaults=defaults).allowed


def test_a_run_is_of_gaussian_steps() -> None:
    with pytest.raises(ValueError, match="Gaussian"):
        RunRequest(3, publish(0.1))
    with pytest.raises(ValueError, match="steps"):
        RunRequest(0, STEP)


def test_a_run_whose_samplers_cost_a_delta_of_one_or_more_says_it_promises_nothing(
    defaults: Allowance,
) -> None:
    # At a large epsilon each step's sampler costs a whole delta: ten steps read "delta 10"
    step = replace(STEP, extra_delta_units=10**18)
    d = decide_run(load_policy(""), ALICE, RunRequest(10, step), [], defaults=defaults)
    assert d.outcome is Outcome.REFUSE
    assert "delta 10 (a delta of 1 or more promises nothing)" in d.reason
    assert (
        "promises nothing" not in decide(load_policy(""), ALICE, STEP, [], defaults=defaults).reason
    )

"""Each rule, by example: the outcome, the rule's name and the reason a person reads."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dpnode.policies import (
    Allowance,
    Approval,
    Charge,
    Grant,
    Outcome,
    PublishRequest,
    User,
    budget_status,
    decide,
    decide_approved,
    delta_units,
    epsilon_units,
    load_policy,
)
from tests.policies.conftest import ALICE, BOB, T0, at, publish

RENEWING = "[renewal]\nevery = '30d'\nanchor = 2026-01-01T00:00:00Z\n"


def spent(user: User, epsilon: float, when: object = T0, dataset: int = 1) -> Charge:
    return Charge(when, user.id, (dataset,), epsilon_units(epsilon))  # type: ignore[arg-type]


def test_empty_policy_allows_within_the_node_default(defaults: Allowance) -> None:
    d = decide(load_policy(""), ALICE, publish(0.5), [], defaults=defaults)
    assert d.outcome is Outcome.ALLOW and d.allowed
    assert d.rule == "allow"
    assert d.reason == "within every rule of the policy"
    assert d.granted == Charge(T0, ALICE.id, (1,), epsilon_units(0.5))
    assert d.remaining.epsilon_units == epsilon_units(9.5)
    assert d.remaining.renews_at is None
    assert d.to_dict() == {
        "outcome": "allow",
        "rule": "allow",
        "reason": "within every rule of the policy",
        "granted": {
            "epsilon_units": 500_000_000,
            "delta_units": 0,
            "rho_units": 0,
            "dataset_ids": [1],
        },
        "remaining": {"epsilon_units": 9_500_000_000, "delta_units": 976562500, "renews_at": None},
    }


def test_node_default_budget_refuses_with_the_remaining_budget(defaults: Allowance) -> None:
    ledger = [spent(ALICE, 9.75)]
    d = decide(load_policy(""), ALICE, publish(0.5), ledger, defaults=defaults)
    assert d.outcome is Outcome.REFUSE and d.granted is None
    assert d.rule == "defaults.epsilon"
    assert d.reason == (
        "this publish costs epsilon 0.5 and does not fit your epsilon budget of 10 in total; "
        "remaining budget: epsilon 0.25, direct delta 9.76562e-10"
    )
    assert d.remaining.epsilon_units == epsilon_units(0.25)


def test_role_and_user_budgets_name_their_rule(defaults: Allowance) -> None:
    policy = load_policy(
        "[roles.data_scientist]\nepsilon = 1.0\n[users.'bob@example.org']\nepsilon = 3.0"
    )
    d = decide(policy, ALICE, publish(1.5), [], defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "roles.data_scientist.epsilon")
    assert "your epsilon budget of 1 in total" in d.reason
    d = decide(policy, BOB, publish(1.5), [], defaults=defaults)
    assert d.allowed
    d = decide(policy, BOB, publish(1.0), [spent(BOB, 2.5)], defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "users.bob@example.org.epsilon")


def test_per_publish_caps(defaults: Allowance) -> None:
    policy = load_policy("[publish]\nmax_epsilon = 1.0\nmax_delta = 1e-7")
    d = decide(policy, ALICE, publish(1.5), [], defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "publish.max_epsilon")
    assert d.reason == "this publish asks for epsilon 1.5; the policy allows at most 1 per publish"
    assert decide(policy, ALICE, publish(1.0), [], defaults=defaults).allowed
    d = decide(policy, ALICE, publish(0.5, delta_units=delta_units(2e-7)), [], defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "publish.max_delta")
    assert (
        d.reason == "this publish asks for delta 2e-07; the policy allows at most 1e-07 per publish"
    )


def test_rate_limit_names_when_the_next_publish_is_possible(defaults: Allowance) -> None:
    policy = load_policy("[rate_limit]\nmax_publishes = 2\nwindow = '1h'")
    ledger = [spent(ALICE, 0.1, at(0)), spent(ALICE, 0.1, at(600)), spent(BOB, 0.1, at(700))]
    d = decide(policy, ALICE, publish(0.1, when=at(1200)), ledger, defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "rate_limit.max_publishes")
    assert d.reason == (
        "rate limit: at most 2 publishes per 1h; you have made 2 in the last 1h; "
        "the next one is possible at 2026-01-01T01:00:00Z"
    )
    assert decide(policy, ALICE, publish(0.1, when=at(3600)), ledger, defaults=defaults).allowed
    assert decide(policy, BOB, publish(0.1, when=at(1200)), ledger, defaults=defaults).allowed


def test_rate_limit_of_zero_disables_publishing(defaults: Allowance) -> None:
    policy = load_policy("[rate_limit]\nmax_publishes = 0\nwindow = '1d'")
    d = decide(policy, ALICE, publish(0.1), [], defaults=defaults)
    assert d.rule == "rate_limit.max_publishes" and "publishing is disabled" in d.reason


def test_dataset_cap_counts_every_user(defaults: Allowance) -> None:
    policy = load_policy("[datasets.diabetes]\nmax_epsilon = 2.0")
    ledger = [spent(ALICE, 1.0), spent(BOB, 0.75), spent(BOB, 5.0, dataset=2)]
    d = decide(policy, ALICE, publish(0.5), ledger, defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "datasets.diabetes.max_epsilon")
    assert d.reason == (
        "dataset 'diabetes' is capped at epsilon 2 across all users; 0.25 is left and this "
        "publish costs epsilon 0.5"
    )
    assert decide(policy, ALICE, publish(0.25), ledger, defaults=defaults).allowed
    # Another dataset (id 2, no cap) is unaffected.
    other = publish(3.0, datasets={"heart": 2})
    assert decide(policy, ALICE, other, ledger, defaults=defaults).allowed


def test_a_publish_on_two_datasets_counts_against_each(defaults: Allowance) -> None:
    policy = load_policy("[datasets.a]\nmax_epsilon = 1.0\n[datasets.b]\nmax_epsilon = 5.0")
    both = publish(0.75, datasets={"a": 1, "b": 2})
    ledger = [Charge(T0, BOB.id, (1, 2), epsilon_units(0.5))]
    d = decide(policy, ALICE, both, ledger, defaults=defaults)
    assert d.rule == "datasets.a.max_epsilon"
    assert decide(policy, ALICE, publish(2.0, datasets={"b": 2}), ledger, defaults=defaults).allowed


def test_dataset_delta_cap_and_its_implicit_default(defaults: Allowance) -> None:
    policy = load_policy(
        "[roles.data_scientist]\ndelta = 0.5\n[datasets.diabetes]\nmax_epsilon = 5.0"
    )
    big = publish(0.1, delta_units=defaults.delta_units)
    d = decide(policy, ALICE, big, [], defaults=defaults)
    assert d.rule == "datasets.diabetes.max_delta"
    assert "(the node's default delta)" in d.reason


def test_approval_threshold_waits_then_reruns_every_rule(defaults: Allowance) -> None:
    policy = load_policy("[approval]\nepsilon_above = 0.5\n[datasets.diabetes]\nmax_epsilon = 1.0")
    request = publish(0.75)
    d = decide(policy, ALICE, request, [], defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.NEEDS_APPROVAL, "approval.epsilon_above")
    assert d.reason == (
        "publishes above epsilon 0.5 wait for an admin's approval; this one asks for 0.75"
    )
    assert d.granted is None
    yes = Approval(True, "admin@example.org", at(60))
    assert decide_approved(policy, ALICE, request, [], yes, defaults=defaults).allowed
    # Meanwhile Bob spent on the dataset: the approved publish no longer fits its cap.
    ledger = [spent(BOB, 0.5, at(30))]
    d = decide_approved(policy, ALICE, request, ledger, yes, defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "datasets.diabetes.max_epsilon")
    no = Approval(False, "admin@example.org", at(60), reason="too much for one query")
    d = decide_approved(policy, ALICE, request, [], no, defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "approval")
    assert d.reason == "an admin (admin@example.org) denied this publish: too much for one query"


def test_an_approval_covers_only_what_it_says(defaults: Allowance) -> None:
    policy = load_policy("[approval]\nepsilon_above = 0.5")
    upto = Approval(True, "admin@example.org", at(60), epsilon_units=epsilon_units(0.75))
    assert decide_approved(policy, ALICE, publish(0.75), [], upto, defaults=defaults).allowed
    d = decide_approved(policy, ALICE, publish(0.8), [], upto, defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.NEEDS_APPROVAL, "approval.epsilon_above")


def test_a_publish_that_would_be_refused_is_not_queued(defaults: Allowance) -> None:
    policy = load_policy("[approval]\nepsilon_above = 0.5\n[publish]\nmax_epsilon = 1.0")
    d = decide(policy, ALICE, publish(2.0), [], defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "publish.max_epsilon")


def test_delta_approval_threshold(defaults: Allowance) -> None:
    policy = load_policy("[approval]\ndelta_above = 1e-9")
    gaussian = publish(0.1, delta_units=delta_units(1e-8), rho_units=epsilon_units(0.0001))
    d = decide(policy, ALICE, gaussian, [], defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.NEEDS_APPROVAL, "approval.delta_above")
    assert d.reason.endswith("this one asks for 1e-08")


def test_renewal_counts_only_the_current_period(defaults: Allowance) -> None:
    policy = load_policy(RENEWING + "[roles.data_scientist]\nepsilon = 1.0")
    ledger = [spent(ALICE, 1.0, at(days=29))]
    d = decide(policy, ALICE, publish(0.5, when=at(days=29.5)), ledger, defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "roles.data_scientist.epsilon")
    assert "your epsilon budget of 1 per 30d" in d.reason
    assert d.reason.endswith("(renews at 2026-01-31T00:00:00Z)")
    d = decide(policy, ALICE, publish(1.0, when=at(days=30)), ledger, defaults=defaults)
    assert d.allowed and d.remaining.epsilon_units == 0


def test_dataset_caps_do_not_renew_with_user_budgets(defaults: Allowance) -> None:
    policy = load_policy(RENEWING + "[datasets.diabetes]\nmax_epsilon = 1.0")
    ledger = [spent(ALICE, 1.0, at(days=1))]
    d = decide(policy, ALICE, publish(0.5, when=at(days=400)), ledger, defaults=defaults)
    assert d.rule == "datasets.diabetes.max_epsilon"
    renewing_cap = load_policy(
        "[datasets.diabetes]\nmax_epsilon = 1.0\n"
        "[datasets.diabetes.renewal]\nevery = '52w'\nanchor = 2026-01-01T00:00:00Z"
    )
    d = decide(renewing_cap, ALICE, publish(0.5, when=at(days=400)), ledger, defaults=defaults)
    assert d.allowed
    d = decide(renewing_cap, ALICE, publish(0.5, when=at(days=300)), ledger, defaults=defaults)
    assert "across all users per 52w" in d.reason


def test_gaussian_charges_convert_at_the_reserved_delta(defaults: Allowance) -> None:
    policy = load_policy("[roles.data_scientist]\nepsilon = 1.0\ndelta = 1e-6")
    rho = epsilon_units(0.01)
    gaussian = publish(0.0, rho_units=rho)
    d = decide(policy, ALICE, gaussian, [], defaults=defaults)
    assert d.allowed and d.granted is not None
    assert (d.granted.rho_units, d.granted.epsilon_units) == (rho, 0)
    assert 0 < d.remaining.epsilon_units < epsilon_units(0.3)  # 0.01 rho costs ~0.72 epsilon
    d = decide(policy, ALICE, gaussian, [d.granted], defaults=defaults)
    assert d.rule == "roles.data_scientist.epsilon"
    assert "rho 0.01 (zCDP)" in d.reason


def test_no_rho_without_delta(defaults: Allowance) -> None:
    policy = load_policy("[roles.data_scientist]\ndelta = 0.0")
    d = decide(policy, ALICE, publish(0.0, rho_units=1), [], defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "roles.data_scientist.delta")
    assert d.reason == (
        "this publish costs rho 1e-09 (zCDP), which needs a delta budget to convert to "
        "epsilon, and your delta budget is 0"
    )
    assert decide(policy, ALICE, publish(0.5), [], defaults=defaults).allowed
    capped = load_policy("[datasets.diabetes]\nmax_epsilon = 5.0\nmax_delta = 0.0")
    d = decide(capped, ALICE, publish(0.0, rho_units=1), [], defaults=defaults)
    assert (d.outcome, d.rule) == (Outcome.REFUSE, "datasets.diabetes.max_delta")


@pytest.mark.parametrize("convert_name", ["filter_epsilon", "bun_steinke"])
def test_conversion_is_a_parameter(defaults: Allowance, convert_name: str) -> None:
    from dpnode import policies

    convert = getattr(policies, convert_name)
    rho = epsilon_units(0.001)
    ledger = [Charge(T0, ALICE.id, (1,), 0, 0, rho)]
    status = budget_status(
        load_policy(""), ALICE, ledger, at=T0, defaults=defaults, rho_to_epsilon=convert
    )
    share = policies.Policy().zcdp_delta_share
    expected = 10.0 - convert(0.001, 1e-6 * share)
    assert abs(status.remaining.epsilon_units - epsilon_units(expected)) <= 2


def test_grants_raise_the_allocation_from_their_time(defaults: Allowance) -> None:
    policy = load_policy("[roles.data_scientist]\nepsilon = 1.0")
    grant = Grant(at(100), epsilon_units(2.0), by="admin@example.org", reason="thesis")
    alice = User(ALICE.id, ALICE.email, ALICE.role, (grant,))
    ledger = [spent(ALICE, 1.0)]
    before = decide(policy, alice, publish(1.0, when=at(50)), ledger, defaults=defaults)
    assert before.rule == "roles.data_scientist.epsilon"
    after = decide(policy, alice, publish(1.0, when=at(150)), ledger, defaults=defaults)
    assert after.allowed and after.remaining.epsilon_units == epsilon_units(1.0)
    refused = decide(policy, alice, publish(2.5, when=at(150)), ledger, defaults=defaults)
    assert "your epsilon budget of 3 in total (of which 2 granted on request)" in refused.reason


def test_budget_status_reports_the_period(defaults: Allowance) -> None:
    policy = load_policy(RENEWING)
    ledger = [spent(ALICE, 1.0, at(days=31)), spent(ALICE, 2.0, at(days=10))]
    status = budget_status(policy, ALICE, ledger, at=at(days=40), defaults=defaults)
    assert status.period_start == T0 + timedelta(days=30)
    assert status.spent.epsilon_units == epsilon_units(1.0)
    assert status.remaining.epsilon_units == epsilon_units(9.0)
    assert status.allocation.epsilon_rule == "defaults.epsilon"


def test_the_samplers_costs_are_charged_on_top_and_named_when_they_do_not_fit(
    defaults: Allowance,
) -> None:
    # A Gaussian release: its rho, its sampler's epsilon and delta (at its own parameters).
    gaussian = PublishRequest(
        at=T0,
        datasets={"diabetes": 1},
        epsilon_units=epsilon_units(0.5),
        delta_units=delta_units(1e-7),
        rho_units=25_000_000,
        extra_delta_units=7,
        extra_epsilon_units=3,
    )
    d = decide(load_policy(""), ALICE, gaussian, [], defaults=defaults)
    assert d.granted == Charge(T0, ALICE.id, (1,), 3, 7, 25_000_000)
    # A Laplace release: the asked epsilon plus any extra; the asked delta plus the extra.
    laplace = PublishRequest(
        at=T0, epsilon_units=epsilon_units(0.5), extra_delta_units=2, extra_epsilon_units=1
    )
    assert laplace.charge(ALICE.id) == Charge(T0, ALICE.id, (), epsilon_units(0.5) + 1, 2, 0)
    # A deviation no budget covers (a single release at a huge epsilon): refused on delta,
    # and the reason says where the delta comes from.
    huge = PublishRequest(at=T0, epsilon_units=epsilon_units(5.0), extra_delta_units=10**18)
    d = decide(load_policy(""), ALICE, huge, [], defaults=defaults)
    assert d.outcome is Outcome.REFUSE and d.rule == "defaults.delta"
    assert d.reason.endswith(
        "of its delta, 1 is what the noise samplers' finite precision costs at this release's "
        "own epsilon (or rho), which grows steeply with it: several releases at a smaller "
        "epsilon (or rho) each cost far less"
    )
    with pytest.raises(ValueError, match="extra_epsilon_units"):
        PublishRequest(at=T0, extra_epsilon_units=-1)

"""Allocations, grants and the limit arithmetic."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.node.db.models import Role
from dpnode.policies import (
    Allowance,
    Grant,
    Limit,
    Spent,
    User,
    allocation_for,
    apply_grant,
    bun_steinke,
    filter_epsilon,
    load_policy,
)
from tests.policies.conftest import ALICE, DEFAULTS, at


def test_user_override_beats_role_beats_default_per_key() -> None:
    policy = load_policy(
        "[roles.data_scientist]\nepsilon = 2.0\ndelta = 1e-7\n"
        "[users.'ALICE@example.org']\ndelta = 1e-5"
    )
    a = allocation_for(policy, ALICE, defaults=DEFAULTS)
    assert (a.epsilon_units, a.epsilon_rule) == (2 * 10**9, "roles.data_scientist.epsilon")
    assert (a.delta_units, a.delta_rule) == (10**13, "users.alice@example.org.delta")
    owner = User(9, "owner@example.org", "data_owner")
    b = allocation_for(policy, owner, defaults=DEFAULTS)
    assert (b.epsilon_units, b.delta_units) == (DEFAULTS.epsilon_units, DEFAULTS.delta_units)
    assert (b.epsilon_rule, b.delta_rule) == ("defaults.epsilon", "defaults.delta")


def test_a_grant_adds_to_the_allocation_and_is_kept_in_its_history() -> None:
    base = allocation_for(load_policy(""), ALICE, defaults=DEFAULTS)
    first = Grant(at(10), 5 * 10**8, by="admin@example.org", reason="thesis")
    second = Grant(at(20), 10**9, 10**12, by="admin@example.org")
    after = apply_grant(apply_grant(base, first), second)
    assert after.epsilon_units == base.epsilon_units + 15 * 10**8
    assert after.delta_units == base.delta_units + 10**12
    assert after.grants == (first, second)
    assert (after.epsilon_rule, after.delta_rule) == (base.epsilon_rule, base.delta_rule)


grants = st.lists(
    st.builds(
        Grant,
        at=st.integers(0, 1000).map(at),
        epsilon_units=st.integers(0, 10**10),
        delta_units=st.integers(0, 10**12),
    ),
    max_size=5,
)


@settings(deadline=None)
@given(grants, st.integers(-10, 1010))
def test_allocation_counts_exactly_the_grants_made_by_then(gs: list[Grant], when: int) -> None:
    user = User(ALICE.id, ALICE.email, ALICE.role, tuple(gs))
    a = allocation_for(load_policy(""), user, defaults=DEFAULTS, at=at(when))
    made = [g for g in gs if g.at <= at(when)]
    assert a.epsilon_units == DEFAULTS.epsilon_units + sum(g.epsilon_units for g in made)
    assert a.delta_units == DEFAULTS.delta_units + sum(g.delta_units for g in made)
    assert sorted(a.grants, key=lambda g: g.at) == sorted(made, key=lambda g: g.at)


def test_allowance_reads_configured_floats_as_typed() -> None:
    assert Allowance.of(0.3, 1e-6) == Allowance(300_000_000, 10**12)


SHARE = Fraction(1023, 1024)


def test_limit_splits_delta_once() -> None:
    limit = Limit(10**9, 1024 * 10**6, SHARE)
    assert limit.conversion_delta_units == 1023 * 10**6
    assert limit.delta_fits(Spent(0, 10**6, 0))
    assert not limit.delta_fits(Spent(0, 10**6 + 1, 0))
    assert limit.remaining(Spent(0, 4 * 10**5, 0), filter_epsilon) == (10**9, 6 * 10**5)


@settings(deadline=None)
@given(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9))
def test_more_spending_never_fits_better(e: int, r: int, extra: int) -> None:
    limit = Limit(2 * 10**9, 10**12, SHARE)
    for convert in (filter_epsilon, bun_steinke):
        if limit.epsilon_fits(Spent(e + extra, 0, r), convert):
            assert limit.epsilon_fits(Spent(e, 0, r), convert)
        if limit.epsilon_fits(Spent(e, 0, r + extra), convert):
            assert limit.epsilon_fits(Spent(e, 0, r), convert)


def test_unlimited_sides() -> None:
    limit = Limit(None, None, SHARE)
    assert limit.epsilon_fits(Spent(10**18, 10**18, 10**18), filter_epsilon)
    assert limit.delta_fits(Spent(0, 10**18, 0))
    assert limit.remaining(Spent(), filter_epsilon) == (-1, -1)


def test_users_have_a_known_role() -> None:
    assert User(1, "a@x.org", Role.DATA_OWNER).role == "data_owner"
    with pytest.raises(ValueError, match="unknown role 'superuser'"):
        User(1, "a@x.org", "superuser")

"""What policies mirrors from the node stays in step with it (policies cannot import node)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode import policies
from dpnode.core.dp import accounting
from dpnode.node.db.models import Role
from dpnode.node.services import budget
from dpnode.node.settings import Settings


def test_units_are_the_ledgers() -> None:
    assert policies.EPSILON_UNIT == budget.EPSILON_UNIT
    assert policies.RHO_UNIT == budget.RHO_UNIT
    assert policies.DELTA_UNIT == budget.DELTA_UNIT


@settings(deadline=None)
@given(st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False))
def test_configured_amounts_round_like_the_ledger(value: float) -> None:
    for unit in (budget.EPSILON_UNIT, budget.DELTA_UNIT):
        assert policies.units_down(value, unit) == budget.units_down(value, unit, "x")
        assert policies.units_up(value, unit) == budget.units_up(value, unit, "x")


def test_roles_are_the_nodes() -> None:
    assert set(policies.ROLES) == {r.value for r in Role}


def test_defaults_in_tests_are_the_settings_defaults() -> None:
    from tests.policies.conftest import DEFAULTS

    fields = Settings.model_fields
    expected = policies.Allowance.of(
        fields["default_epsilon_budget"].default, fields["default_delta_budget"].default
    )
    assert expected == DEFAULTS


def test_default_conversion_is_the_nodes_filter() -> None:
    assert policies.ORDERS == accounting.ORDERS
    share = 1 - accounting.SAMPLER_DELTA_SHARE
    assert policies.Policy().zcdp_delta_share == share
    for rho in (1e-6, 1e-3, 0.05, 0.5, 3.0):
        for delta in (1e-9, 1e-6, 1e-3):
            # dpnode.core.dp converts at delta_z = delta * (1 - 1/1024); so do policies.
            node_eps, _ = accounting.spent([accounting.Charge(rho=rho)], epsilon=10.0, delta=delta)
            ours = policies.filter_epsilon(rho, delta * share)
            assert math.isclose(node_eps, ours, rel_tol=1e-12)


def test_bun_steinke_is_the_nodes() -> None:
    for rho in (0.0, 1e-4, 0.5, 2.0):
        assert policies.bun_steinke(rho, 1e-6) == accounting.zcdp_to_dp(rho, delta=1e-6)

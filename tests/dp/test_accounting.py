"""Accounting: golden numbers, monotonicity, and a filter that never lets a budget overflow."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.dp.accounting import (
    ORDERS,
    SAMPLER_DELTA_SHARE,
    Charge,
    calibrate_rho,
    compose,
    fits,
    gaussian_sigma,
    pure_to_zcdp,
    spent,
    zcdp_delta,
    zcdp_to_dp,
    zcdp_to_dp_cks,
)

# (rho, delta, epsilon by CKS 2020 Corollary 13), computed with OpenDP 0.16's
# make_zCDP_to_approxDP, which implements the same bound.
CKS_GOLDEN = [
    (0.025, 1e-6, 1.014074254726128),
    (0.5, 1e-6, 5.22153444453017),
    (2.0, 1e-6, 11.688596249354896),
]


@pytest.mark.parametrize(("rho", "delta", "epsilon"), CKS_GOLDEN)
def test_cks_conversion_golden(rho: float, delta: float, epsilon: float) -> None:
    assert zcdp_to_dp_cks(rho, delta=delta) == pytest.approx(epsilon, rel=1e-9)
    assert zcdp_delta(rho, epsilon=epsilon) == pytest.approx(delta, rel=1e-6)


def test_cks_conversion_agrees_with_opendp() -> None:
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    for rho in (0.01, 0.3, 5.0):
        scale = math.sqrt(1 / (2 * rho))
        m = dp.m.make_gaussian(
            dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=scale
        )
        curve = dp.c.make_zCDP_to_approxDP(m).map(1.0)
        for delta in (1e-5, 1e-9):
            assert zcdp_to_dp_cks(m.map(1.0), delta=delta) == pytest.approx(
                curve.epsilon(delta), rel=1e-9
            )


def test_bun_steinke_golden() -> None:
    assert zcdp_to_dp(0.5, delta=1e-6) == pytest.approx(0.5 + 2 * math.sqrt(0.5 * math.log(1e6)))
    assert zcdp_to_dp(0.0, delta=1e-6) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-5, 50.0), st.floats(1e-12, 1e-3))
def test_cks_is_tighter_and_calibration_inverts_it(rho: float, delta: float) -> None:
    eps = zcdp_to_dp_cks(rho, delta=delta)
    assert eps <= zcdp_to_dp(rho, delta=delta) * (1 + 1e-12)
    assert zcdp_delta(rho, epsilon=eps) <= delta * (1 + 1e-9)
    back = calibrate_rho(eps, delta)
    assert back == pytest.approx(rho, rel=1e-6)
    assert zcdp_delta(back, epsilon=eps) <= delta * (1 + 1e-9)


def test_conversions_are_monotone() -> None:
    rhos = [10.0**e for e in range(-6, 2)]
    eps = [zcdp_to_dp_cks(r, delta=1e-6) for r in rhos]
    assert eps == sorted(eps)
    calibrated = [calibrate_rho(e, 1e-6) for e in (0.1, 0.5, 1.0, 2.0, 8.0)]
    assert calibrated == sorted(calibrated)


def test_gaussian_sigma_matches_theorem_14() -> None:
    sigma = gaussian_sigma(2.0, epsilon=1.0, delta=1e-6)
    assert 2.0**2 / (2 * sigma**2) == pytest.approx(calibrate_rho(1.0, 1e-6))


def test_pure_to_zcdp_and_compose() -> None:
    assert pure_to_zcdp(0.2) == pytest.approx(0.02)
    total = compose([Charge(epsilon=0.1), Charge(rho=0.2, tv=1e-30), Charge(epsilon=0.3)])
    assert total == Charge(epsilon=0.4, rho=0.2, tv=1e-30)
    with pytest.raises(ValueError, match="rho must be finite"):
        Charge(rho=-1.0)
    with pytest.raises(ValueError, match="epsilon must be finite"):
        Charge(epsilon=math.nan)


def test_pure_charges_use_the_whole_epsilon() -> None:
    history = [Charge(epsilon=0.1, tv=1e-30)] * 9
    assert fits(history, Charge(epsilon=0.1, tv=1e-30), epsilon=1.0, delta=1e-9)
    assert not fits(history, Charge(epsilon=0.11), epsilon=1.0, delta=1e-9)


def test_a_zero_delta_budget_admits_only_exact_pure_charges() -> None:
    assert fits([], Charge(epsilon=0.5), epsilon=1.0, delta=0.0)
    assert not fits([], Charge(epsilon=0.5, tv=1e-40), epsilon=1.0, delta=0.0)
    assert not fits([], Charge(rho=1e-9), epsilon=1.0, delta=0.0)


def test_sampler_deviation_is_charged_against_delta() -> None:
    cap = 1e-6 * SAMPLER_DELTA_SHARE / (1 + math.e)
    assert fits([], Charge(epsilon=0.5, tv=cap * 0.99), epsilon=1.0, delta=1e-6)
    assert not fits([], Charge(epsilon=0.5, tv=cap * 1.01), epsilon=1.0, delta=1e-6)


def test_zcdp_charges_pay_the_conversion_once() -> None:
    budget = {"epsilon": 1.0, "delta": 1e-6}
    rho = 0.001
    eps_used, delta_used = spent([Charge(rho=rho)] * 10, **budget)
    delta_z = 1e-6 * (1 - SAMPLER_DELTA_SHARE)
    expected = min(a * 10 * rho + math.log(len(ORDERS) / delta_z) / (a - 1) for a in ORDERS)
    assert eps_used == pytest.approx(expected)
    assert delta_used == pytest.approx(delta_z)
    # Ten small Gaussian releases compose in zCDP: far less than ten one-shot conversions.
    assert eps_used < 10 * zcdp_to_dp(rho, delta=1e-6)


charges = st.builds(
    Charge,
    epsilon=st.sampled_from([0.0, 0.0, 0.01, 0.1, 0.3]),
    rho=st.sampled_from([0.0, 0.0, 1e-4, 1e-3, 0.01]),
    tv=st.sampled_from([0.0, 1e-30]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(charges, max_size=60), st.floats(0.1, 5.0), st.floats(1e-10, 1e-3))
def test_filter_never_overspends(requests: list[Charge], eps_b: float, delta_b: float) -> None:
    # Play a sequence of requests through the filter; whatever it admits stays in budget.
    history: list[Charge] = []
    for c in requests:
        if fits(history, c, epsilon=eps_b, delta=delta_b):
            history.append(c)
            eps_used, delta_used = spent(history, epsilon=eps_b, delta=delta_b)
            assert eps_used <= eps_b and delta_used <= delta_b
    # Monotone: a larger request never fits where a smaller one does not.
    small, large = Charge(epsilon=0.01), Charge(epsilon=0.02)
    if fits(history, large, epsilon=eps_b, delta=delta_b):
        assert fits(history, small, epsilon=eps_b, delta=delta_b)


def test_filter_rejects_bad_budgets() -> None:
    for eps, delta in ((-1.0, 1e-6), (math.inf, 1e-6), (1.0, 1.0), (1.0, -1e-9)):
        with pytest.raises(ValueError, match="budget"):
            fits([], Charge(epsilon=0.1), epsilon=eps, delta=delta)

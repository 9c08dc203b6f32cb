"""Accounting: golden numbers, monotonicity, and a filter that never lets a budget overflow,
whatever the budget's size: each release is costed at its own parameters."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.dp import gaussian, laplace
from dpnode.core.dp.accounting import (
    GAUSSIAN_TV,
    ORDERS,
    SAMPLER_DELTA_SHARE,
    Charge,
    Terms,
    calibrate_rho,
    compose,
    fits,
    gaussian_count,
    gaussian_sampler_terms,
    gaussian_sigma,
    laplace_sampler_delta,
    pure_to_zcdp,
    release_terms,
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


def test_sampler_deviation_is_charged_against_delta_at_the_release_s_epsilon() -> None:
    # (1 + e^0.5) tv, the release's own epsilon: not the budget's (this test used 1 + e^1).
    cap = 1e-6 * SAMPLER_DELTA_SHARE / (1 + math.exp(0.5))
    assert fits([], Charge(epsilon=0.5, tv=cap * 0.99), epsilon=1.0, delta=1e-6)
    assert not fits([], Charge(epsilon=0.5, tv=cap * 1.01), epsilon=1.0, delta=1e-6)
    # The same release against a budget of 1e6: the same delta.
    assert fits([], Charge(epsilon=0.5, tv=cap * 0.99), epsilon=1e6, delta=1e-6)
    assert not fits([], Charge(epsilon=0.5, tv=cap * 1.01), epsilon=1e6, delta=1e-6)


def test_zcdp_charges_pay_the_conversion_once() -> None:
    budget = {"epsilon": 1.0, "delta": 1e-6}
    rho = 0.001
    eps_used, delta_used = spent([Charge(rho=rho)] * 10, **budget)
    delta_z = 1e-6 * (1 - SAMPLER_DELTA_SHARE)
    log_k = math.log(len(ORDERS) / delta_z)
    expected = min(
        a * 10 * rho + (log_k - math.log(a)) / (a - 1) + math.log1p(-1 / a) for a in ORDERS
    )
    assert eps_used == pytest.approx(expected)
    assert delta_used == pytest.approx(delta_z)
    # Ten small Gaussian releases compose in zCDP: far less than ten one-shot conversions.
    assert eps_used < 10 * zcdp_to_dp(rho, delta=1e-6)


def _gaussian_delta(epsilon: float, rho: float) -> float:
    """The exact delta of a Gaussian mechanism that is rho-zCDP and no better (sensitivity 1,
    sigma^2 = 1 / (2 rho)) at ``epsilon``: Balle & Wang 2018, Theorem 8."""
    mu = math.sqrt(2 * rho)
    phi = NormalDist().cdf
    return phi(-epsilon / mu + mu / 2) - math.exp(epsilon) * phi(-epsilon / mu - mu / 2)


@pytest.mark.parametrize("delta_b", [1e-9, 1e-6, 1e-5, 1e-3, 0.1])
@pytest.mark.parametrize("rho", [1e-5, 1e-3, 0.02, 0.3, 2.0, 50.0])
def test_the_filter_s_epsilon_is_a_true_epsilon_for_a_gaussian_run(
    rho: float, delta_b: float
) -> None:
    # A run of Gaussian releases of total rho is, at best, one Gaussian mechanism of that
    # rho: its exact delta at the filter's epsilon must be within the delta the filter
    # spends on converting (and it is not wildly below it: the conversion is not trivially
    # loose). The filter pays for adaptivity and for choosing among 21 orders, so it never
    # beats the one-shot conversion of Canonne, Kamath & Steinke at the same delta.
    eps_used, delta_used = spent([Charge(rho=rho)], epsilon=1e9, delta=delta_b)
    assert _gaussian_delta(eps_used, rho) <= delta_used
    assert _gaussian_delta(eps_used, rho) >= delta_used * 1e-4
    assert eps_used >= zcdp_to_dp_cks(rho, delta=delta_used) - 1e-12


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
    for eps, delta in ((-1.0, 1e-6), (math.inf, 1e-6), (math.nan, 1e-6), (1.0, 1.0), (1.0, -1e-9)):
        with pytest.raises(ValueError, match="budget"):
            fits([], Charge(epsilon=0.1), epsilon=eps, delta=delta)
    # Any finite budget is a budget: 700 was the old ceiling, where e^epsilon overflowed.
    assert fits([], Charge(epsilon=800.0), epsilon=1e6, delta=1e-6)


# --- The samplers' deviation, costed per release -------------------------------------------


def test_golden_laplace_sampler_delta() -> None:
    # (1 + e^epsilon) tv, rounded up by a relative 1e-9 at most.
    for epsilon, tv in ((0.1, 2e-28), (1.0, 1e-30), (50.0, 5.4e-36), (60.0, 4.5e-36)):
        exact = (1 + math.exp(epsilon)) * tv
        assert exact <= laplace_sampler_delta(epsilon, tv) <= exact * (1 + 2e-9)
    assert laplace_sampler_delta(3.0, 0.0) == 0.0
    # No delta below 1 covers it: never finite, however large the epsilon.
    assert laplace_sampler_delta(1e6, 1e-30) == math.inf
    assert laplace_sampler_delta(80.0, 1e-30) == math.inf


# (rho, values noised, xi, delta): docs/privacy.md, "The samplers' deviation and the budget".
GAUSSIAN_GOLDEN = [
    (0.5, 1, 2.095475798046247e-09, 1.8672733602343597e-19),
    (1.5392787638667282, 10**6, 0.00013096723801465796, 4.875367912696013e-14),  # 10, 1e-6
    (0.0014514908428104852, 10**5, 3.274180931953995e-06, 1.352893421744519e-16),  # 0.25, 1e-7
    (0.00011010918381520451, 1, 3.274180932116355e-11, 1.4483991478380526e-21),  # 1e-6, 0.009
    (19.056665977345485, 1, 0.14014077556490134, 7.120286808457765e-08),  # 50, 1e-6
]


@pytest.mark.parametrize(("rho", "n", "xi", "delta"), GAUSSIAN_GOLDEN)
def test_golden_gaussian_sampler_terms(rho: float, n: int, xi: float, delta: float) -> None:
    assert gaussian_sampler_terms(rho, n) == pytest.approx((xi, delta), rel=1e-9)
    terms = release_terms(Charge(rho=rho, tv=n * GAUSSIAN_TV))
    assert isinstance(terms, Terms)
    assert (terms.epsilon, terms.rho, terms.delta) == pytest.approx((xi, rho, delta), rel=1e-9)


def test_gaussian_terms_grow_with_rho_and_the_count() -> None:
    rhos = [1e-4, 1e-2, 0.5, 2.0, 5.0, 10.0]
    for n in (1, 1000, 10**6):
        deltas = [gaussian_sampler_terms(r, n)[1] for r in rhos]
        assert deltas == sorted(deltas)
    for r in rhos:
        both = [gaussian_sampler_terms(r, n) for n in (1, 10, 1000, 10**6)]
        assert [d for _, d in both] == sorted(d for _, d in both)
    # Beyond what 128-bit tables can certify: no delta below 1.
    assert gaussian_sampler_terms(500.0, 1) == (math.inf, math.inf)
    assert gaussian_sampler_terms(0.5, 0) == (0.0, 0.0)
    with pytest.raises(ValueError, match="rho"):
        gaussian_sampler_terms(-1.0, 1)


def test_the_count_of_a_gaussian_release_is_its_tv() -> None:
    assert gaussian_count(0.0) == 0
    for n in (1, 2, 21, 10**6, 2**40):
        assert gaussian_count(n * GAUSSIAN_TV) == n
    assert gaussian_count(1e-40) == 1  # any deviation is one value at least
    release = gaussian(np.zeros((3, 7)), sensitivity_l2=1.0, rho=0.5)
    assert gaussian_count(release.sampler_tv) == 21


ALLOCATIONS = [10.0, 40.0, 48.5, 110.0, 1_000.0, 10_000.0, 1e6]


@pytest.mark.parametrize("allocation", ALLOCATIONS)
def test_any_allocation_admits_laplace_and_gaussian_releases(allocation: float) -> None:
    # The old rule charged (1 + e^allocation) tv: from 48.5 on, nothing fitted a 1e-6 delta.
    lap = laplace(np.zeros(1000), sensitivity_l1=1.0, epsilon=1.0).charge
    gau = gaussian(np.zeros(1000), sensitivity_l2=1.0, epsilon=1.0, delta=1e-6).charge
    assert fits([], lap, epsilon=allocation, delta=1e-6)
    assert fits([lap], gau, epsilon=allocation, delta=1e-6)
    used, delta_used = spent([lap, gau], epsilon=allocation, delta=1e-6)
    assert used < 10 and delta_used < 1e-6
    # What a release costs never depends on the allocation.
    assert spent([lap, gau], epsilon=10.0, delta=1e-6) == (used, delta_used)


def test_a_thousand_values_at_allocation_40_until_the_budget_is_spent() -> None:
    # Reported: the 11th release at 0.1 was refused, after 1.0 of 40. Now 400 fit, exactly.
    release = laplace(np.zeros(1000), sensitivity_l1=1.0, epsilon=0.1).charge
    history: list[Charge] = []
    while fits(history, release, epsilon=40.0, delta=1e-6):
        history.append(release)
    assert len(history) == 400  # math.fsum of 400 tenths is 40.0
    used, delta_used = spent(history, epsilon=40.0, delta=1e-6)
    assert used == pytest.approx(40.0) and delta_used < 1e-24


def test_single_releases_at_large_epsilons() -> None:
    # One value at epsilon 50 (Laplace): its deviation costs about 3e-14, affordable.
    lap = laplace([1.0], sensitivity_l1=1.0, epsilon=50.0).charge
    assert fits([], lap, epsilon=110.0, delta=1e-6)
    # A Gaussian release at (50, 1e-6) has rho 19: its bulk's tail costs a delta of 7e-8,
    # beyond a 1e-6 budget's 9.8e-10 for direct deltas, within a 1e-4 budget's.
    gau = gaussian([1.0], sensitivity_l2=1.0, epsilon=50.0, delta=1e-6).charge
    assert not fits([], gau, epsilon=1_000.0, delta=1e-6)
    assert fits([], gau, epsilon=1_000.0, delta=1e-4)


large_charges = st.one_of(
    st.builds(
        Charge,
        epsilon=st.sampled_from([0.01, 0.1, 1.0, 10.0, 45.0, 60.0]),
        tv=st.sampled_from([0.0, 1e-36, 1e-33, 1e-30, 1e-28]),
    ),
    st.builds(
        lambda rho, n: Charge(rho=rho, tv=n * GAUSSIAN_TV),
        st.sampled_from([1e-4, 1e-2, 0.5, 2.0, 6.0]),
        st.sampled_from([0, 1, 100, 10**6]),
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(large_charges, max_size=40),
    st.sampled_from(ALLOCATIONS),
    st.sampled_from([1e-9, 1e-6, 1e-4]),
)
def test_filter_never_overspends_any_allocation(
    requests: list[Charge], eps_b: float, delta_b: float
) -> None:
    history: list[Charge] = []
    for c in requests:
        if fits(history, c, epsilon=eps_b, delta=delta_b):
            history.append(c)
            eps_used, delta_used = spent(history, epsilon=eps_b, delta=delta_b)
            assert eps_used <= eps_b and delta_used <= delta_b
            # The samplers' deltas, each at its own release's parameters, fit their share.
            samplers = math.fsum(release_terms(h).delta for h in history)
            assert samplers <= delta_b * SAMPLER_DELTA_SHARE
        else:
            # Refused only for a reason: the epsilon, or the delta share, would be exceeded.
            terms = [release_terms(h) for h in (*history, c)]
            over_delta = math.fsum(t.delta for t in terms) > delta_b * SAMPLER_DELTA_SHARE
            assert over_delta or spent([*history, c], epsilon=eps_b, delta=delta_b)[0] > eps_b
    # A larger allocation admits at least what a smaller one does.
    larger = 2 * eps_b
    assert all(fits(history[:i], h, epsilon=larger, delta=delta_b) for i, h in enumerate(history))

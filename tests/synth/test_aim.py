"""AIM's private steps: the scores' sensitivity and the selections' law on every neighbour of
tiny tables, the measurements' noise law, and a run's spending against its up-front charge."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest

from dpnode.core.dp import accounting
from dpnode.core.dp.mechanisms import apply_noise, plan_gaussian
from dpnode.core.errors import InvalidRequestError
from dpnode.core.synth import aim, mst
from dpnode.core.synth.estimate import project, sample_model
from tests.dp.stats import ALPHA, chi_square_pvalue, gaussian_cdf, gaussian_edges
from tests.synth.test_mst import _attrs, _neighbours, _table


def _answers(codes: np.ndarray, plan: aim.AimPlan) -> list[np.ndarray]:
    sizes = [a.size for a in plan.attributes]
    return [mst.marginal(codes[:, list(c)], [sizes[j] for j in c]) for c in plan.candidates]


def _estimates(plan: aim.AimPlan, seed: int) -> list[np.ndarray]:
    """A model's marginals, as a round sees them: fixed by earlier releases (public here)."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(0, plan.rows / plan.size(c), plan.size(c)) for c in plan.candidates]


def test_the_workload_is_pairs_and_triples_with_their_subsets_weighted() -> None:
    plan = aim.plan_aim(_attrs(2, 3, 2), rows=10, epsilon=1.0, delta=1e-6)
    assert plan.workload == ((0, 1), (0, 2), (1, 2), (0, 1, 2))
    weights = dict(zip(plan.candidates, plan.weights, strict=True))
    # (0,) shares one attribute with (0,1), (0,2) and (0,1,2); (0,1) two with (0,1) and
    # (0,1,2), one with (0,2) and (1,2)
    assert weights[(0,)] == 3 and weights[(0, 1)] == 6 and weights[(0, 1, 2)] == 9
    wide = aim.plan_aim(_attrs(*([2] * 11)), rows=10, epsilon=1.0, delta=1e-6)
    assert all(len(c) == 2 for c in wide.workload)  # 165 triples: pairs only


def test_every_neighbour_moves_the_scores_within_their_sensitivity() -> None:
    sizes = (2, 2, 3)
    plan = aim.plan_aim(_attrs(*sizes), rows=6, epsilon=1.0, delta=1e-6)
    codes = _table(sizes, 6, 1)
    estimates = _estimates(plan, 0)
    base = aim.candidate_scores(_answers(codes, plan), estimates, plan.weights, 1.5)
    worst = np.zeros(len(plan.candidates), dtype=np.int64)
    for other in _neighbours(codes, sizes):
        moved = np.abs(
            aim.candidate_scores(_answers(other, plan), estimates, plan.weights, 1.5) - base
        )
        worst = np.maximum(worst, moved)
    bound = 2 * np.array(plan.weights) << mst.SCORE_BITS
    assert (worst <= bound).all()
    assert (worst == bound).any()  # the bound is reached: replace-one doubles add/remove's


def _law(scores: np.ndarray, epsilon: float, sensitivity: int) -> list:
    best = int(scores.max())
    weights = [
        mpmath.exp(mpmath.mpf(epsilon) * (int(s) - best) / (2 * sensitivity)) for s in scores
    ]
    return [w / mpmath.fsum(weights) for w in weights]  # the exponential mechanism's


def test_every_neighbour_keeps_a_rounds_selection_within_e_to_its_epsilon() -> None:
    """The exact law of a round's exponential mechanism over the candidates, on a table and on
    each of its neighbours: no candidate's probability moves by more than e^epsilon."""
    sizes = (2, 2, 2)
    plan = aim.plan_aim(_attrs(*sizes), rows=5, epsilon=1.0, delta=1e-6)
    codes = _table(sizes, 5, 2)
    estimates = _estimates(plan, 3)
    sensitivity = 2 * max(plan.weights) << mst.SCORE_BITS
    epsilon = 8.0  # large, so that the law's gaps are visible
    score = aim.candidate_scores(_answers(codes, plan), estimates, plan.weights, 0.5)
    p = _law(score, epsilon, sensitivity)
    worst = mpmath.mpf(0)
    for other in _neighbours(codes, sizes):
        s = aim.candidate_scores(_answers(other, plan), estimates, plan.weights, 0.5)
        q = _law(s, epsilon, sensitivity)
        worst = max(worst, *(abs(mpmath.log(a / b)) for a, b in zip(p, q, strict=True)))
    assert 0.1 * epsilon < worst <= epsilon * (1 + 1e-12)


def test_a_measured_marginals_noise_is_the_discrete_gaussian_the_report_states() -> None:
    """A round's measurement, as the run plans it: many releases of the same counts give the
    discrete Gaussian of the sigma the report states (chi-square on its exact CDF)."""
    plan = aim.plan_aim(_attrs(2, 3), rows=30, epsilon=1.0, delta=1e-6)
    counts = mst.marginal(_table((2, 3), 30, 0), [2, 3])
    rho = (1 - aim.SELECT_SHARE) * plan.round_rho
    noise_plan = plan_gaussian(sensitivity_l2=mst.root_at_least(2), count=6, rho=rho, integral=True)
    noise = np.concatenate(
        [apply_noise(counts.astype(float), noise_plan).values - counts for _ in range(1500)]
    ).astype(np.int64)
    sigma = noise_plan.scale
    assert sigma == pytest.approx(np.sqrt(1 / rho), rel=1e-9)  # squared L2 change 2
    assert chi_square_pvalue(noise, gaussian_cdf(sigma), gaussian_edges(sigma, 30)) > ALPHA
    assert noise.var() == pytest.approx(sigma**2, rel=0.06)


def test_the_charge_is_public_and_bounds_every_run() -> None:
    attrs = _attrs(2, 3, 2)
    plan = aim.plan_aim(attrs, rows=40, epsilon=2.0, delta=1e-6)
    again = aim.plan_aim(attrs, rows=40, epsilon=2.0, delta=1e-6)
    assert plan.terms() == again.terms()  # nothing but public sizes and the asked budget
    terms = plan.terms()
    assert terms.rho == accounting.calibrate_rho(2.0, 1e-6)
    assert 0 < terms.epsilon < 1e-4 and 0 < terms.delta < 1e-9
    # the most rounds: each but the last spends at least a first round's rho
    assert plan.max_rounds * plan.round_rho >= plan.rho - plan.one_way.rho
    with pytest.raises(InvalidRequestError, match="delta must be in"):
        aim.plan_aim(attrs, rows=40, epsilon=2.0, delta=0.0)


def test_a_run_spends_at_most_its_charge_and_learns_the_strong_pair() -> None:
    rng = np.random.default_rng(5)
    n = 300
    a = rng.integers(0, 3, n)
    b = np.where(rng.random(n) < 0.9, a, rng.integers(0, 3, n))  # b follows a
    c = rng.integers(0, 2, n)
    codes = np.stack([a, b, c], axis=1)
    plan = aim.plan_aim(_attrs(3, 3, 2), rows=n, epsilon=8.0, delta=1e-6)
    seen: list[aim.Progress] = []
    run = aim.run_aim(codes, plan, progress=seen.append)
    assert run.rho_used <= Fraction(plan.rho)
    assert 1 <= run.rounds <= plan.max_rounds
    selections = [m.selection_epsilon for m in run.measurements[3:]]
    assert len(selections) == run.rounds and all(e > 0 for e in selections)
    # every round's selection and measurement, summed, is what the run took
    spent = Fraction(plan.one_way.rho) + sum(Fraction(e) ** 2 / 8 for e in selections)
    assert spent <= run.rho_used
    assert [p.phase for p in seen][:2] == ["estimating", "measuring"]
    assert seen[-1].rounds == run.rounds and {p.planned for p in seen} == {plan.max_rounds}
    assert any(set(m.clique) >= {0, 1} for m in run.measurements)  # the strong pair
    synthetic = sample_model(run.model, 3, n, 11)
    assert (synthetic[:, 0] == synthetic[:, 1]).mean() > 0.7
    assert np.array_equal(synthetic, sample_model(run.model, 3, n, 11))  # seeded
    assert project(run.model, (0, 1)).sum() == pytest.approx(n)

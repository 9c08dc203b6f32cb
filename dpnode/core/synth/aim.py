"""AIM (McKenna, Mullins, Sheldon & Miklau 2022): the private steps, with the node's mechanisms.

The run, on a table of ``n`` rows (public) and ``d`` attributes (:mod:`.domain`), each row
its own subject (replace-one: one row's values replaced by any others), at a total ``rho``:

* the **workload** is every 2-way marginal, and every 3-way one when there are few enough
  (at most :data:`MAX_TRIPLES`), each of at most :data:`MAX_CELLS` cells; the
  **candidates** are its cliques and all their subsets, each weighted by how many workload
  attributes it shares, ``w(c) = sum over W of |c & W|`` (public);
* **every 1-way marginal** first, as one discrete Gaussian release (squared L2 change ``2 d``
  on replacing a row) at ``d`` rounds' measurement rho;
* then **rounds**, while budget remains: a candidate chosen by the exponential mechanism
  (:func:`dpnode.core.dp.exponential.exponential_mechanism`) among those that keep the model
  within its size limit, then its marginal measured by a discrete Gaussian release
  (squared L2 change 2), then the model fitted again (post-processing, :mod:`.graphical`,
  warm-started, a few iterations; a full fit at the end). A round starts at
  ``rho_m = 0.9 rho / T`` for the measurement and ``eps^2 / 8 = 0.1 rho / T`` for the
  selection (``T = 16 d``); when the model's marginal on the measured clique moved by less
  than the noise's expected L1 size, the measurement's sigma is halved and the selection's
  epsilon doubled (both rhos times 4); the last round takes what remains.

The score of a candidate ``c`` with ``k`` cells, true counts ``x``, the model's ``x_hat``
(fixed by earlier releases) and the round's noise scale ``sigma`` (public) is, in units of
``2^-SCORE_BITS`` (exact integers): ``S(c) = w(c) (sum |2^b x - round(2^b x_hat)| -
round(2^b sqrt(2 / pi) sigma k))``. Replacing one row moves ``x`` by one count down in one
cell and up in another, so ``S(c)`` moves by at most ``2 w(c) 2^b``; the selection uses the
largest of these over the round's candidates as its sensitivity.

Accounting (``docs/privacy.md``, "Synthetic data: AIM"): an exponential mechanism's selection
at ``eps`` has bounded range ``eps``, hence is ``eps^2 / 8``-zCDP (Cesar & Rogers 2021), as
the paper accounts it, and its sampler's deviation is a delta; a Gaussian release of
``rho_m`` is ``rho_m``-zCDP with its sampler's ``(xi, delta)``. The rounds' parameters
depend on earlier outputs, but the run never lets the rhos' sum pass ``rho`` nor the rounds
pass :attr:`AimPlan.max_rounds`, so what :meth:`AimPlan.terms` charges before anything runs
bounds the sums of every possible run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpnode.core.dp import accounting, samplers
from dpnode.core.dp.exponential import exponential_mechanism, selection_terms
from dpnode.core.dp.mechanisms import NoisePlan, apply_noise, plan_gaussian
from dpnode.core.errors import InvalidRequestError
from dpnode.core.synth import estimate
from dpnode.core.synth.domain import Attribute
from dpnode.core.synth.graphical import Model
from dpnode.core.synth.mst import SCORE_BITS, check_budget, marginal, root_at_least

__all__ = [
    "MAX_CELLS",
    "MAX_TRIPLES",
    "ROUNDS_PER_ATTRIBUTE",
    "SELECT_SHARE",
    "AimPlan",
    "AimRun",
    "Measurement",
    "Progress",
    "candidate_scores",
    "plan_aim",
    "run_aim",
]

#: Rounds planned per attribute (the paper's ``T = 16 d``).
ROUNDS_PER_ATTRIBUTE = 16
#: The share of each round's rho that selects (the paper's 0.1).
SELECT_SHARE = 0.1
#: The most cells a workload marginal may have (the paper's limit).
MAX_CELLS = 10_000
#: 3-way marginals join the workload when there are at most this many.
MAX_TRIPLES = 120
#: The model's size limit, in cells of its junction tree (the paper's 80 MB in float64).
MODEL_CELLS = 80 * 2**20 // 8
#: Mirror-descent iterations after each round (warm-started) and at the end.
ROUND_ITERATIONS = 100
FINAL_ITERATIONS = 500

Clique = tuple[int, ...]


@dataclass(frozen=True)
class AimPlan:
    """Everything about an AIM run decided before any value is read (public metadata only).

    Attributes:
        attributes: the domain.
        rows: the table's row count (public).
        epsilon, delta: what was asked.
        rho: the whole run's zCDP budget, ``calibrate_rho(epsilon, delta)``.
        rounds: ``T``, which sets the first rounds' share of ``rho``.
        workload: the cliques the synthetic table should answer well.
        candidates: what a round may measure, with ``weights`` (see the module).
        one_way: the noise of the first release (every 1-way marginal).
        model_cells: the model's size limit (cells of its junction tree).
    """

    attributes: tuple[Attribute, ...]
    rows: int
    epsilon: float
    delta: float
    rho: float
    rounds: int
    workload: tuple[Clique, ...]
    candidates: tuple[Clique, ...]
    weights: tuple[int, ...]
    one_way: NoisePlan
    model_cells: int = MODEL_CELLS

    @property
    def round_rho(self) -> float:
        """A first round's whole rho (measurement and selection)."""
        return self.rho / self.rounds

    @property
    def max_rounds(self) -> int:
        """The most rounds any run makes: every round but the last spends at least
        :attr:`round_rho` of what the 1-way release left, the last what remains."""
        left = Fraction(self.rho) - Fraction(self.one_way.rho)
        return max(0, math.floor(left / Fraction(self.round_rho))) + 1

    def size(self, clique: Clique) -> int:
        return math.prod(self.attributes[j].size for j in clique)

    @property
    def largest(self) -> int:
        return max(self.size(c) for c in self.candidates)

    @property
    def cells(self) -> int:
        """Cells of every candidate's marginal: what the run holds of the true counts."""
        return sum(self.size(c) for c in self.candidates)

    def terms(self) -> accounting.Terms:
        """What the run costs the privacy filter, at most, whatever its rounds turn out to
        be: the rho (every release's, summed, never passes it) and the samplers' pure
        epsilon and delta, each round's counted at the largest rho and candidate one can
        have."""
        xi1, delta1 = accounting.gaussian_sampler_terms(self.one_way.rho, self.one_way.count)
        xi, delta = accounting.gaussian_sampler_bound(self.rho, self.largest, self.max_rounds)
        # each selection's sampler terms grow with its epsilon: counted at the largest
        xi_sel, delta_sel = selection_terms(math.sqrt(8 * self.rho), len(self.candidates))
        return accounting.Terms(
            math.fsum([xi1, xi, xi_sel * self.max_rounds * (1 + 1e-9)]),
            self.rho,
            math.fsum([delta1, delta, delta_sel * self.max_rounds * (1 + 1e-9)]),
        )


def _workload(attrs: Sequence[Attribute]) -> tuple[Clique, ...]:
    d = len(attrs)
    if d == 1:
        return ((0,),)
    sizes = [a.size for a in attrs]
    pairs = [c for c in itertools.combinations(range(d), 2) if sizes[c[0]] * sizes[c[1]]]
    triples = list(itertools.combinations(range(d), 3)) if d >= 3 else []
    if len(triples) > MAX_TRIPLES:
        triples = []
    fits = [c for c in pairs + triples if math.prod(sizes[j] for j in c) <= MAX_CELLS]
    return tuple(fits) or tuple((j,) for j in range(d))


def _candidates(workload: Sequence[Clique]) -> tuple[tuple[Clique, ...], tuple[int, ...]]:
    closed = sorted(
        {
            sub
            for w in workload
            for k in range(1, len(w) + 1)
            for sub in itertools.combinations(w, k)
        },
        key=lambda c: (len(c), c),
    )
    weights = tuple(sum(len(set(c) & set(w)) for w in workload) for c in closed)
    return tuple(closed), weights


def plan_aim(
    attributes: Sequence[Attribute], *, rows: int, epsilon: float, delta: float
) -> AimPlan:
    """The workload, the candidates and the budget of an AIM run (see the module docstring).

    Raises:
        InvalidRequestError: no attributes, or a bad epsilon or delta (delta must be in
            (0, 1): the Gaussian measurements need one).

    >>> from dpnode.core.synth.domain import Attribute
    >>> attrs = [Attribute(n, "int64", 3, 0.0, 2.0, None) for n in "abc"]
    >>> p = plan_aim(attrs, rows=100, epsilon=1.0, delta=1e-6)
    >>> p.workload, len(p.candidates), p.rounds, p.max_rounds
    (((0, 1), (0, 2), (1, 2), (0, 1, 2)), 7, 48, 46)
    """
    check_budget(attributes, epsilon, delta, "AIM")
    attrs = tuple(attributes)
    d = len(attrs)
    rho = accounting.calibrate_rho(float(epsilon), float(delta))
    rounds = ROUNDS_PER_ATTRIBUTE * d
    workload = _workload(attrs)
    candidates, weights = _candidates(workload)
    measure_rho = (1 - SELECT_SHARE) * rho / rounds
    one_way = plan_gaussian(
        sensitivity_l2=root_at_least(2 * d),
        count=sum(a.size for a in attrs),
        rho=d * measure_rho,
        integral=True,
    )
    return AimPlan(
        attrs,
        rows,
        float(epsilon),
        float(delta),
        rho,
        rounds,
        workload,
        candidates,
        weights,
        one_way,
    )


@dataclass(frozen=True)
class Measurement:
    """One released marginal: its clique, noisy counts, noise scale, and the epsilon of the
    selection that chose it (0 for the 1-way release)."""

    clique: Clique
    noisy: npt.NDArray[np.float64]
    sigma: float
    selection_epsilon: float = 0.0


@dataclass(frozen=True)
class Progress:
    """Where a run is: ``rounds`` done of at most ``planned``, and its ``phase``
    (``measuring``, ``estimating`` or ``sampling``)."""

    rounds: int
    planned: int
    phase: str


@dataclass
class AimRun:
    """What AIM released (:attr:`measurements`), the rho its releases took, and the model
    fitted to them (post-processing; a :class:`.graphical.Model`)."""

    measurements: list[Measurement] = field(default_factory=list)
    rho_used: Fraction = Fraction(0)
    rounds: int = 0
    model: Model | None = None


def candidate_scores(
    answers: Sequence[npt.NDArray[np.int64]],
    estimates: Sequence[npt.NDArray[np.float64]],
    weights: Sequence[int],
    sigma: float,
) -> npt.NDArray[np.int64]:
    """Each candidate's score (see the module docstring), exact integers.

    >>> candidate_scores([np.array([3, 1])], [np.array([2.0, 2.0])], [2], 0.0).tolist()
    [4096]
    """
    unit = 1 << SCORE_BITS
    out = np.empty(len(answers), dtype=np.int64)
    for i, (x, x_hat, w) in enumerate(zip(answers, estimates, weights, strict=True)):
        error = int(np.abs(x * unit - np.rint(x_hat * unit).astype(np.int64)).sum())
        bias = round(math.sqrt(2 / math.pi) * sigma * x.size * unit)
        out[i] = w * (error - bias)
    return out


def _epsilon_at_most(rho: float) -> float:
    """The largest float ``eps`` we find with ``eps^2 / 8 <= rho`` (a selection's zCDP)."""
    eps = math.sqrt(8 * rho)
    while Fraction(eps) ** 2 / 8 > Fraction(rho):
        eps = math.nextafter(eps, 0.0)
    return eps


def run_aim(
    codes: npt.NDArray[np.int64],
    plan: AimPlan,
    *,
    progress: Callable[[Progress], None] | None = None,
) -> AimRun:
    """The 1-way release and the rounds on the binned table ``codes`` (rows x d), fitting the
    model (:mod:`.graphical`) after each round; the returned run's model is fitted to every release.

    Raises:
        InvalidRequestError: ``codes`` is not the plan's shape.
    """
    attrs, d = plan.attributes, len(plan.attributes)
    if codes.shape != (plan.rows, d):
        raise InvalidRequestError(f"the plan is for {(plan.rows, d)} codes, got {codes.shape}")
    report = progress or (lambda _: None)
    sizes = [a.size for a in attrs]
    run = AimRun()
    counts = np.concatenate([marginal(codes[:, [j]], [sizes[j]]) for j in range(d)])
    noisy = apply_noise(counts.astype(np.float64), plan.one_way).values
    for j, part in enumerate(np.split(noisy, np.cumsum(sizes)[:-1])):
        run.measurements.append(Measurement((j,), part, plan.one_way.scale))
    run.rho_used = Fraction(plan.one_way.rho)
    answers = [marginal(codes[:, list(c)], [sizes[j] for j in c]) for c in plan.candidates]
    report(Progress(0, plan.max_rounds, "estimating"))
    model = estimate.fit(attrs, run.measurements, plan.rows, iters=ROUND_ITERATIONS)
    total = Fraction(plan.rho)
    measure_rho = (1 - SELECT_SHARE) * plan.round_rho
    select_rho = SELECT_SHARE * plan.round_rho
    while run.rho_used < total and run.rounds < plan.max_rounds:
        remaining = total - run.rho_used
        last = remaining < 2 * (Fraction(measure_rho) + Fraction(select_rho))
        last = last or run.rounds + 1 == plan.max_rounds
        if last:
            measure_rho = float(remaining * Fraction(1 - SELECT_SHARE))
            select_rho = float(remaining - Fraction(measure_rho))
            while Fraction(measure_rho) + Fraction(select_rho) > remaining:
                select_rho = math.nextafter(select_rho, 0.0)
        if not (measure_rho > 0 and select_rho > 0):
            break
        report(Progress(run.rounds, plan.max_rounds, "measuring"))
        epsilon = _epsilon_at_most(select_rho)
        chosen = _select(plan, model, answers, run, measure_rho, epsilon)
        clique = plan.candidates[chosen]
        noise = plan_gaussian(
            sensitivity_l2=root_at_least(2),
            count=plan.size(clique),
            rho=measure_rho,
            integral=True,
        )
        released = apply_noise(answers[chosen].astype(np.float64), noise).values
        run.measurements.append(Measurement(clique, released, noise.scale, epsilon))
        run.rho_used += Fraction(measure_rho) + Fraction(epsilon) ** 2 / 8
        run.rounds += 1
        report(Progress(run.rounds, plan.max_rounds, "estimating"))
        before = estimate.project(model, clique)
        model = estimate.fit(
            attrs, run.measurements, plan.rows, iters=ROUND_ITERATIONS, warm_start=model
        )
        moved = float(np.abs(estimate.project(model, clique) - before).sum())
        if last:
            break
        if moved <= math.sqrt(2 / math.pi) * noise.scale * noise.count:  # anneal
            measure_rho, select_rho = 4 * measure_rho, 4 * select_rho
    report(Progress(run.rounds, plan.max_rounds, "estimating"))
    run.model = estimate.fit(
        attrs, run.measurements, plan.rows, iters=FINAL_ITERATIONS, warm_start=model
    )
    return run


def _select(
    plan: AimPlan,
    model: Model,
    answers: Sequence[npt.NDArray[np.int64]],
    run: AimRun,
    measure_rho: float,
    epsilon: float,
) -> int:
    """A round's selection among the candidates that keep the model small enough (its limit
    grows with the share of the budget spent, as in the paper: public)."""
    limit = plan.model_cells * float(run.rho_used / Fraction(plan.rho))
    cliques = [m.clique for m in run.measurements]
    open_ = [
        i
        for i, c in enumerate(plan.candidates)
        if estimate.model_cells(plan.attributes, [*cliques, c]) <= max(limit, plan.size(c))
    ] or [i for i, c in enumerate(plan.candidates) if len(c) == 1]
    sigma = plan_gaussian(
        sensitivity_l2=root_at_least(2), count=1, rho=measure_rho, integral=True
    ).scale
    score = candidate_scores(
        [answers[i] for i in open_],
        [estimate.project(model, plan.candidates[i]) for i in open_],
        [plan.weights[i] for i in open_],
        sigma,
    )
    largest = max(plan.weights[i] for i in open_)
    pick = exponential_mechanism(
        score,
        epsilon=epsilon,
        sensitivity=Fraction(2 * largest << SCORE_BITS),
        words=samplers.word_source(),
    )
    return open_[pick]

"""MST (McKenna, Miklau & Sheldon 2021): the private steps, with the node's own mechanisms.

The run, on a table of ``n`` rows (public) and ``d`` attributes (:mod:`.domain`), each row
its own subject (replace-one: one row's values replaced by any others):

1. **every 1-way marginal**, as one release of the discrete Gaussian on the integer grid:
   replacing a row moves one count down and one up in each marginal, so the squared L2
   change is at most ``2 d``, and the release is ``rho_1``-zCDP at scale
   ``sigma_1 = sqrt(2 d / (2 rho_1))``;
2. **a spanning tree of pairs**, ``d - 1`` choices (each among the pairs that join two
   parts of the forest so far; with two attributes there is one pair, and no choice) by
   permute-and-flip (:func:`dpnode.core.dp.selection.permute_and_flip`), each at
   ``epsilon_s / (d - 1)``. A pair's score is the L1 distance between its 2-way marginal
   and the independent model the noisy 1-way marginals give, in units of ``2^-10``
   (``S = sum |2^10 x - round(2^10 x_hat)|``, exact integers): the model is fixed by step 1
   (post-processing), and replacing a row moves ``x`` by 1 in two cells, so ``S`` moves by
   at most ``2 * 2^10``: that is the score's sensitivity;
3. **the chosen 2-way marginals**, each a discrete Gaussian release at ``rho_2 / (d - 1)``
   with squared L2 sensitivity 2.

The asked ``(epsilon, delta)`` is split before anything runs: ``epsilon_s = SELECT_SHARE
epsilon`` (pure, the selections'), and ``rho = calibrate_rho((1 - SELECT_SHARE) epsilon,
delta)`` in halves between steps 1 and 3, so that the run is ``(epsilon, delta)``-DP by
basic composition (``rho``-zCDP implies ``((1 - SELECT_SHARE) epsilon, delta)``-DP). What
the node's filter charges (:meth:`MstPlan.terms`) is the selections' pure epsilon, the
Gaussians' rho, and every sampler's deviation at its own parameters (a Gaussian release's
``(xi, delta)``; a selection's ``(1 + e^eps) tv`` as delta), each Gaussian counted with the
most cells it may noise (a 2-way release's size depends on which pair was chosen, so the
largest pair's is charged). Nothing of it depends on the data.

The exponential mechanism is also ``eps^2 / 8``-zCDP (bounded range, Cesar & Rogers 2021),
which MST's own accounting uses; the node's filter has no zCDP term for a selection's
sampler deviation, so the selections are charged as pure epsilon, a tenth of the budget.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dpnode.core.dp import accounting, samplers
from dpnode.core.dp.mechanisms import NoisePlan, apply_noise, plan_gaussian
from dpnode.core.dp.selection import permute_and_flip, sampler_tv
from dpnode.core.errors import InvalidRequestError
from dpnode.core.synth.domain import Attribute

__all__ = [
    "SCORE_BITS",
    "SELECT_SHARE",
    "Measured",
    "MstPlan",
    "check_budget",
    "marginal",
    "measure",
    "plan_mst",
    "root_at_least",
    "run_mst",
    "scores",
]

#: The share of the asked epsilon spent (pure) on choosing the tree.
SELECT_SHARE = 0.1
#: The scores' fractional bits: integers, exact, and the sensitivity exactly 2 * 2^this.
SCORE_BITS = 10


def root_at_least(n: int) -> float:
    """The smallest float whose square is at least ``n``.

    >>> root_at_least(2) ** 2 >= 2, root_at_least(4)
    (True, 2.0)
    """
    r = math.sqrt(n)
    while Fraction(r) ** 2 < n:
        r = math.nextafter(r, math.inf)
    return r


@dataclass(frozen=True)
class MstPlan:
    """Everything about an MST run decided before any value is read (public metadata only).

    Attributes:
        attributes: the domain.
        rows: the table's row count (public).
        epsilon, delta: what was asked.
        one_way: the noise of step 1 (all 1-way marginals, one release).
        rho_pair: each 2-way marginal's rho.
        select_epsilon: each selection's epsilon (0: no choice to make, ``d <= 2``).
        selections: how many choices step 2 makes.
    """

    attributes: tuple[Attribute, ...]
    rows: int
    epsilon: float
    delta: float
    one_way: NoisePlan
    rho_pair: float
    select_epsilon: float
    selections: int

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return list(itertools.combinations(range(len(self.attributes)), 2))

    def pair_plan(self, a: int, b: int) -> NoisePlan:
        """The noise of the 2-way marginal of attributes ``a`` and ``b`` (step 3)."""
        cells = self.attributes[a].size * self.attributes[b].size
        return plan_gaussian(
            sensitivity_l2=root_at_least(2), count=cells, rho=self.rho_pair, integral=True
        )

    @property
    def largest_pair(self) -> int:
        sizes = sorted((a.size for a in self.attributes), reverse=True)
        return sizes[0] * sizes[1] if len(sizes) > 1 else 0

    def terms(self) -> accounting.Terms:
        """What the run costs the privacy filter: pure epsilon (selections and the Gaussian
        samplers' ``xi``), rho, and the samplers' delta; each rounded up by the callee."""
        d = len(self.attributes)
        xi1, delta1 = accounting.gaussian_sampler_terms(self.one_way.rho, self.one_way.count)
        epsilon, rho, delta = [xi1], [self.one_way.rho], [delta1]
        for _ in range(d - 1):
            xi, dl = accounting.gaussian_sampler_terms(self.rho_pair, self.largest_pair)
            epsilon.append(xi)
            rho.append(self.rho_pair)
            delta.append(dl)
        if self.selections:
            tv = sampler_tv(len(self.pairs))
            selection_delta = accounting.laplace_sampler_delta(self.select_epsilon, tv)
            epsilon += [self.select_epsilon] * self.selections
            delta += [selection_delta] * self.selections
        return accounting.Terms(math.fsum(epsilon), math.fsum(rho), math.fsum(delta))

    @property
    def cells(self) -> int:
        """Cells of every 1-way and 2-way marginal: what scoring the pairs holds at once."""
        sizes = [a.size for a in self.attributes]
        return sum(sizes) + sum(sizes[a] * sizes[b] for a, b in self.pairs)


def check_budget(
    attributes: Sequence[Attribute], epsilon: float, delta: float, method: str
) -> None:
    """Refuse a run without attributes, or with a bad epsilon or delta.

    Raises:
        InvalidRequestError: naming what is wrong (delta must be in (0, 1): the Gaussian
            measurements need one).
    """
    if not attributes:
        raise InvalidRequestError("a synthetic table needs at least one column")
    if isinstance(epsilon, bool) or not (
        isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0
    ):
        raise InvalidRequestError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if isinstance(delta, bool) or not (
        isinstance(delta, (int, float)) and math.isfinite(delta) and 0 < delta < 1
    ):
        raise InvalidRequestError(
            f"delta must be in (0, 1), got {delta!r}: {method} measures marginals with "
            "Gaussian noise, whose guarantee needs a delta > 0 (1e-6, say, for a table of at "
            "most a few hundred thousand rows)"
        )


def plan_mst(
    attributes: Sequence[Attribute], *, rows: int, epsilon: float, delta: float
) -> MstPlan:
    """Split ``(epsilon, delta)`` among MST's steps (see the module docstring).

    Raises:
        InvalidRequestError: no attributes, or a bad epsilon or delta (delta must be in
            (0, 1): the Gaussian measurements need one).

    >>> from dpnode.core.synth.domain import Attribute
    >>> attrs = [Attribute(n, "int64", 3, 0.0, 2.0, None) for n in "abc"]
    >>> p = plan_mst(attrs, rows=100, epsilon=1.0, delta=1e-6)
    >>> p.selections, round(p.select_epsilon, 3), p.one_way.count
    (2, 0.05, 9)
    """
    check_budget(attributes, epsilon, delta, "MST")
    attrs = tuple(attributes)
    d = len(attrs)
    # d - 1 rounds pick the tree's edges; the last round's candidates may be many, but with
    # two attributes there is one pair and nothing to choose
    selections = d - 1 if d >= 3 else 0
    pure = epsilon * SELECT_SHARE if selections else 0.0
    rho = accounting.calibrate_rho(epsilon - pure, delta)
    rho_one = rho / 2 if d > 1 else rho
    rho_pair = (rho - rho_one) / (d - 1) if d > 1 else 0.0
    one_way = plan_gaussian(
        sensitivity_l2=root_at_least(2 * d),
        count=sum(a.size for a in attrs),
        rho=rho_one,
        integral=True,
    )
    return MstPlan(
        attrs,
        rows,
        float(epsilon),
        float(delta),
        one_way,
        rho_pair,
        pure / selections if selections else 0.0,
        selections,
    )


def marginal(codes: npt.NDArray[np.int64], sizes: Sequence[int]) -> npt.NDArray[np.int64]:
    """The counts of each combination of the columns of ``codes`` (rows x k), flattened.

    >>> marginal(np.array([[0, 1], [0, 1], [1, 0]]), [2, 2]).tolist()
    [0, 2, 1, 0]
    """
    flat = np.ravel_multi_index(tuple(codes.T), tuple(sizes)) if codes.shape[1] else None
    total = int(np.prod(sizes))
    if flat is None:
        return np.array([codes.shape[0]], dtype=np.int64)
    return np.bincount(flat, minlength=total).astype(np.int64)


def measure(counts: npt.NDArray[np.int64], plan: NoisePlan) -> npt.NDArray[np.float64]:
    """``counts`` with the plan's discrete Gaussian noise (integers on the grid 1)."""
    return apply_noise(counts.astype(np.float64), plan).values


def scores(
    codes: npt.NDArray[np.int64], plan: MstPlan, one_way: Sequence[npt.NDArray[np.float64]]
) -> npt.NDArray[np.int64]:
    """Every pair's score (see the module docstring): the L1 distance, in units of
    ``2^-SCORE_BITS``, between its counts and the independent model of the noisy 1-way
    marginals (clipped at 0, scaled to the public row count)."""
    n, unit = plan.rows, 1 << SCORE_BITS
    model = []
    for noisy in one_way:
        p = np.clip(noisy, 0.0, None)
        total = p.sum()
        model.append(p / total if total > 0 else np.full(p.size, 1.0 / p.size))
    out = np.empty(len(plan.pairs), dtype=np.int64)
    for i, (a, b) in enumerate(plan.pairs):
        sizes = (plan.attributes[a].size, plan.attributes[b].size)
        x = marginal(codes[:, [a, b]], sizes)
        x_hat = np.rint(np.outer(model[a], model[b]).ravel() * (n * unit)).astype(np.int64)
        out[i] = int(np.abs(x * unit - x_hat).sum())
    return out


class _Components:
    """Union-find over the attributes: which pairs still join two parts of the forest."""

    def __init__(self, count: int) -> None:
        self.parent = list(range(count))

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def join(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


@dataclass(frozen=True)
class Measured:
    """What MST released: the noisy marginals and their noise, the tree's edges."""

    one_way: tuple[npt.NDArray[np.float64], ...]
    one_way_sigma: float
    pairs: tuple[tuple[int, int], ...]
    two_way: tuple[npt.NDArray[np.float64], ...]
    two_way_sigma: tuple[float, ...]


def run_mst(codes: npt.NDArray[np.int64], plan: MstPlan) -> Measured:
    """Steps 1 to 3 on the binned table ``codes`` (rows x d, each in its attribute's range).

    Raises:
        InvalidRequestError: ``codes`` is not the plan's shape.
    """
    attrs, d = plan.attributes, len(plan.attributes)
    if codes.shape != (plan.rows, d):
        raise InvalidRequestError(f"the plan is for {(plan.rows, d)} codes, got {codes.shape}")
    sizes = [a.size for a in attrs]
    counts = np.concatenate([marginal(codes[:, [j]], [sizes[j]]) for j in range(d)])
    noisy = measure(counts, plan.one_way)
    one_way = tuple(np.split(noisy, np.cumsum(sizes)[:-1]))
    chosen: list[tuple[int, int]] = []
    if d == 2:
        chosen = [(0, 1)]
    elif d > 2:
        score = scores(codes, plan, one_way)
        parts = _Components(d)
        sensitivity = Fraction(2 << SCORE_BITS)
        for _ in range(plan.selections):
            open_ = [i for i, (a, b) in enumerate(plan.pairs) if parts.find(a) != parts.find(b)]
            pick = permute_and_flip(
                score[open_],
                epsilon=plan.select_epsilon,
                sensitivity=sensitivity,
                words=samplers.word_source(),
            )
            a, b = plan.pairs[open_[pick]]
            parts.join(a, b)
            chosen.append((a, b))
    two_way, sigmas = [], []
    for a, b in chosen:
        pair_plan = plan.pair_plan(a, b)
        two_way.append(measure(marginal(codes[:, [a, b]], [sizes[a], sizes[b]]), pair_plan))
        sigmas.append(pair_plan.scale)
    return Measured(one_way, plan.one_way.scale, tuple(chosen), tuple(two_way), tuple(sigmas))

"""A graphical model fitted to noisy marginals, in NumPy: post-processing, no private value here.

Private-PGM's estimation (McKenna, Sheldon & Miklau 2019, Algorithm 1): the model is a
junction tree of the measured cliques (each measured clique inside one of its maximal
cliques), its log-potentials are fitted by mirror descent with Armijo steps on the weighted
squared error ``0.5 sum ||(mu_c - y_c) / sigma_c||^2`` of its marginals ``mu`` against the
noisy ones ``y``, and its marginals come from belief propagation (sum-product in log space).
It is ``mbi``'s ``MirrorDescent`` written with NumPy's sums: ``mbi`` compiles a JAX program
for every new set of cliques, and AIM makes a new set every round, so a run spent most of its
time compiling (a 5-column table of 400 rows: 77 s of 105 s).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Model", "Observation", "Tree", "draw", "fit", "junction_tree", "marginals", "sample"]

Clique = tuple[int, ...]
Table = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Observation:
    """A noisy marginal: its clique (sorted attribute indices), counts shaped by the clique's
    sizes, and the noise's standard deviation."""

    clique: Clique
    noisy: Table
    sigma: float


@dataclass(frozen=True)
class Tree:
    """A junction tree (a forest when the cliques fall apart): its maximal cliques in an order
    where each comes after its ``parent`` (-1: a root)."""

    sizes: tuple[int, ...]
    cliques: tuple[Clique, ...]
    parents: tuple[int, ...]

    @property
    def cells(self) -> int:
        return sum(math.prod(self.sizes[j] for j in c) for c in self.cliques)

    def home(self, clique: Sequence[int]) -> int:
        """The first maximal clique holding ``clique`` (-1: none)."""
        wanted = set(clique)
        return next((i for i, c in enumerate(self.cliques) if wanted <= set(c)), -1)


def junction_tree(sizes: Sequence[int], cliques: Sequence[Sequence[int]]) -> Tree:
    """The junction tree of ``cliques`` over attributes of ``sizes`` (every attribute in it):
    triangulated by greedy elimination (each step the attribute whose neighbourhood has the
    fewest cells), its maximal cliques joined by a maximum-weight spanning tree of shared
    attributes.

    >>> junction_tree([2, 3, 2], [(0, 1), (1, 2)]).cliques
    ((0, 1), (1, 2))
    """
    d = len(sizes)
    neighbours: dict[int, set[int]] = {j: set() for j in range(d)}
    for c in cliques:
        for a, b in itertools.combinations(c, 2):
            neighbours[a].add(b)
            neighbours[b].add(a)
    left, found = set(range(d)), []
    while left:
        v = min(sorted(left), key=lambda v: math.prod(sizes[u] for u in neighbours[v] | {v}))
        found.append(tuple(sorted(neighbours[v] | {v})))
        for a, b in itertools.combinations(neighbours[v], 2):
            neighbours[a].add(b)
            neighbours[b].add(a)
        for u in neighbours[v]:
            neighbours[u].discard(v)
        left.discard(v)
    maximal = sorted({c for c in found if not any(set(c) < set(o) for o in found)})
    # Prim's algorithm on shared attributes, rooted at each component's first clique
    parents = [-1] * len(maximal)
    order: list[int] = []
    while len(order) < len(maximal):
        order.append(next(i for i in range(len(maximal)) if i not in order))
        while True:
            best = max(
                (
                    (len(set(maximal[i]) & set(maximal[j])), j, i)
                    for i in order
                    for j in range(len(maximal))
                    if j not in order
                ),
                default=(0, -1, -1),
            )
            if best[0] == 0:
                break
            order.append(best[1])
            parents[best[1]] = best[2]
    at = {i: k for k, i in enumerate(order)}
    return Tree(
        tuple(sizes),
        tuple(maximal[i] for i in order),
        tuple(at[parents[i]] if parents[i] >= 0 else -1 for i in order),
    )


def _aligned(values: Table, attrs: Clique, target: Clique, sizes: Sequence[int]) -> Table:
    """``values`` (axes ``attrs``) shaped to broadcast against a table on ``target``."""
    return values.reshape([sizes[v] if v in attrs else 1 for v in target])


def _logsumexp_to(values: Table, attrs: Clique, keep: Clique) -> Table:
    axes = tuple(i for i, v in enumerate(attrs) if v not in keep)
    if not axes:
        return values
    top = values.max(axis=axes, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    out: Table = np.log(np.exp(values - top).sum(axis=axes)) + np.squeeze(top, axis=axes)
    return out


def marginals(tree: Tree, potentials: Sequence[Table], total: float) -> list[Table]:
    """Each maximal clique's marginal, scaled to ``total``, by belief propagation."""
    cliques, parents, sizes = tree.cliques, tree.parents, tree.sizes
    up: list[Table | None] = [None] * len(cliques)  # each clique's message to its parent
    gathered = [np.array(p, dtype=np.float64) for p in potentials]
    for i in reversed(range(len(cliques))):
        p = parents[i]
        if p >= 0:
            sep = tuple(v for v in cliques[i] if v in cliques[p])
            message = _logsumexp_to(gathered[i], cliques[i], sep)
            up[i] = message
            gathered[p] = gathered[p] + _aligned(message, sep, cliques[p], sizes)
    beliefs = gathered  # the roots have every message now; the rest get their parent's
    for i in range(len(cliques)):
        p = parents[i]
        if p >= 0:
            sep = tuple(v for v in cliques[i] if v in cliques[p])
            sent = up[i]
            assert sent is not None  # every non-root sent one on the way up
            down = beliefs[p] - _aligned(sent, sep, cliques[p], sizes)
            beliefs[i] = beliefs[i] + _aligned(
                _logsumexp_to(down, cliques[p], sep), sep, cliques[i], sizes
            )
    out = []
    for b in beliefs:
        q = np.exp(b - b.max())
        out.append(q * (total / q.sum()))
    return out


def _sum_to(values: Table, attrs: Clique, keep: Sequence[int]) -> Table:
    summed: Table = values.sum(axis=tuple(i for i, v in enumerate(attrs) if v not in keep))
    return summed


@dataclass(frozen=True)
class Model:
    """A fitted model: its junction tree, log-potentials and marginals (on the tree's maximal
    cliques), and the total its marginals sum to."""

    tree: Tree
    potentials: tuple[Table, ...]
    marginals: tuple[Table, ...]
    total: float


def _loss(
    tree: Tree, mu: Sequence[Table], routed: Sequence[tuple[int, Observation]]
) -> tuple[float, list[Table]]:
    loss, grad = 0.0, [np.zeros_like(m) for m in mu]
    for i, o in routed:
        diff = (_sum_to(mu[i], tree.cliques[i], o.clique) - o.noisy) / o.sigma**2
        loss += 0.5 * float((diff * diff).sum()) * o.sigma**2
        grad[i] += _aligned(diff, o.clique, tree.cliques[i], tree.sizes)
    return loss, grad


def fit(
    sizes: Sequence[int],
    observations: Sequence[Observation],
    total: float,
    *,
    iters: int,
    warm_start: Model | None = None,
) -> Model:
    """The model that best explains ``observations`` (every attribute among their cliques or
    not: an attribute no clique holds is uniform), its marginals summing to ``total``;
    ``warm_start``: a model on fewer cliques whose potentials start the descent."""
    tree = junction_tree(
        sizes, [o.clique for o in observations] + [(j,) for j in range(len(sizes))]
    )
    routed = [(tree.home(o.clique), o) for o in observations]
    potentials = [np.zeros([sizes[j] for j in c]) for c in tree.cliques]
    if warm_start is not None and all(tree.home(c) >= 0 for c in warm_start.tree.cliques):
        for c, values in zip(warm_start.tree.cliques, warm_start.potentials, strict=True):
            i = tree.home(c)
            potentials[i] = potentials[i] + _aligned(values, c, tree.cliques[i], sizes)
    # the step's start: 2 / (L total), L the loss gradient's Lipschitz constant (mbi's)
    lipschitz: dict[int, float] = {}
    for i, o in routed:
        ratio = math.prod(sizes[j] for j in tree.cliques[i]) / o.noisy.size
        lipschitz[i] = lipschitz.get(i, 0.0) + ratio / o.sigma**2
    alpha = 2.0 / (max(lipschitz.values(), default=1.0) * total)
    mu = marginals(tree, potentials, total)
    loss, grad = _loss(tree, mu, routed)
    for _ in range(iters):
        trial = [t - alpha * g for t, g in zip(potentials, grad, strict=True)]
        mu2 = marginals(tree, trial, total)
        loss2, grad2 = _loss(tree, mu2, routed)
        gain = sum(float((g * (m - m2)).sum()) for g, m, m2 in zip(grad, mu, mu2, strict=True))
        if loss - loss2 >= 0.5 * alpha * gain:
            potentials, mu, loss, grad, alpha = trial, mu2, loss2, grad2, 1.01 * alpha
        else:
            alpha *= 0.5
    return Model(tree, tuple(potentials), tuple(mu), float(total))


def draw(weights: Table, count: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``count`` values in proportion to ``weights`` by randomised rounding (as ``mbi``'s own
    sampler does): each value ``floor(count p)`` times, the remainder drawn without
    replacement in proportion to the fractions, shuffled. Its counts are within 1 of the
    model's, where independent draws would add a sampling error of ``sqrt(count p)``."""
    p = np.clip(weights, 0.0, None)
    total = p.sum()
    p = p / total if total > 0 else np.full(p.size, 1.0 / p.size)
    expected = p * count
    times = np.floor(expected).astype(np.int64)
    extra = count - int(times.sum())
    if extra > 0:
        fractions = np.clip(expected - times, 0.0, None)
        chances = fractions if fractions.sum() > 0 else np.ones(p.size)
        size = min(extra, int(np.count_nonzero(chances)))
        times[rng.choice(p.size, size=size, replace=False, p=chances / chances.sum())] += 1
        short = count - int(times.sum())  # float rounding left some: the likeliest take them
        if short > 0:
            times[np.argsort(-p)[:short]] += 1
    values = np.repeat(np.arange(p.size), times)
    rng.shuffle(values)
    return values


def sample(model: Model, rows: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
    """``rows`` rows of codes from the model along its junction tree: each root clique's cells
    from its marginal, each other clique's new attributes given its parent's (randomised
    rounding within each group of rows sharing the separator's values)."""
    tree, sizes = model.tree, model.tree.sizes
    codes = np.zeros((rows, len(sizes)), dtype=np.int64)
    for i, (clique, table) in enumerate(zip(tree.cliques, model.marginals, strict=True)):
        p = tree.parents[i]
        sep = tuple(v for v in clique if p >= 0 and v in tree.cliques[p])
        new = tuple(v for v in clique if v not in sep)
        if not new:
            continue
        order = np.transpose(table, [clique.index(v) for v in sep + new])
        conditional = order.reshape(math.prod(sizes[v] for v in sep), -1)
        group = (
            np.ravel_multi_index(tuple(codes[:, list(sep)].T), [sizes[v] for v in sep])
            if sep
            else np.zeros(rows, dtype=np.int64)
        )
        cells = np.zeros(rows, dtype=np.int64)
        for s in np.unique(group):
            where = np.flatnonzero(group == s)
            cells[where] = draw(conditional[s], where.size, rng)
        codes[:, list(new)] = np.stack(np.unravel_index(cells, [sizes[v] for v in new]), axis=1)
    return codes

"""Estimation and sampling from MST's measurements: post-processing, no private value here.

The noisy marginals go to Private-PGM (``mbi``, McKenna et al.), which fits the graphical
model that best explains them (mirror descent on the marginal polytope); the synthetic rows
are then drawn from that model along MST's tree (a root's 1-way marginal, then each
attribute given its parent in the tree), with a seeded NumPy generator so that a caller's
seed reproduces a table. ``mbi`` and JAX are imported here only, on first use: the node
starts, and every other request runs, without them. AIM's measurements go to the NumPy
estimator of :mod:`.graphical` instead (``mbi`` would compile again on every round).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dpnode.core.synth.domain import Attribute
from dpnode.core.synth.graphical import Model, Observation, draw, junction_tree
from dpnode.core.synth.graphical import fit as fit_model
from dpnode.core.synth.graphical import sample as sample_graphical
from dpnode.core.synth.mst import Measured

if TYPE_CHECKING:
    from dpnode.core.synth.aim import Measurement

__all__ = [
    "ITERATIONS",
    "estimate_marginals",
    "fit",
    "model_cells",
    "project",
    "sample_model",
    "sample_tree",
]

#: Mirror-descent iterations: MST's own default is 1000; the tree's model converges sooner.
ITERATIONS = 500


def _mbi() -> Any:
    import jax  # lazily: the node never loads JAX unless it synthesizes

    # float32 stalls on large tables (mbi's own warning)
    jax.config.update("jax_enable_x64", True)  # type: ignore[no-untyped-call]
    jax.config.update("jax_enable_compilation_cache", False)  # type: ignore[no-untyped-call]
    import mbi

    return mbi


def estimate_marginals(
    attributes: Sequence[Attribute], measured: Measured, rows: int
) -> tuple[npt.NDArray[np.float64], dict[tuple[int, int], npt.NDArray[np.float64]]]:
    """The fitted model's 1-way marginal of the first attribute and its 2-way marginals on
    the tree's edges (``sizes[a] x sizes[b]``), all scaled to ``rows``."""
    mbi = _mbi()
    from mbi.estimation import MirrorDescent

    names = tuple(f"c{i}" for i in range(len(attributes)))
    domain = mbi.Domain(names, tuple(a.size for a in attributes))
    measurements = [
        mbi.LinearMeasurement(noisy, (names[j],), stddev=measured.one_way_sigma)
        for j, noisy in enumerate(measured.one_way)
    ]
    # in a canonical order: the same tree chosen in another order is the same estimation
    # problem, whose compiled programs JAX then finds in its cache instead of compiling again
    pairs = sorted(zip(measured.pairs, measured.two_way, measured.two_way_sigma, strict=True))
    measurements += [
        mbi.LinearMeasurement(noisy, (names[a], names[b]), stddev=sigma)
        for (a, b), noisy, sigma in pairs
    ]
    model = MirrorDescent().estimate(
        domain, measurements, known_total=float(rows), iters=ITERATIONS
    )
    root = np.asarray(model.project((names[0],)).datavector(flatten=False), dtype=np.float64)
    edges = {
        (a, b): np.asarray(
            model.project((names[a], names[b])).datavector(flatten=False), dtype=np.float64
        )
        for a, b in measured.pairs
    }
    return root, edges


def sample_tree(
    sizes: Sequence[int],
    root: npt.NDArray[np.float64],
    edges: dict[tuple[int, int], npt.NDArray[np.float64]],
    rows: int,
    rng: np.random.Generator,
) -> npt.NDArray[np.int64]:
    """``rows`` rows of codes drawn from a tree-shaped model: attribute 0 from ``root``,
    every other one given its parent (breadth first) from the edge's 2-way marginal.

    >>> edges = {(0, 1): np.array([[5.0, 0.0], [0.0, 5.0]])}
    >>> codes = sample_tree([2, 2], np.array([5.0, 5.0]), edges, 50, np.random.default_rng(1))
    >>> bool((codes[:, 0] == codes[:, 1]).all())
    True
    """
    d = len(sizes)
    codes = np.zeros((rows, d), dtype=np.int64)
    codes[:, 0] = draw(root, rows, rng)
    neighbours: dict[int, list[tuple[int, npt.NDArray[np.float64]]]] = {j: [] for j in range(d)}
    for (a, b), table in edges.items():
        neighbours[a].append((b, table))
        neighbours[b].append((a, table.T))
    seen, queue = {0}, deque([0])
    while queue:
        parent = queue.popleft()
        for child, table in neighbours[parent]:  # table: parent x child
            if child in seen:
                continue
            seen.add(child)
            queue.append(child)
            for value in range(sizes[parent]):
                where = np.flatnonzero(codes[:, parent] == value)
                if where.size:
                    codes[where, child] = draw(table[value], where.size, rng)
    for j in sorted(set(range(d)) - seen):  # not on the tree (no pairs): its 1-way marginal
        codes[:, j] = rng.integers(0, sizes[j], rows)
    return codes


def fit(
    attributes: Sequence[Attribute],
    measurements: Sequence[Measurement],
    rows: int,
    *,
    iters: int = ITERATIONS,
    warm_start: Model | None = None,
) -> Model:
    """The graphical model (:mod:`.graphical`) that best explains AIM's ``measurements``,
    with the public row count as its total; ``warm_start``: the previous round's model."""
    sizes = [a.size for a in attributes]
    observations = [
        Observation(m.clique, m.noisy.reshape([sizes[j] for j in m.clique]), m.sigma)
        for m in measurements
    ]
    return fit_model(sizes, observations, float(rows), iters=iters, warm_start=warm_start)


def project(model: Model, clique: Sequence[int]) -> npt.NDArray[np.float64]:
    """The model's marginal on ``clique`` (sorted attribute indices), flattened as
    :func:`dpnode.core.synth.mst.marginal` flattens counts, scaled to the model's total.

    A clique inside one of the model's maximal cliques sums that clique's marginal; any other
    is found by variable elimination on the model's log-potentials (AIM projects every
    candidate in every round, measured or not).
    """
    tree = model.tree
    home = tree.home(clique)
    if home >= 0:
        attrs = tree.cliques[home]
        table = model.marginals[home]
        summed = table.sum(axis=tuple(i for i, v in enumerate(attrs) if v not in clique))
        kept = [v for v in attrs if v in clique]
        out: npt.NDArray[np.float64] = np.transpose(summed, [kept.index(j) for j in clique]).ravel()
        return out
    factors = list(zip(tree.cliques, model.potentials, strict=True))
    sizes = dict(enumerate(tree.sizes))
    keep = set(clique)
    while True:
        variables = {v for attrs, _ in factors for v in attrs} - keep
        if not variables:
            break

        v = min(sorted(variables), key=lambda v: _joined(factors, sizes, v))
        touching = [f for f in factors if v in f[0]]
        factors = [f for f in factors if v not in f[0]]
        attrs, values = _combine(touching, sizes)
        axis = attrs.index(v)
        top = values.max(axis=axis, keepdims=True)
        summed = np.log(np.exp(values - top).sum(axis=axis)) + np.squeeze(top, axis=axis)
        factors.append((attrs[:axis] + attrs[axis + 1 :], summed))
    attrs, values = _combine(
        [*factors, (tuple(sorted(keep)), np.zeros([sizes[j] for j in sorted(keep)]))], sizes
    )
    values = np.transpose(values, [attrs.index(j) for j in clique])
    p = np.exp(values - values.max())
    out = (p / p.sum() * float(model.total)).ravel()
    return out


def _joined(factors: Sequence[tuple[tuple[int, ...], Any]], sizes: dict[int, int], v: int) -> int:
    """The size of the factor that eliminating ``v`` makes (the greedy order's key)."""
    union = {u for attrs, _ in factors if v in attrs for u in attrs}
    return math.prod(sizes[u] for u in union)


def _combine(
    factors: Sequence[tuple[tuple[int, ...], npt.NDArray[np.float64]]], sizes: dict[int, int]
) -> tuple[tuple[int, ...], npt.NDArray[np.float64]]:
    """The sum of log-factors over the union of their attributes (sorted), by broadcasting."""
    attrs = tuple(sorted({v for a, _ in factors for v in a}))
    total = np.zeros([sizes[v] for v in attrs])
    for a, values in factors:
        order = sorted(a)
        aligned = np.transpose(values, [a.index(v) for v in order])
        shape = [sizes[v] if v in a else 1 for v in attrs]
        total = total + aligned.reshape(shape)
    return attrs, total


def model_cells(attributes: Sequence[Attribute], cliques: Sequence[Sequence[int]]) -> int:
    """Cells of the junction tree a model on ``cliques`` would have (public sizes only)."""
    return junction_tree([a.size for a in attributes], cliques).cells


def sample_model(model: Model, columns: int, rows: int, seed: int) -> npt.NDArray[np.int64]:
    """``rows`` rows of codes from the model (randomised rounding along its junction tree),
    reproducible from ``seed``. It reads the model only: post-processing."""
    codes = sample_graphical(model, rows, np.random.default_rng(seed))
    if codes.shape[1] != columns:
        raise ValueError(f"the model has {codes.shape[1]} columns, not {columns}")
    return codes

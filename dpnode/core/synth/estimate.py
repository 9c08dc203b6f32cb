"""Estimation and sampling from MST's measurements: post-processing, no private value here.

The noisy marginals go to Private-PGM (``mbi``, McKenna et al.), which fits the graphical
model that best explains them (mirror descent on the marginal polytope); the synthetic rows
are then drawn from that model along MST's tree (a root's 1-way marginal, then each
attribute given its parent in the tree), with a seeded NumPy generator so that a caller's
seed reproduces a table. ``mbi`` and JAX are imported here only, on first use: the node
starts, and every other request runs, without them.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from dpnode.core.synth.domain import Attribute
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


def _draw(weights: npt.NDArray[np.float64], count: int, rng: np.random.Generator) -> Any:
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
    codes[:, 0] = _draw(root, rows, rng)
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
                    codes[where, child] = _draw(table[value], where.size, rng)
    for j in sorted(set(range(d)) - seen):  # not on the tree (no pairs): its 1-way marginal
        codes[:, j] = rng.integers(0, sizes[j], rows)
    return codes


def _names(count: int) -> tuple[str, ...]:
    return tuple(f"c{i}" for i in range(count))


def fit(
    attributes: Sequence[Attribute],
    measurements: Sequence[Measurement],
    rows: int,
    *,
    iters: int = ITERATIONS,
    warm_start: Any = None,
) -> Any:
    """The graphical model (an ``mbi`` model) that best explains AIM's ``measurements``, with
    the public row count as its total; ``warm_start``: the previous round's model."""
    mbi = _mbi()
    from mbi.estimation import MirrorDescent

    names = _names(len(attributes))
    domain = mbi.Domain(names, tuple(a.size for a in attributes))
    linear = [
        mbi.LinearMeasurement(m.noisy, tuple(names[j] for j in m.clique), stddev=m.sigma)
        for m in measurements
    ]
    return MirrorDescent().estimate(
        domain, linear, known_total=float(rows), iters=iters, warm_start=warm_start
    )


def project(model: Any, clique: Sequence[int]) -> npt.NDArray[np.float64]:
    """The model's marginal on ``clique`` (sorted attribute indices), flattened as
    :func:`dpnode.core.synth.mst.marginal` flattens counts, scaled to the model's total.

    Computed in NumPy by variable elimination on the model's log-potentials: ``mbi``'s own
    projection compiles a JAX program per clique, which costs far more than the sums (AIM
    projects every candidate in every round).
    """
    factors = [
        (tuple(int(n[1:]) for n in cl), np.asarray(table.values, dtype=np.float64))
        for cl, table in model.potentials.tables.items()
    ]
    sizes = dict(
        zip((int(n[1:]) for n in model.domain.attributes), model.domain.shape, strict=True)
    )
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
    out: npt.NDArray[np.float64] = (p / p.sum() * float(model.total)).ravel()
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
    mbi = _mbi()
    from mbi.junction_tree import hypothetical_model_size

    names = _names(len(attributes))
    domain = mbi.Domain(names, tuple(a.size for a in attributes))
    megabytes = hypothetical_model_size(domain, [tuple(names[j] for j in c) for c in cliques])
    return round(float(megabytes) * 2**20 / 8)


#: ``mbi`` samples with NumPy's global generator: one sampling at a time, seeded, restored.
_GLOBAL_RNG = threading.Lock()


def sample_model(model: Any, columns: int, rows: int, seed: int) -> npt.NDArray[np.int64]:
    """``rows`` rows of codes from the model (``mbi``'s randomised rounding along its junction
    tree), reproducible from ``seed``. It reads the model only: post-processing."""
    with _GLOBAL_RNG:
        state = np.random.get_state()
        np.random.seed(seed % 2**32)
        try:
            table = model.synthetic_data(rows).to_dict()
        finally:
            np.random.set_state(state)
    return np.stack([np.asarray(table[n]) for n in _names(columns)], axis=1).astype(np.int64)

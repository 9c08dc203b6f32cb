"""The NumPy graphical model: belief propagation against the brute-force joint, the fit against
the noiseless marginals it should recover, and the sampler against the model's marginals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dpnode.core.synth import graphical
from dpnode.core.synth.estimate import project


def _joint(tree: graphical.Tree, potentials: list[np.ndarray], total: float) -> np.ndarray:
    """The model's joint over every attribute, by brute force."""
    log = np.zeros(tree.sizes)
    for clique, values in zip(tree.cliques, potentials, strict=True):
        log = log + values.reshape([s if j in clique else 1 for j, s in enumerate(tree.sizes)])
    p = np.exp(log - log.max())
    return p / p.sum() * total


@pytest.mark.parametrize(
    "cliques",
    [
        [(0, 1), (1, 2), (2, 3)],  # a chain
        [(0, 1), (1, 2), (0, 2), (2, 3)],  # a cycle: triangulated
        [(0, 1), (2, 3), (4,)],  # a forest
        [(0, 1, 2), (2, 3), (3, 4), (1, 4)],
    ],
)
def test_belief_propagation_gives_the_joints_marginals(cliques: list[tuple[int, ...]]) -> None:
    sizes = [2, 3, 2, 4, 3]
    tree = graphical.junction_tree(sizes, [*cliques, *((j,) for j in range(5))])
    for c in cliques:
        assert tree.home(c) >= 0
    rng = np.random.default_rng(0)
    potentials = [rng.normal(0, 2, [sizes[j] for j in c]) for c in tree.cliques]
    joint = _joint(tree, potentials, 7.0)
    got = graphical.marginals(tree, potentials, 7.0)
    for clique, table in zip(tree.cliques, got, strict=True):
        other = tuple(j for j in range(5) if j not in clique)
        np.testing.assert_allclose(table, joint.sum(axis=other), rtol=1e-9)
    model = graphical.Model(tree, tuple(potentials), tuple(got), 7.0)
    for clique in itertools.combinations(range(5), 2):  # in a maximal clique or not
        other = tuple(j for j in range(5) if j not in clique)
        np.testing.assert_allclose(project(model, clique), joint.sum(axis=other).ravel())


def test_the_fit_recovers_noiseless_marginals_of_a_tree() -> None:
    sizes = [3, 4, 2]
    rng = np.random.default_rng(1)
    truth = rng.dirichlet(np.ones(24)).reshape(sizes) * 1000
    # a tree-shaped truth: p(a, b) p(b, c) / p(b)
    ab, bc, b = truth.sum(axis=2), truth.sum(axis=0), truth.sum(axis=(0, 2))
    tree_truth = ab[:, :, None] * bc[None, :, :] / b[None, :, None]
    observations = [
        graphical.Observation((0, 1), tree_truth.sum(axis=2), 1.0),
        graphical.Observation((1, 2), tree_truth.sum(axis=0), 1.0),
    ]
    model = graphical.fit(sizes, observations, 1000.0, iters=2000)
    assert np.abs(project(model, (0, 1)) - ab.ravel()).max() < 0.05
    assert np.abs(project(model, (0, 2)) - tree_truth.sum(axis=1).ravel()).max() < 0.05
    warm = graphical.fit(sizes, observations, 1000.0, iters=10, warm_start=model)
    assert np.abs(project(warm, (1, 2)) - bc.ravel()).max() < 0.05  # starts where it was


def test_samples_follow_the_model_within_one_count_on_the_root() -> None:
    sizes = [3, 2, 4]
    rng = np.random.default_rng(2)
    tree = graphical.junction_tree(sizes, [(0, 1), (1, 2)])
    potentials = [rng.normal(0, 1, [sizes[j] for j in c]) for c in tree.cliques]
    model = graphical.Model(
        tree, tuple(potentials), tuple(graphical.marginals(tree, potentials, 500.0)), 500.0
    )
    codes = graphical.sample(model, 500, np.random.default_rng(3))
    assert np.array_equal(codes, graphical.sample(model, 500, np.random.default_rng(3)))
    for clique in tree.cliques:
        counts = np.zeros([sizes[j] for j in clique])
        np.add.at(counts, tuple(codes[:, list(clique)].T), 1)
        limit = 1.0 if tree.parents[tree.cliques.index(clique)] < 0 else 4.0
        assert np.abs(counts.ravel() - project(model, clique)).max() <= limit

"""Histograms over several keys, combined codes and cast columns: the node's ``/sensitivity``
answers a partition's figures (L1 2, L2 sqrt 2 per row of a subject), and they hold.

Each form is ordinary torch code on a census-like dataset; the node must see that a row
falls in one cell whichever way the cell is computed (``histogramdd``, summed one-hot
outer products, comparisons multiplied, ``histc`` of a combined code, ``histc`` after a
cast). The figures are then attacked: the same graphs, evaluated by the node's engine on
random small datasets and on neighbours with one subject's rows replaced at the bounds,
on bin edges and across keys, never move by more than what the node charged.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode import sdk
from dpnode.core.privacy import InputSpec, track
from dpnode.sdk._remote import graph_for, remote_input
from tests.privacy.helpers import assert_sound

BOUNDS = {
    "age": (17, 90),
    "hours": (1, 99),
    "capital": (0, 100_000),
    "income": (0.0, 200_000.0),
    "bmi": (10.0, 70.0),
    "education": (0, 7),
    "sex": (0, 1),
}
DTYPES = {"income": np.float64, "bmi": np.float32}

Columns = dict[str, torch.Tensor]


def census(n: int, seed: int, subjects: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    data: dict[str, np.ndarray] = {}
    for name, (lo, hi) in BOUNDS.items():
        if name in DTYPES:
            data[name] = rng.uniform(lo, hi, n).astype(DTYPES[name])
        else:
            data[name] = rng.integers(lo, hi + 1, n)
    if subjects:  # households of one to three people
        data["household"] = np.repeat(np.arange(n), rng.integers(1, 4, n))[:n]
    return data


FORMS: dict[str, Callable[[Columns], torch.Tensor]] = {
    "histogramdd of two keys": lambda c: (
        torch.histogramdd(
            torch.stack([c["education"], c["sex"]], 1).float(),
            bins=[8, 2],
            range=[-0.5, 7.5, -0.5, 1.5],
        ).hist
    ),
    "histogramdd of three keys": lambda c: (
        torch.histogramdd(
            torch.stack([c["education"], c["sex"], c["age"]], 1).float(),
            bins=[8, 2, 5],
            range=[-0.5, 7.5, -0.5, 1.5, 17.0, 90.0],
        ).hist
    ),
    "summed one-hot outer product": lambda c: (
        F.one_hot(c["education"], 8)[:, :, None] * F.one_hot(c["sex"], 2)[:, None, :]
    ).sum(0),
    "comparisons multiplied": lambda c: (
        (c["education"].unsqueeze(-1) == torch.arange(8)).float()[:, :, None]
        * (c["sex"].unsqueeze(-1) == torch.arange(2)).float()[:, None, :]
    ).sum(0),
    "histc of a combined code": lambda c: torch.histc(
        (c["education"] * 2 + c["sex"]).float(), bins=16, min=-0.5, max=15.5
    ),
    "float64 cast to float32, then histc": lambda c: c["income"].float().histc(10, 0, 200_000),
    "small int cast to float, then histc": lambda c: c["hours"].float().histc(10, 1, 99),
    "wide int cast to float, then histc": lambda c: c["capital"].float().histc(20, 0, 100_000),
    "float32 cast to float64, then histc": lambda c: c["bmi"].double().histc(12, 10, 70),
    "cast column in ranges": lambda c: (
        (c["income"].float()[:, None] >= torch.linspace(0, 2e5, 11)[:-1])
        & (c["income"].float()[:, None] < torch.linspace(0, 2e5, 11)[1:])
    ).sum(0),
    "one-hot of a thousand cells": lambda c: F.one_hot(c["capital"] // 100, 1001).sum(0),
}


@pytest.fixture
def columns(owner_client: sdk.Client, ds_client: sdk.Client, sqlite_only: None) -> Columns:
    owner_client.upload_dataset("census", census(300, 0), tags=["census"], bounds=BOUNDS)
    ds = ds_client.dataset("census")
    return {name: ds[name] for name in BOUNDS}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_sensitivity_route_answers_a_partitions_figures(columns: Columns, form: str) -> None:
    s = FORMS[form](columns).sensitivity()
    assert s.l1 == pytest.approx(2.0, rel=1e-6) and s.l2 == pytest.approx(math.sqrt(2), rel=1e-6)


def test_a_subjects_rows_multiply_the_figures(
    owner_client: sdk.Client, ds_client: sdk.Client, sqlite_only: None
) -> None:
    data = census(300, 1, subjects=True)
    most = int(np.bincount(data["household"]).max())
    owner_client.upload_dataset(
        "households", data, tags=["census"], bounds=BOUNDS, subject_id="household"
    )
    ds = ds_client.dataset("households")
    cols = {name: ds[name] for name in BOUNDS}
    for form in (
        "histogramdd of two keys",
        "summed one-hot outer product",
        "histc of a combined code",
    ):
        s = FORMS[form](cols).sensitivity()
        assert s.l1 == pytest.approx(2.0 * most, rel=1e-6), form
        assert s.l2 == pytest.approx(math.sqrt(2) * most, rel=1e-6), form
    released = FORMS["histogramdd of two keys"](cols).publish(epsilon=1.0)
    assert released.shape == (8, 2)


def test_a_weighted_count_with_private_weights_is_charged_its_weights(columns: Columns) -> None:
    # each row carries up to 200,000 into its cell: a partition of weights, not of counts
    hot = F.one_hot(columns["education"], 8).double()
    s = (hot * columns["income"][:, None]).sum(0).sensitivity()
    assert s.l1 == pytest.approx(2 * 200_000.0, rel=1e-6)
    # two histograms of one row added: no partition (a row moves four counts)
    both = F.one_hot(columns["education"], 8) + F.one_hot(columns["sex"] * 7, 8)
    assert both.sum(0).sensitivity().l1 >= 4.0


# -- attack: the same graphs, evaluated on neighbouring datasets -----------------------------

_MOST = 3


def _specs(subjects: np.ndarray) -> dict[str, InputSpec]:
    return {f"c/{n}": InputSpec.private(lo, hi, subjects) for n, (lo, hi) in BOUNDS.items()}


def _edge_values(name: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """Values at the bounds, on and beside bin edges, and anywhere in between."""
    lo, hi = BOUNDS[name]
    if name not in DTYPES:
        picks = np.array([lo, hi, lo + 1, hi - 1, (lo + hi) // 2, 2 * (hi // 2)])
        return np.where(rng.random(n) < 0.5, rng.choice(picks, n), rng.integers(lo, hi + 1, n))
    dt = DTYPES[name]
    edges = np.linspace(lo, hi, 13)
    near = np.concatenate([edges, np.nextafter(edges, np.inf), np.nextafter(edges, -np.inf)])
    near = np.concatenate([near, near.astype(np.float32).astype(np.float64)])
    v = np.where(rng.random(n) < 0.6, rng.choice(near, n), rng.uniform(lo, hi, n))
    return np.clip(v, lo, hi).astype(dt)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    form=st.sampled_from(sorted(FORMS)),
    n=st.integers(2, 9),
    seed=st.integers(0, 2**32 - 1),
    grouped=st.booleans(),
)
def test_no_neighbour_moves_a_histogram_beyond_its_charge(
    form: str, n: int, seed: int, grouped: bool
) -> None:
    rng = np.random.default_rng(seed)
    subjects = np.sort(rng.integers(0, max(n // _MOST, 1) + 1, n)) if grouped else np.arange(n)
    subjects = np.unique(subjects, return_inverse=True)[1].astype(np.int64)
    torch_dtypes = {"income": torch.float64, "bmi": torch.float32}
    cols = {k: remote_input(f"c/{k}", (n,), torch_dtypes.get(k, torch.int64)) for k in BOUNDS}
    graph = graph_for([FORMS[form](cols)])
    report = track(graph, _specs(subjects))
    used = [name.removeprefix("c/") for name in graph.input_names()]
    for _ in range(6):
        d1 = {f"c/{k}": _edge_values(k, rng, n) for k in used}
        d2 = {k: v.copy() for k, v in d1.items()}
        rows = subjects == rng.integers(0, subjects.max() + 1)
        for k in used:
            d2[f"c/{k}"][rows] = _edge_values(k, rng, n)[rows]
        assert_sound(graph, report, d1, d2)

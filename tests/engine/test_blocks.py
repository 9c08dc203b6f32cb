"""Block evaluation: the same values as the whole-array evaluation, from the plan alone."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from dpnode.core.engine import GraphBuilder, plan, run
from dpnode.core.engine.accurate import BLOCK, depth
from dpnode.core.engine.blocks import schedule
from dpnode.core.privacy import InputSpec, Subjects, track
from dpnode.sdk._remote import graph_for, remote_input

#: three whole blocks of 4096 rows and an odd tail, so every sum spans blocks
N = 3 * 4096 + 2 * BLOCK + 7
SMALL = 4096  # elements per block in these tests (the node's default is 2^20)

Graphs = Callable[[dict[str, Any]], Any]

ONE_D: dict[str, Graphs] = {
    "mean": lambda t: t["x"].mean(),
    "float mean": lambda t: t["x"].float().mean(),
    "sum": lambda t: t["x"].sum(),
    "int sum": lambda t: t["i"].sum(),
    "count": lambda t: (t["x"] > 0.5).sum(),
    "var": lambda t: t["x"].var(),
    "float32 std": lambda t: t["y"].std(),
    "nanmean": lambda t: t["x"].nanmean(),
    "mean of a product": lambda t: (t["x"] * t["y"]).mean(),
    "sum of squares": lambda t: (t["x"] ** 2).sum(),
    "int mean": lambda t: t["i"].float().mean(),
    "mean over dim 0, kept": lambda t: t["x"].mean(0, keepdim=True),
    "several outputs": lambda t: [t["x"].mean(), (t["y"].clamp(0, 0.5) + 1).sum()],
    "sums combined": lambda t: (t["x"].mean() + t["y"].sum()) / t["i"].sum(),
    # values moved within each row: columns joined (as ds.tensors(["x", "y"]) does),
    # reshaped, picked
    "columns joined": lambda t: torch.cat(
        [t["x"].reshape(-1, 1), t["y"].double().unsqueeze(1)], 1
    ).mean(0),
    "one column stacked": lambda t: torch.cat([t["x"].reshape(-1, 1)], 1).mean(),
    "a column of a matrix": lambda t: t["X"][:, 0].mean(),
    "a matrix reshaped": lambda t: (t["X"].reshape(N, 3, 1).squeeze(2) ** 2).sum(0),
    # products over the rows: a regression's sufficient statistics (sdk.linear_regression)
    "normal equations": lambda t: [
        t["X"].T @ t["X"],
        t["X"].sum(0),
        t["X"].T @ t["y"].double(),
        t["y"].double().sum(),
    ],
    "a product of computed rows": lambda t: (t["X"] * 2).T @ (t["X"] - t["x"].unsqueeze(1)),
    "a product in float32": lambda t: t["X"].float().T @ t["y"],
    "a covariance (two passes)": lambda t: (t["X"] - t["X"].mean(0)).T @ (t["X"] - t["X"].mean(0)),
}


def _inputs(rng: np.random.Generator) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "x": rng.uniform(0, 1, N),
        "y": rng.uniform(-1, 1, N).astype(np.float32),
        "i": rng.integers(-5, 6, N),
        "X": rng.uniform(-1, 1, (N, 3)),
    }


def _remote(values: dict[str, np.ndarray[Any, Any]]) -> dict[str, Any]:
    dtypes = {"float64": torch.float64, "float32": torch.float32, "int64": torch.int64}
    return {k: remote_input(k, v.shape, dtypes[v.dtype.name]) for k, v in values.items()}


def _both(
    build: Graphs, values: dict[str, np.ndarray[Any, Any]]
) -> tuple[Any, list[Any], list[Any]]:
    """The plan of the graph, its outputs evaluated whole and over blocks."""
    out = build(_remote(values))
    graph = graph_for(out if isinstance(out, list) else [out])
    planned = plan(graph, accurate=True)
    inputs = {k: values[k] for k in graph.input_names()}
    whole = run(planned, inputs, block_elements=None).outputs
    blocks = run(planned, inputs, block_elements=SMALL).outputs
    return planned, whole, blocks


@pytest.mark.parametrize("name", list(ONE_D))
def test_blocks_give_the_whole_arrays_bits(name: str, rng: np.random.Generator) -> None:
    values = _inputs(rng)
    planned, whole, blocks = _both(ONE_D[name], values)
    assert planned.blocks is not None and planned.blocks.block_rows(SMALL) < N
    for w, b in zip(whole, blocks, strict=True):
        assert (w.dtype, w.shape) == (b.dtype, b.shape)
        assert w.tobytes() == b.tobytes(), (w, b)


def test_nan_propagates_as_in_the_whole_array(rng: np.random.Generator) -> None:
    values = _inputs(rng)
    x = values["x"].copy()
    x[[5, N - 1]] = np.nan  # one in the first block, one in the tail
    values["x"] = x
    for build in (ONE_D["mean"], ONE_D["var"], ONE_D["nanmean"], ONE_D["count"]):
        _, whole, blocks = _both(build, values)
        assert whole[0].tobytes() == blocks[0].tobytes()
    _, whole, _ = _both(ONE_D["mean"], values)
    assert np.isnan(whole[0])


@pytest.mark.parametrize(
    "build",
    [
        lambda t: t["X"].mean(0),
        lambda t: t["X"].sum(),
        lambda t: t["X"].var(0),
        lambda t: (t["X"] * torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)).sum((0, 1)),
    ],
)
def test_sums_over_several_axes_stay_within_the_charged_bound(
    build: Graphs, rng: np.random.Generator
) -> None:
    values = _inputs(rng)
    planned, whole, blocks = _both(build, values)
    assert planned.blocks is not None
    # any order of the same blocked additions is within gamma(depth(n)) * sum|x| of exact;
    # both are, so they are within twice that of each other (|x| <= 3 here, n <= 3N terms)
    n = 3 * N
    bound = 2 * depth(n) * 2.0**-53 / (1 - depth(n) * 2.0**-53) * 3 * n
    np.testing.assert_allclose(whole[0], blocks[0], rtol=0, atol=bound)


FALLBACK: dict[str, Graphs] = {
    "a matrix product": lambda t: (t["X"] @ torch.ones(3, dtype=torch.float64)).mean(),
    "a row value released": lambda t: t["x"] * 2,
    "a cumulative sum": lambda t: t["x"].cumsum(0).sum(),
    "a maximum": lambda t: t["x"].amax(),
    "a sum keeping the rows": lambda t: t["X"].sum(1).mean(),
    "a sum over the rows last": lambda t: t["X"].sum((1, 0)),
    "rows turned, then summed": lambda t: t["X"].T.sum(1),
    "rows sliced": lambda t: t["x"][1:].mean(),
    "rows joined": lambda t: torch.cat([t["x"], t["x"]]).mean(),
}


@pytest.mark.parametrize("name", list(FALLBACK))
def test_other_graphs_are_evaluated_whole(name: str, rng: np.random.Generator) -> None:
    values = _inputs(rng)
    planned, whole, blocks = _both(FALLBACK[name], values)
    assert planned.blocks is None
    for w, b in zip(whole, blocks, strict=True):
        assert w.tobytes() == b.tobytes()


def test_only_tracked_plans_with_many_rows_are_scheduled(rng: np.random.Generator) -> None:
    values = _inputs(rng)
    graph = graph_for([_remote(values)["x"].mean()])
    assert plan(graph).blocks is None  # not accurate: torch's float32 sums, not blocked ones
    short = graph_for([remote_input("x", (BLOCK,), torch.float64).mean()])
    assert plan(short, accurate=True).blocks is None
    planned = plan(graph, accurate=True)
    again = schedule(planned.graph, planned.metas, planned.calls, planned.live)
    assert again == planned.blocks


def test_the_tracked_sensitivity_does_not_depend_on_blocks(rng: np.random.Generator) -> None:
    values = _inputs(rng)
    for build in (ONE_D["var"], ONE_D["count"], ONE_D["float mean"]):
        out = build(_remote(values))
        graph = graph_for([out])
        planned = plan(graph, accurate=True)
        specs = {k: InputSpec.private(-5.0, 5.0, Subjects.identity(N)) for k in graph.input_names()}
        with_blocks = track(planned, specs)
        without = track(dataclasses.replace(planned, blocks=None), specs)
        assert planned.blocks is not None
        assert with_blocks.l1 == without.l1 and with_blocks.l2 == without.l2
        for a, b in zip(with_blocks.outputs, without.outputs, strict=True):
            assert a == b


def test_blocks_read_a_mapped_column_in_pieces(tmp_path: Any, rng: np.random.Generator) -> None:
    """Evaluated over a memory map, the result is the in-memory one's."""
    x = rng.uniform(0, 1, N)
    path = tmp_path / "x"
    x.tofile(path)
    mapped = np.memmap(path, dtype=np.float64, mode="r", shape=(N,))
    graph = graph_for([remote_input("x", (N,), torch.float64).float().mean()])
    planned = plan(graph, accurate=True)
    a = run(planned, {"x": mapped}, block_elements=SMALL).outputs[0]
    b = run(planned, {"x": x}, block_elements=None).outputs[0]
    assert a.tobytes() == b.tobytes()
    assert math.isclose(float(a), float(x.mean()), rel_tol=1e-6)


def test_a_product_over_the_rows_is_scheduled_whatever_its_permute_says(
    rng: np.random.Generator,
) -> None:
    """``x.T`` written with negative dims (a client's frame, not the SDK's) is the same."""
    values = _inputs(rng)
    for dims in ((1, 0), (-1, 0), (-1, -2)):
        b = GraphBuilder()
        x = b.input("X", "float64", (N, 3))
        graph = b.build([b.op("matmul", b.op("permute", x, dims=dims), x)])
        planned = plan(graph, accurate=True)
        assert planned.blocks is not None, dims
        whole = run(planned, {"X": values["X"]}, block_elements=None).outputs[0]
        blocks = run(planned, {"X": values["X"]}, block_elements=SMALL).outputs[0]
        assert whole.tobytes() == blocks.tobytes()

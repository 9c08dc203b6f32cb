"""``plan(..., accurate=True)``: float sums and long contractions accumulate in float64.

Tracked evaluations (publish, sensitivity, mock mode) run this way so that the rounding
the privacy tracker charges for stays near one ulp of the result; results keep torch's
dtype and shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from dpnode.core.engine import GraphBuilder, plan, run
from dpnode.core.engine.prims.linalg import WIDEN_MIN_K

Array = npt.NDArray[Any]


def _run(op: str, shapes: list[tuple[int, ...]], accurate: bool) -> tuple[Array, list[Array]]:
    """The engine's float32 result, and the float64 copies of its random inputs."""
    rng = np.random.default_rng(3)
    b = GraphBuilder()
    refs = [b.input(f"a{i}", "float32", s) for i, s in enumerate(shapes)]
    data = {f"a{i}": rng.uniform(0, 1, s).astype(np.float32) for i, s in enumerate(shapes)}
    out = run(plan(b.build([b.op(op, *refs)]), accurate=accurate), data).outputs[0]
    return out, [v.astype(np.float64) for v in data.values()]


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_float32_reductions_round_once(op: str) -> None:
    out, (x,) = _run(op, [(300_000,)], accurate=True)
    ref = np.sum(x) if op == "sum" else np.mean(x)
    assert out.dtype == np.float32
    assert out == ref.astype(np.float32)  # float64 accumulation, one rounding at the end


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((5, 3000), (3000,)),
        ((3000,), (3000, 4)),
        ((3000,), (3000,)),
        ((2, 5, 3000), (3000, 3)),
        ((70_000,), (70_000, 2)),
    ],
)
def test_float32_contractions_round_once(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    out, (x, y) = _run("matmul", [a, b], accurate=True)
    plain, _ = _run("matmul", [a, b], accurate=False)
    ref = np.matmul(x, y)
    assert out.shape == plain.shape == ref.shape and out.dtype == plain.dtype == np.float32
    np.testing.assert_array_equal(out, ref.astype(np.float32))


def test_short_contractions_keep_the_dtype() -> None:
    k = WIDEN_MIN_K - 1
    out, _ = _run("matmul", [(4, k), (k, 2)], accurate=True)
    plain, _ = _run("matmul", [(4, k), (k, 2)], accurate=False)
    np.testing.assert_array_equal(out, plain)  # the same float32 product as torch's


def test_plain_runs_keep_torch_accumulation() -> None:
    # without accurate, a float32 sum accumulates in float32 (NumPy's pairwise sum)
    out, (x,) = _run("sum", [(300_000,)], accurate=False)
    assert out == np.sum(x.astype(np.float32), dtype=np.float32)

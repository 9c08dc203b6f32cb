"""Property tests: random shapes, dtypes and operand kinds against torch.

The matrix test covers every dtype cell on tiny operands; these draw
broadcasting shapes, values (including negative numbers, zeros and NaN) and
chains of ops, and require identical shapes and dtypes and close values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpnode.core.engine import GraphBuilder, evaluate
from dpnode.core.errors import DPNodeError
from tests.engine.decomp import NAME_TO_TORCH, TORCH_TO_NAME, to_numpy, to_torch

DTYPES = ["bool", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
OPS = {
    "add": torch.add,
    "mul": torch.mul,
    "div": torch.true_divide,
    "maximum": torch.maximum,
    "lt": torch.lt,
    "atan2": torch.atan2,
    "remainder": torch.remainder,
}
UNARY = {
    "exp": torch.exp,
    "abs": torch.abs,
    "sqrt": torch.sqrt,
    "floor": torch.floor,
    "neg": torch.neg,
}
TOL = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-5, "float64": 1e-7}


@st.composite
def broadcast_pair(draw: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    ndim = draw(st.integers(0, 3))
    out = [draw(st.integers(1, 4)) for _ in range(ndim)]
    a = [s if draw(st.booleans()) else 1 for s in out]
    b = [s if draw(st.booleans()) else 1 for s in out]
    return tuple(a[draw(st.integers(0, ndim)) :]), tuple(b)


def _tensor(draw: Any, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    n = int(np.prod(shape))
    vals = draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n))
    t = torch.tensor(vals, dtype=torch.float64).reshape(shape)
    if dtype == "uint8":
        t = t.abs()
    if dtype.startswith("float") and n and draw(st.booleans()):
        t.view(-1)[0] = float("nan")
    return t.to(NAME_TO_TORCH[dtype])


def _close(got: np.ndarray[Any, Any], want: torch.Tensor) -> None:
    name = TORCH_TO_NAME[want.dtype]
    assert got.dtype.name == name or (name == "bfloat16" and got.dtype.name == "bfloat16")
    assert tuple(got.shape) == tuple(want.shape)
    tol = TOL.get(name, 0.0)
    torch.testing.assert_close(to_torch(got), want, rtol=tol, atol=tol, equal_nan=True)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_binary_ops_match_torch(data: Any) -> None:
    op = data.draw(st.sampled_from(sorted(OPS)))
    da, db = data.draw(st.sampled_from(DTYPES)), data.draw(st.sampled_from(DTYPES))
    sa, sb = data.draw(broadcast_pair())
    a = _tensor(data.draw, da, sa)
    scalar = data.draw(st.sampled_from([None, 2, -3, 0.5, True]))
    b: Any = _tensor(data.draw, db, sb) if scalar is None else scalar
    try:
        want: torch.Tensor | None = OPS[op](a, b)
    except TypeError:
        return  # no such call form in torch (atan2 takes no scalar)
    except (RuntimeError, NotImplementedError):
        want = None
    g = GraphBuilder()
    xa = g.input("a", TORCH_TO_NAME[a.dtype], tuple(a.shape))
    feed = {"a": to_numpy(a)}
    if isinstance(b, torch.Tensor):
        xb: Any = g.input("b", TORCH_TO_NAME[b.dtype], tuple(b.shape))
        feed["b"] = to_numpy(b)
    else:
        xb = b
    graph = g.build([g.op(op, xa, xb)])
    if want is None:
        try:
            evaluate(graph, feed)  # value-dependent refusals (x % 0) surface here
        except DPNodeError:
            return
        raise AssertionError(f"torch refuses {op}({a.dtype}, {b!r}) but the engine accepts it")
    _close(evaluate(graph, feed)[0], want)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_unary_chains_match_torch(data: Any) -> None:
    d = data.draw(st.sampled_from(["int64", "float16", "bfloat16", "float32", "float64"]))
    shape = tuple(data.draw(st.lists(st.integers(1, 4), max_size=3)))
    chain = data.draw(st.lists(st.sampled_from(sorted(UNARY)), min_size=1, max_size=4))
    x = _tensor(data.draw, d, shape)
    g = GraphBuilder()
    ref: Any = g.input("x", d, shape)
    want = x
    try:
        for name in chain:
            want = UNARY[name](want)
    except (RuntimeError, NotImplementedError):
        return
    for name in chain:
        ref = g.op(name, ref)
    _close(evaluate(g.build([ref]), {"x": to_numpy(x)})[0], want)

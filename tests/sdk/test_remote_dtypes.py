"""Client-side shape/dtype propagation (torch's meta tensors) agrees with the node's inference.

For random ops, dtypes, shapes and scalar operands, the RemoteTensor's shape
and dtype (what torch says) must equal what ``dpnode.core.engine.infer`` derives from
the recorded graph, and evaluating the graph must give torch's values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.engine import infer
from dpnode.sdk._remote import evaluate, graph_for, remote_input
from dpnode.sdk._remote.graph import TORCH_OF

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
]
SHAPES = [(), (3,), (2, 3), (1, 3)]

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "maximum": torch.maximum,
    "lt": lambda a, b: a < b,
    "where": lambda a, b: torch.where(a > 0, a, b),
    "pow": lambda a, b: torch.pow(a, 2),
    "sub": lambda a, b: a - b,
    "zeta": torch.special.zeta,
    "gcd": torch.gcd,
    "chebyshev_t": torch.special.chebyshev_polynomial_t,
}
UNARY: dict[str, Callable[[Any], Any]] = {
    "exp": torch.exp,
    "neg": torch.neg,
    "sum": torch.sum,
    "mean0": lambda a: a.float().mean(0) if a.dim() else a.float(),
    "cumsum": lambda a: a.cumsum(0) if a.dim() else a,
    "sigmoid": torch.sigmoid,
    "abs": torch.abs,
    "to_int": lambda a: a.to(torch.int32),
    "lgamma": torch.lgamma,
    "i0": torch.i0,
    "erfcx": torch.special.erfcx,
    "cummax": lambda a: a.cummax(0).values if a.dim() else a,
    "sort": lambda a: a.sort(-1).values if a.dim() else a,
}


def _value(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 3).to(dtype)
    return torch.randint(0, 5, shape, generator=g).to(dtype)


operand = st.one_of(
    st.tuples(st.sampled_from(DTYPES), st.sampled_from(SHAPES)),
    st.sampled_from([2, -3, 1.5, True]),
)


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(sorted(BINARY)),
    a=st.tuples(st.sampled_from(DTYPES), st.sampled_from(SHAPES)),
    b=operand,
)
def test_binary_ops_agree_with_the_engine_and_torch(name: str, a: Any, b: Any) -> None:
    fn = BINARY[name]
    av = _value(*a, seed=1)
    bv = _value(*b, seed=2) if isinstance(b, tuple) else b
    try:
        expected = fn(av, bv)
    except (RuntimeError, TypeError):
        return  # torch refuses (e.g. bool subtraction); the remote call raises the same error
    ar = remote_input("a", a[1], a[0])
    br = remote_input("b", b[1], b[0]) if isinstance(b, tuple) else b
    r = fn(ar, br)
    (meta,) = infer(graph_for([r]))
    assert (
        (meta.shape, TORCH_OF[meta.dtype.name])
        == (tuple(r.shape), r.dtype)
        == (tuple(expected.shape), expected.dtype)
    )
    feed = {"a": av.numpy()} | ({"b": bv.numpy()} if isinstance(b, tuple) else {})
    (got,) = evaluate([r], feed)
    torch.testing.assert_close(
        got,
        expected,
        equal_nan=True,
        rtol=2e-3 if expected.dtype == torch.float16 else None,
        atol=1e-3 if expected.dtype == torch.float16 else None,
    )


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from(sorted(UNARY)),
    a=st.tuples(st.sampled_from(DTYPES), st.sampled_from(SHAPES)),
)
def test_unary_ops_agree_with_the_engine_and_torch(name: str, a: Any) -> None:
    fn = UNARY[name]
    av = _value(*a, seed=3)
    try:
        expected = fn(av)
    except (RuntimeError, TypeError):
        return
    r = fn(remote_input("a", a[1], a[0]))
    (meta,) = infer(graph_for([r]))
    assert (
        (meta.shape, TORCH_OF[meta.dtype.name])
        == (tuple(r.shape), r.dtype)
        == (tuple(expected.shape), expected.dtype)
    )
    (got,) = evaluate([r], {"a": av.numpy()})
    torch.testing.assert_close(
        got,
        expected,
        equal_nan=True,
        rtol=2e-3 if expected.dtype == torch.float16 else None,
        atol=1e-3 if expected.dtype == torch.float16 else None,
    )


def test_bfloat16_local_tensors_travel_with_their_exact_values() -> None:
    """torch has no NumPy view of bfloat16; a local bfloat16 tensor (a bfloat16 model's
    weights) still travels as a constant, bit for bit."""
    w = torch.tensor([1.5, -2.25, 1 / 3, 3.0e38, 2.0**-120, -0.0], dtype=torch.bfloat16)
    a = remote_input("a", (6,), torch.bfloat16)
    r = a * w + w
    assert r.dtype == torch.bfloat16
    av = torch.tensor([0.5, 7.0, 3.0, 1.0, 1.0, 2.0], dtype=torch.bfloat16)
    (got,) = evaluate([r], {"a": av.float().numpy().astype(ml_dtypes.bfloat16)})
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), (av * w + w).view(torch.int16))

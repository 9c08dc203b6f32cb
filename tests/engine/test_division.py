"""The engine's rounding divisions and remainders are NumPy's, bit for bit (signed zeros
included), on the values they compute in constant time and on the values they leave to
NumPy (their time: ``python -m bench.side_channels --kernels``)."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.engine import GraphBuilder, division, evaluate

OPS = ("floor_divide", "remainder", "fmod")
INTS = [np.int64, np.int32, np.int16, np.int8, np.uint8]


def _bits(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x).tobytes()


def _same(op: str, a: np.ndarray, b: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        want = getattr(np, op)(a, b)
        got = getattr(division, op)(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = np.nonzero(got != want)
    assert _bits(got) == _bits(want), (op, a[bad][:3] if a.ndim else a, b, want[bad][:3])


def _dividends(rng: np.random.Generator, v: float, dtype: type, n: int = 4000) -> np.ndarray:
    """Dividends below the cap: uniform quotients at every scale, exact multiples and their
    neighbours (where a rounded quotient lands on an integer), and both zeros."""
    cap = division.MAX_QUOTIENT[np.dtype(dtype).itemsize]
    scale = 2.0 ** rng.uniform(-12, np.log2(cap), n)
    x = (rng.uniform(-1, 1, n) * scale * abs(v)).astype(dtype)
    k = (rng.integers(-3000, 3000, n // 4) * np.asarray(v, dtype)).astype(dtype)
    near = [np.nextafter(k, dtype(np.inf)), np.nextafter(k, dtype(-np.inf))]
    x = np.concatenate([x, k, *near, np.array([0.0, -0.0], dtype)])
    return x[np.abs(x.astype(np.float64)) < cap * abs(v)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("op", OPS)
def test_floats_below_the_cap_are_numpys_bit_for_bit(op: str, dtype: type) -> None:
    rng = np.random.default_rng(7)
    divisors = [1.0, -1.0, 0.1, -0.1, 3.0, 10.0, 1e-3, 7.5, 2.0**-20, 2.0**-890, 2.0**890]
    divisors += list(rng.uniform(0.5, 2, 40) * 2.0 ** rng.uniform(-60, 60, 40))
    lo, hi = division.DIVISOR_RANGE
    for i, v in enumerate(divisors):
        with np.errstate(over="ignore"):
            v = float(np.asarray(v * (-1) ** i, dtype))
        if not lo <= abs(v) <= hi:  # 2^-890 is 0 in float32, 2^890 infinite
            continue
        a = _dividends(rng, v, dtype)
        assert division.fits(a, np.asarray(v, dtype))
        _same(op, a, np.asarray(v, dtype))
        _same(op, a, np.full(a.shape, v, dtype))  # a tensor of divisors


@settings(max_examples=300, deadline=None)
@given(
    a=hnp.arrays(np.float64, 6, elements=st.floats(allow_nan=True, allow_infinity=True)),
    b=st.floats(allow_nan=True, allow_infinity=True),
    op=st.sampled_from(OPS),
)
def test_any_float_gives_numpys_answer(a: np.ndarray, b: float, op: str) -> None:
    # infinities, NaN, zero divisors and quotients beyond the cap are NumPy's own kernels
    _same(op, a, np.asarray(b))


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", OPS)
def test_integers_are_numpys_bit_for_bit(op: str, dtype: type) -> None:
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    extremes = np.array([info.min, info.min + 1, info.max, 0, 1, info.min // 2], dtype)
    for _ in range(40):
        a = np.concatenate([rng.integers(info.min, info.max, 500, endpoint=True), extremes])
        a = a.astype(dtype)
        # a tensor of divisors (negative ones, -1 under the minimum), and scalars
        b = rng.integers(info.min, info.max, a.shape, endpoint=True).astype(dtype)
        b[b == 0] = 1
        b[: len(extremes)] = -1 if info.min < 0 else 1
        _same(op, a, b)
        _same(op, a, np.asarray(rng.integers(1, 60), dtype))
        if info.min < 0:
            _same(op, a, np.asarray(-rng.integers(1, 60), dtype))


@pytest.mark.parametrize("op", OPS)
def test_integers_by_zero_give_numpys_zero(op: str) -> None:
    a = np.array([-7, 0, 7, np.iinfo(np.int64).min], np.int64)
    _same(op, a, np.asarray(0, np.int64))
    _same(op, a, np.array([0, 3, 0, -1], np.int64))


def test_the_prims_compute_through_them_in_every_dtype() -> None:
    rng = np.random.default_rng(3)
    x = rng.uniform(-50, 50, 200)
    b = GraphBuilder()
    xi = b.input("x", "float64", (200,))
    x32 = b.op("convert_element_type", xi, dtype="float32")
    x16 = b.op("convert_element_type", xi, dtype="float16")
    outs = [b.op(op, t, -0.75) for op in OPS for t in (xi, x32, x16)]
    outs.append(b.op("trunc_divide", b.op("convert_element_type", xi, dtype="int64"), -3))
    got = evaluate(b.build(outs), {"x": x})
    wants = []
    for op in OPS:
        wants.append(getattr(np, op)(x, -0.75))
        wants.append(getattr(np, op)(x.astype(np.float32), np.float32(-0.75)))
        # float16 computes in float32 and rounds once, as torch does
        wants.append(getattr(np, op)(x.astype(np.float16).astype(np.float32), np.float32(-0.75)))
    xi64 = x.astype(np.int64)
    wants.append((np.sign(xi64) * (np.abs(xi64) // 3) * -1).astype(np.int64))
    for g, w in zip(got, wants, strict=True):
        assert _bits(np.asarray(g)) == _bits(np.asarray(w).astype(np.asarray(g).dtype))

"""The engine's own sin, cos and hypot (one time for any argument in range, ``python -m
bench.side_channels --kernels``) are within 2 units in the last place of the exact values,
checked against 300-bit arithmetic, where the tracker allows a library function
``LIBM_ULPS``; NumPy's own answer the rest."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from dpnode.core.engine import GraphBuilder, evaluate
from dpnode.core.engine.flat_math import cos, hypot, sin
from dpnode.core.engine.subnormals import flushing
from dpnode.core.privacy.rounding import LIBM_ULPS

TINY = np.finfo(np.float64).tiny


def _ulps(got: float, exact: mpmath.mpf) -> float:
    e = abs(float(exact))
    if e < TINY:  # flushed: off by at most the smallest normal float
        return 0.0 if abs(got) <= TINY else math.inf
    return abs(float((mpmath.mpf(got) - exact) / mpmath.mpf(float(np.spacing(e)))))


def _arguments() -> np.ndarray:
    rng = np.random.default_rng(4)
    with mpmath.workdps(60):
        # the doubles nearest the multiples of pi/2, and their neighbours: the reduced
        # argument is smallest there, and any error in it is largest relative to it
        k = np.concatenate([np.arange(-400, 401), rng.integers(-333_000, 333_000, 400)])
        near = np.array([float(mpmath.mpf(int(j)) * mpmath.pi / 2) for j in k])
    return np.concatenate(
        [
            rng.uniform(-512, 512, 1500),
            rng.uniform(-(2.0**19), 2.0**19, 500),
            rng.uniform(-1, 1, 500) * 10.0 ** rng.uniform(-300, 0, 500),
            near,
            np.nextafter(near, np.inf),
            np.nextafter(near, -np.inf),
            [0.0, 2.0**19, -(2.0**19), math.pi, -math.pi / 4],
        ]
    )


@pytest.mark.parametrize(
    ("name", "ours", "exact"), [("sin", sin, mpmath.sin), ("cos", cos, mpmath.cos)]
)
def test_sin_and_cos_are_within_two_ulps(name: str, ours: object, exact: object) -> None:
    x = _arguments()
    with flushing():
        got = ours(x)  # type: ignore[operator]
    with mpmath.workprec(300):
        worst = max(
            _ulps(float(g), exact(mpmath.mpf(float(v)))) for g, v in zip(got, x, strict=False)
        )  # type: ignore[operator]
    assert worst <= 2 <= LIBM_ULPS, worst


def test_signed_zeros_and_what_numpy_answers() -> None:
    with flushing(), np.errstate(invalid="ignore"):
        assert np.signbit(sin(np.array([-0.0]))[0]) and not np.signbit(sin(np.array([0.0]))[0])
        assert cos(np.array([-0.0]))[0] == 1.0
        beyond = np.array([2.0**19 * 1.5, 1e22, np.inf, -np.inf, np.nan])
        for ours, numpys in ((sin, np.sin), (cos, np.cos)):
            np.testing.assert_array_equal(ours(beyond), numpys(beyond))
        a = np.array([np.inf, np.nan, -np.inf, 3.0])
        b = np.array([np.nan, 1.0, 2.0, np.inf])
        np.testing.assert_array_equal(hypot(a, b), np.hypot(a, b))


def test_hypot_is_within_two_ulps_without_overflow_or_underflow() -> None:
    rng = np.random.default_rng(6)
    a = rng.normal(size=1500) * 10.0 ** rng.uniform(-300, 300, 1500)
    b = rng.normal(size=1500) * 10.0 ** rng.uniform(-300, 300, 1500)
    b[:500] = a[:500] * rng.uniform(0.5, 2, 500)  # comparable sides, where both count
    a = np.concatenate([a, [0.0, 0.0, 1e308, -1e308, TINY, 3.0]])
    b = np.concatenate([b, [0.0, -2.0, 1e308, 1e308, TINY, 4.0]])
    with flushing():
        got = hypot(a, b)
    with mpmath.workprec(300):
        exact = [
            mpmath.sqrt(mpmath.mpf(float(x)) ** 2 + mpmath.mpf(float(y)) ** 2)
            for x, y in zip(a, b, strict=False)
        ]
        worst = max(_ulps(float(g), e) for g, e in zip(got, exact, strict=False))
    assert worst <= 2, worst
    assert got[-1] == 5.0 and np.isfinite(got[-4])


def test_the_prims_compute_through_them_in_every_float_dtype() -> None:
    x = np.linspace(-600, 600, 2001)
    b = GraphBuilder()
    xi = b.input("x", "float64", x.shape)
    x32 = b.op("convert_element_type", xi, dtype="float32")
    outs = [b.op(op, t) for op in ("sin", "cos") for t in (xi, x32)]
    outs += [b.op("hypot", xi, 3.0), b.op("hypot", x32, 3.0)]
    got = evaluate(b.build(outs), {"x": x})
    x32v = x.astype(np.float32)
    with flushing():
        want = [sin(x), sin(x32v), cos(x), cos(x32v), hypot(x, 3.0), hypot(x32v, np.float32(3.0))]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.tobytes() == w.tobytes()
    # float32 rounds the float64 result once: within one float32 ulp of NumPy's float32 sin
    np.testing.assert_allclose(got[1], np.sin(x32v), rtol=0, atol=float(np.spacing(np.float32(1))))

"""The exponents torch's CPU kernel computes with arithmetic (``x * x * x`` for 3) are
computed the same way by the engine: torch's bits, for any base (signed, zero, huge), in
time that does not depend on the base (``python -m bench.side_channels --kernels``); the
other integer exponents up to 16 are products too, within the library error the tracker
allows."""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

from dpnode.core.engine import GraphBuilder, evaluate
from dpnode.core.engine.prims.elementwise import FLAT_EXPONENTS
from dpnode.core.privacy.rounding import LIBM_ULPS

#: what torch's CPU kernel computes with arithmetic (0.5 is a square root, NumPy's as before:
#: torch's float32 differs from it in the last bit)
TORCHS = [2.0, 3.0, -0.5, -1.0, -2.0]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("p", TORCHS)
def test_flat_exponents_give_torchs_bits(p: float, dtype: str) -> None:
    rng = np.random.default_rng(5)
    x = np.concatenate(
        [
            rng.normal(size=300) * 10.0 ** rng.uniform(-30, 30, 300),
            [0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 1e200, -1e-200, 1e-310],
        ]
    )
    b = GraphBuilder()
    xi = b.input("x", "float64", x.shape)
    cast = b.op("convert_element_type", xi, dtype=dtype)
    out = b.op("convert_element_type", b.op("pow", cast, p), dtype="float64")
    (got,) = evaluate(b.build([out]), {"x": x})
    t = torch.tensor(x, dtype=torch.float64).to(getattr(torch, dtype))
    want = torch.pow(t, p).to(torch.float64).numpy()
    # the engine flushes subnormal results to zero, intermediate ones included (a square
    # of 1e-30 in float32); torch keeps them
    tiny = np.finfo(np.float64 if dtype == "float64" else np.float32).tiny
    xd = t.to(torch.float64).numpy()
    kept = (xd == 0) | (np.abs(xd) ** np.maximum(2, abs(p)) >= tiny)
    got, want = got[kept], np.where(np.abs(want) < tiny, np.copysign(0.0, want), want)[kept]
    np.testing.assert_array_equal(got, want)  # NaN where NaN; zeros' signs below
    assert np.array_equal(np.signbit(got[got == 0]), np.signbit(want[want == 0]))


@pytest.mark.parametrize("p", sorted(set(FLAT_EXPONENTS) - {*TORCHS, 0.5}))
def test_other_integer_exponents_are_products_within_the_library_error(p: float) -> None:
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.normal(size=200) * 10.0 ** rng.uniform(-12, 12, 200), [-1.0, -3.0]])
    b = GraphBuilder()
    xi = b.input("x", "float64", x.shape)
    (got,) = evaluate(b.build([b.op("pow", xi, p)]), {"x": x})
    with mpmath.workprec(200):
        for value, g in zip(x, got, strict=True):
            exact = mpmath.mpf(float(value)) ** int(p)
            if not np.isfinite(float(exact)) or abs(float(exact)) < np.finfo(np.float64).tiny:
                continue
            ulp = mpmath.mpf(float(np.spacing(abs(float(exact)))))
            assert abs((mpmath.mpf(float(g)) - exact) / ulp) <= LIBM_ULPS / 2
    assert np.all(np.sign(got) == np.sign(x) ** int(abs(p)))  # the sign of a negative base

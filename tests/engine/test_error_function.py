"""The engine's erf and erfc are SciPy's, bit for bit, under the engine's flush-to-zero mode,
for every argument (their time: ``python -m bench.side_channels --kernels``); erfinv, whose
time has no flat range, takes public values only."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.engine import GraphBuilder, evaluate
from dpnode.core.engine.error_function import _LAST, erf, erfc
from dpnode.core.engine.subnormals import flushing
from dpnode.core.privacy import InputSpec, PrivacyTrackingError, track

FUNCTIONS = {"erf": (erf, scipy.special.erf), "erfc": (erfc, scipy.special.erfc)}


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    bits = f"u{got.dtype.itemsize}"
    equal = (got.view(bits) == want.view(bits)) | (np.isnan(got) & np.isnan(want))
    assert equal.all(), (got[~equal][:5], want[~equal][:5])


EDGES = [0.0, -0.0, 1.0, -1.0, 6.0, 8.0, -8.0, _LAST, 27.0, -27.0, np.inf, -np.inf, np.nan]
EDGES += [float(np.nextafter(v, t)) for v in (1.0, 6.0, 8.0, _LAST) for t in (0.0, 30.0)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_bit_for_bit_across_every_formula(name: str, dtype: type) -> None:
    ours, scipys = FUNCTIONS[name]
    rng = np.random.default_rng(2)
    x = np.concatenate([rng.normal(size=50_000) * s for s in (0.3, 1.5, 5.0, 12.0, 30.0)])
    x = np.concatenate([x, EDGES, _LAST + rng.uniform(-1e-12, 1e-12, 2000)]).astype(dtype)
    with flushing():
        _same(ours(x), scipys(x))
        out = np.empty_like(x)
        assert ours(x, out=out) is out
        _same(out, scipys(x))


@settings(max_examples=300, deadline=None)
@given(x=hnp.arrays(np.float64, 8, elements=st.floats(allow_subnormal=False)))
def test_bit_for_bit_on_any_float(x: np.ndarray) -> None:
    with flushing():
        for ours, scipys in FUNCTIONS.values():
            _same(ours(x), scipys(x))


def test_the_prims_compute_through_them() -> None:
    x = np.linspace(-30, 30, 1001)
    b = GraphBuilder()
    xi = b.input("x", "float64", x.shape)
    graph = b.build([b.op("erf", xi), b.op("erfc", xi)])
    got_erf, got_erfc = evaluate(graph, {"x": x})
    with flushing():
        _same(got_erf, scipy.special.erf(x))
        _same(got_erfc, scipy.special.erfc(x))


def test_erfinv_takes_public_values_only() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (8,))
    graph = b.build([b.op("sum", b.op("clamp", b.op("erfinv", x), -3.0, 3.0))])
    with pytest.raises(PrivacyTrackingError, match="erfinv"):
        track(graph, {"x": InputSpec.private(-0.5, 0.5)})
    track(graph, {"x": InputSpec.public()})

"""The special-function, scan, scatter_reduce, searchsorted and matrix prims against torch.

Each case runs torch and the engine on the same inputs over several dtypes: the
engine's inferred dtype and shape must equal torch's, it must refuse exactly what
torch refuses, and values must agree within ``torch.testing.assert_close``'s
defaults (torch's float32 special functions carry float32 rounding, the engine
rounds double-precision results once, so a few ulps apart).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from dpnode.core.engine import GraphBuilder, evaluate, infer, plan
from dpnode.core.engine.prims.special import MAX_DEGREE, POLYNOMIALS
from dpnode.core.errors import DPNodeError, EvaluationError, GraphError
from tests.engine.decomp import TORCH_TO_NAME, to_numpy, to_torch

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool]


def _run(prim: str, tensors: list[torch.Tensor], *scalars: Any, **attrs: Any) -> torch.Tensor:
    b = GraphBuilder()
    refs = [b.input(f"t{i}", TORCH_TO_NAME[t.dtype], tuple(t.shape)) for i, t in enumerate(tensors)]
    graph = b.build([b.op(prim, *refs, *scalars, **attrs)])
    meta = infer(graph)[0]
    out = evaluate(graph, {f"t{i}": to_numpy(t) for i, t in enumerate(tensors)})[0]
    assert meta.dtype.name == TORCH_TO_NAME[to_torch(out).dtype]
    return to_torch(out)


#: torch's float64 kernels for these are single-precision-grade rational approximations
#: (relative error ~1e-6); the engine's (SciPy/Cephes double) are closer to the truth
LOOSE_F64 = {"airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1"}


def _agree(prim: str, fn: Callable[..., Any], tensors: list[torch.Tensor], **attrs: Any) -> None:
    try:
        want = fn(*tensors)
    except (RuntimeError, NotImplementedError):
        with pytest.raises(DPNodeError):
            _run(prim, tensors, **attrs)
        return
    got = _run(prim, tensors, **attrs)
    assert got.dtype == want.dtype and got.shape == want.shape, (prim, got.dtype, want.dtype)
    if want.dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2, equal_nan=True)
    elif want.dtype == torch.float64 and prim in LOOSE_F64:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    else:
        torch.testing.assert_close(got, want, equal_nan=True, check_dtype=False)


def _sample(dtype: torch.dtype, lo: float = -6.0, hi: float = 6.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = torch.rand(3, 7, generator=g, dtype=torch.float64) * (hi - lo) + lo
    if dtype == torch.bool:
        return x > 0
    if not dtype.is_floating_point:
        return x.round().to(dtype)
    return x.to(dtype)


UNARY = {
    "lgamma": torch.lgamma,
    "digamma": torch.digamma,
    "bessel_i0": torch.i0,
    "bessel_i0e": torch.special.i0e,
    "bessel_i1": torch.special.i1,
    "bessel_i1e": torch.special.i1e,
    "erfcx": torch.special.erfcx,
    "log_ndtr": torch.special.log_ndtr,
    "bessel_j0": torch.special.bessel_j0,
    "bessel_j1": torch.special.bessel_j1,
    "bessel_y0": torch.special.bessel_y0,
    "bessel_y1": torch.special.bessel_y1,
    "modified_bessel_k0": torch.special.modified_bessel_k0,
    "modified_bessel_k1": torch.special.modified_bessel_k1,
    "scaled_modified_bessel_k0": torch.special.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": torch.special.scaled_modified_bessel_k1,
    "spherical_bessel_j0": torch.special.spherical_bessel_j0,
    "airy_ai": torch.special.airy_ai,
}


@pytest.mark.parametrize("prim", sorted(UNARY))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unary_special_functions_match_torch(prim: str, dtype: torch.dtype) -> None:
    # positive arguments where the function is only real there (y0, k0...)
    positive = prim.startswith(("bessel_y", "modified_bessel_k", "scaled_modified"))
    x = _sample(dtype, 0.1 if positive else -6.0, 6.0)
    _agree(prim, UNARY[prim], [x])


def test_ndtri_matches_torch() -> None:
    for dtype in DTYPES:
        _agree("ndtri", torch.special.ndtri, [_sample(dtype, 0.01, 0.99)])


@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_polygamma_matches_torch(n: int, dtype: torch.dtype) -> None:
    _agree("polygamma", lambda x: torch.polygamma(n, x), [_sample(dtype)], n=n)


def test_polynomials_match_torch_bit_for_bit_on_the_recurrence() -> None:
    x = _sample(torch.float32, -3, 3).reshape(-1)
    x[:3] = torch.tensor([1.0, -1.0, 0.0])
    n = torch.arange(-2, 19, dtype=torch.float32)
    for name in POLYNOMIALS:
        want = getattr(torch.special, name)(x, n)
        got = _run(name, [x, n])
        torch.testing.assert_close(got, want, equal_nan=True)
        # degrees <= 4 never take the trigonometric shortcut: identical bits
        low = n <= 4
        assert torch.equal(got[low].nan_to_num(7.0), want[low].nan_to_num(7.0)), name


def test_polynomial_degree_is_bounded() -> None:
    x = torch.tensor([0.5])
    n = torch.tensor([float(MAX_DEGREE + 10)])
    with pytest.raises(EvaluationError, match="refused"):
        _run("legendre_polynomial_p", [x, n])
    # the trigonometric shortcut needs no recurrence: any degree works, like torch
    got = _run("chebyshev_polynomial_t", [x, n])
    torch.testing.assert_close(got, torch.special.chebyshev_polynomial_t(x, n))
    b = GraphBuilder()
    xi = b.input("x", "float32", (1000,))
    graph = b.build([b.op("legendre_polynomial_p", xi, 3.0)])
    assert plan(graph).flops >= 1000 * MAX_DEGREE


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bool], ids=str)
def test_cummax_cummin_logcumsumexp_match_torch(dtype: torch.dtype) -> None:
    x = _sample(dtype, -3, 3)
    if dtype.is_floating_point:
        x[0, 2] = x[1, 4] = x[1, 6] = float("nan")
        x[2, 1] = x[2, 3]  # a tie
    for prim, fn in (("cumargmax", torch.cummax), ("cumargmin", torch.cummin)):
        for dim in (0, 1, -1):
            got = _run(prim, [x], dim=dim)
            assert torch.equal(got, fn(x, dim).indices), (prim, dim)
    if dtype.is_floating_point:
        _agree("logcumsumexp", lambda t: torch.logcumsumexp(t, 1), [x * 100], dim=1)
    else:
        with pytest.raises(GraphError):
            _run("logcumsumexp", [x], dim=0)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64], ids=str)
def test_scatter_reduce_matches_torch(reduce: str, include_self: bool, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    x = _sample(dtype, -5, 5)[:, :5]
    index = torch.randint(0, 3, (4, 5), generator=g)
    src = (torch.rand(4, 5, generator=g, dtype=torch.float64) * 10 - 5).round().to(dtype)
    if dtype.is_floating_point:
        src[1, 1] = float("nan")
    want = x.scatter_reduce(0, index, src, reduce, include_self=include_self)
    got = _run("scatter_reduce", [x, index, src], dim=0, reduce=reduce, include_self=include_self)
    torch.testing.assert_close(got, want, equal_nan=True)


def test_scatter_reduce_refuses_what_torch_refuses() -> None:
    x = torch.zeros(3)
    with pytest.raises(GraphError, match="dtype"):
        _run(
            "scatter_reduce",
            [x, torch.tensor([0]), torch.ones(1, dtype=torch.float64)],
            dim=0,
            reduce="sum",
        )
    with pytest.raises(GraphError, match="reduce"):
        _run("scatter_reduce", [x, torch.tensor([0]), torch.ones(1)], dim=0, reduce="median")
    with pytest.raises(EvaluationError, match="out of range"):
        _run("scatter_reduce", [x, torch.tensor([5]), torch.ones(1)], dim=0, reduce="amax")


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_matches_torch_nan_included(right: bool) -> None:
    seq = torch.tensor([[-1.0, 0.0, 0.0, 2.0, float("nan")], [1.0, 2.0, 3.0, 4.0, 5.0]])
    values = torch.tensor([[float("nan"), 0.0, -3.0], [3.0, 5.5, 1.0]])
    for s, v in ((seq, values), (seq[1], values), (seq[0], values[0])):
        want = torch.searchsorted(s, v, right=right)
        assert torch.equal(_run("searchsorted", [s, v], right=right), want)
    want32 = torch.searchsorted(seq[1], 2.5, out_int32=True)
    assert torch.equal(_run("searchsorted", [seq[1]], 2.5, out_int32=True), want32)


def test_frexp_matches_torch() -> None:
    x = torch.tensor([0.0, -0.0, 1.0, 0.75, float("inf"), float("nan"), 1e-40, -3.0, 1e30])
    for dtype in (torch.float32, torch.float64, torch.float16):
        m, e = torch.frexp(x.to(dtype))
        torch.testing.assert_close(_run("frexp_mantissa", [x.to(dtype)]), m, equal_nan=True)
        assert torch.equal(_run("frexp_exponent", [x.to(dtype)]), e)
    with pytest.raises(GraphError):
        _run("frexp_exponent", [torch.ones(2, dtype=torch.int64)])


def _spd(batch: tuple[int, ...], n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    a = torch.randn(*batch, n, n, generator=g, dtype=torch.float64)
    return (a @ a.mT + n * torch.eye(n, dtype=torch.float64)).to(dtype)


MATRIX: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "cholesky": (torch.linalg.cholesky, {}),
    "inv": (torch.linalg.inv, {}),
    "det": (torch.linalg.det, {}),
    "slogdet": (lambda a: torch.stack(torch.linalg.slogdet(a), dim=-1), {}),
    "eigvalsh": (torch.linalg.eigvalsh, {}),
    "svdvals": (torch.linalg.svdvals, {}),
    "matrix_exp": (lambda a: torch.linalg.matrix_exp(a / 8), {}),
    "lu_factor": (lambda a: torch.linalg.lu_factor(a)[0], {}),
    "lu_pivots": (lambda a: torch.linalg.lu_factor(a)[1], {}),
    "qr_r": (lambda a: torch.linalg.qr(a)[1], {}),
    "qr_q": (lambda a: torch.linalg.qr(a)[0], {}),
    "svd_u": (lambda a: torch.linalg.svd(a, full_matrices=False)[0], {}),
    "svd_vh": (lambda a: torch.linalg.svd(a, full_matrices=False)[2], {}),
    "eigh_vectors": (lambda a: torch.linalg.eigh(a)[1], {}),
}


@pytest.mark.parametrize("prim", sorted(MATRIX))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("batch", [(), (2, 3)], ids=str)
def test_matrix_prims_match_torch(prim: str, dtype: torch.dtype, batch: tuple[int, ...]) -> None:
    fn, attrs = MATRIX[prim]
    a = _spd(batch, 4, dtype)
    if prim == "matrix_exp":
        a = a / 8  # keep exp(A) in a range where float32 relative errors stay small
        fn = torch.linalg.matrix_exp
    want = fn(a)
    got = _run(prim, [a], **attrs)
    assert got.shape == want.shape and got.dtype == want.dtype
    if prim in ("eigh_vectors", "svd_u", "svd_vh"):
        # singular and eigen vectors are defined up to sign (torch's batched path may pick
        # the other one): compare with each vector's sign fixed by its largest entry
        got, want = _canonical_sign(got, prim == "svd_vh"), _canonical_sign(want, prim == "svd_vh")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def _canonical_sign(v: torch.Tensor, rows: bool) -> torch.Tensor:
    m = v.mT if rows else v
    pick = m.abs().argmax(dim=-2, keepdim=True)
    m = m * torch.sign(torch.gather(m, -2, pick))
    return m.mT if rows else m


@pytest.mark.parametrize("prim", sorted(MATRIX))
def test_matrix_prims_refuse_low_precision_and_integers(prim: str) -> None:
    for dtype in (torch.float16, torch.int64):
        with pytest.raises(GraphError):
            _run(prim, [torch.ones(3, 3, dtype=dtype)])


def test_solves_match_torch() -> None:
    a = _spd((2,), 4, torch.float64)
    b = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    torch.testing.assert_close(_run("solve", [a, b]), torch.linalg.solve(a, b))
    bt = b.mT.contiguous()
    torch.testing.assert_close(
        _run("solve", [a, bt], left=False), torch.linalg.solve(a, bt, left=False)
    )
    for upper in (True, False):
        for left in (True, False):
            rhs = b if left else bt
            want = torch.linalg.solve_triangular(a, rhs, upper=upper, left=left)
            got = _run("solve_triangular", [a, rhs], upper=upper, left=left)
            torch.testing.assert_close(got, want)
    lu, piv = torch.linalg.lu_factor(a)
    for adjoint in (False, True):
        want = torch.linalg.lu_solve(lu, piv, b, adjoint=adjoint)
        torch.testing.assert_close(_run("lu_solve", [lu, piv, b], adjoint=adjoint), want)
    with pytest.raises(EvaluationError, match="singular"):
        _run("inv", [torch.zeros(3, 3)])
    with pytest.raises(EvaluationError, match="positive-definite"):
        _run("cholesky", [-torch.eye(3)])


def test_rectangular_factorizations_match_torch() -> None:
    a = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    for x in (a, a.mT.contiguous()):
        lu, piv = torch.linalg.lu_factor(x)
        torch.testing.assert_close(_run("lu_factor", [x]), lu)
        assert torch.equal(_run("lu_pivots", [x]), piv)
        for mode in ("reduced", "complete"):
            q, r = torch.linalg.qr(x, mode=mode)
            torch.testing.assert_close(_run("qr_q", [x], mode=mode), q)
            torch.testing.assert_close(_run("qr_r", [x], mode=mode), r)
        torch.testing.assert_close(_run("svdvals", [x]), torch.linalg.svdvals(x))
    assert np.isfinite(_run("det", [a[:, :3, :]]).numpy()).all()


def test_householder_form_matches_torch() -> None:
    g = torch.Generator().manual_seed(4)
    for shape in ((5, 3), (2, 4, 4), (3, 0)):
        a = torch.randn(*shape, generator=g, dtype=torch.float64)
        want_a, want_tau = torch.geqrf(a)
        torch.testing.assert_close(_run("geqrf", [a]), want_a)
        torch.testing.assert_close(_run("geqrf_tau", [a]), want_tau)
    a = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    qr, tau = torch.geqrf(a)
    want = torch.linalg.householder_product(qr, tau)
    torch.testing.assert_close(_run("householder_product", [qr, tau]), want)
    c = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    for transpose in (False, True):
        want = torch.ormqr(qr, tau, c, left=True, transpose=transpose)
        got = _run("ormqr", [qr, tau, c], left=True, transpose=transpose)
        torch.testing.assert_close(got, want)
    ct = c.mT.contiguous()
    want = torch.ormqr(qr, tau, ct, left=False, transpose=True)
    torch.testing.assert_close(_run("ormqr", [qr, tau, ct], left=False, transpose=True), want)


def test_ldl_matches_torch() -> None:
    g = torch.Generator().manual_seed(8)
    a = torch.randn(2, 5, 5, generator=g, dtype=torch.float64)
    a = a + a.mT
    ld, piv = torch.linalg.ldl_factor(a)
    torch.testing.assert_close(_run("ldl_factor", [a]), ld)
    assert torch.equal(_run("ldl_pivots", [a]), piv)
    b = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(_run("ldl_solve", [ld, piv, b]), torch.linalg.ldl_solve(ld, piv, b))

"""Linear algebra on (batches of) matrices: factorizations, solves, inverses, spectra.

Each prim has one output (a factorization with several parts is several prims,
e.g. ``lu_factor`` and ``lu_pivots``) and works on the last two dims, batched
over the others like torch.linalg. Kernels call the same LAPACK routines torch
does (``getrf``, ``potrf``, ``gesdd``, ``syevd``, ``geqrf``) through NumPy and SciPy,
in the input's precision, so results match torch's within its tolerances; where a
result is only defined up to sign (singular and eigen vectors, QR factors) the
routines agree with torch's in practice but nothing guarantees it. float16 and
bfloat16 are refused (torch has no CPU kernels for them), as are integers.
A singular or non-positive-definite input where the math needs one raises
``EvaluationError`` (torch raises too, or returns garbage with an ``info`` code).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import scipy.linalg  # type: ignore[import-untyped,unused-ignore]

from node.engine.dtypes import DTYPES
from node.engine.prims.registry import (
    Array,
    AttrSpec,
    Call,
    Privacy,
    TensorMeta,
    broadcast,
    prim,
)

__all__: list[str] = []

_INT32 = DTYPES["int32"]


def _matrix(c: Call, i: int = 0, square: bool = True) -> TensorMeta:
    a = c.tensor(i)
    if a.ndim < 2:
        raise c.fail(f"expected a matrix or a batch of matrices, got {a.ndim} dims", i)
    if a.dtype.name not in ("float32", "float64"):
        raise c.fail(f"{c.op} needs float32 or float64, got {a.dtype.name}", i)
    if square and a.shape[-1] != a.shape[-2]:
        raise c.fail(f"expected square matrices, got {a.shape[-2]}x{a.shape[-1]}", i)
    return a


def _cubic(c: Call) -> int:
    a = c.tensor(0)
    m, n = a.shape[-2:] if a.ndim >= 2 else (1, 1)
    return 4 * math.prod(a.shape[:-2]) * m * n * max(min(m, n), 1) + 1


def _copy_of_input(c: Call) -> int:
    return 2 * c.tensor(0).nbytes


def _loop(c: Call, fn: Callable[..., Array], arrays: list[Array], core: int) -> Array:
    """Apply ``fn`` to each matrix of a batch; ``core`` is the number of dims of one result."""
    out_shape = c.out().shape
    bshape = out_shape[: len(out_shape) - core]
    r = np.empty(out_shape, dtype=c.out().dtype.np)
    for idx in np.ndindex(*bshape):
        parts = []
        for a in arrays:
            lead = a.ndim - 2
            sub = tuple(0 if a.shape[k] == 1 else idx[k + len(bshape) - lead] for k in range(lead))
            parts.append(a[sub])
        r[idx] = fn(*parts)
    return r


def _unary_matrix(
    name: str,
    shape: Callable[[Call, TensorMeta], tuple[int, ...]],
    *,
    attrs: dict[str, AttrSpec] | None = None,
    out_int32: bool = False,
    square: bool = True,
    privacy: Privacy,
) -> Callable[[Callable[[Call, list[Any], Array | None], Array]], Any]:
    def infer(c: Call) -> TensorMeta:
        a = _matrix(c, 0, square)
        return TensorMeta(shape(c, a), _INT32 if out_int32 else a.dtype)

    return prim(
        name,
        privacy=privacy,
        args=1,
        attrs=attrs or {},
        infer=infer,
        flops=_cubic,
        workspace=_copy_of_input,
    )


def _fail(c: Call, what: str) -> Exception:
    return c.eval_error(f"{what} (torch raises or reports it in an info code)")


# -- factorizations ------------------------------------------------------------------------


@_unary_matrix(
    "cholesky",
    lambda c, a: a.shape,
    attrs={"upper": AttrSpec("bool", optional=True, default=False)},
    privacy="public_only",
)
def _cholesky(c: Call, args: list[Any], out: Array | None) -> Array:
    """Cholesky factor L (A = L L^T), or U = L^T with ``upper``."""
    (a,) = args
    try:
        low = np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        raise _fail(c, "the matrix is not positive-definite") from None
    if c.attrs.get("upper"):
        return np.ascontiguousarray(np.swapaxes(low, -1, -2))
    return np.asarray(low)


def _lu(c: Call, a: Array) -> tuple[Array, Array]:
    import warnings

    with warnings.catch_warnings():  # a singular matrix factors fine (torch: info > 0)
        warnings.simplefilter("ignore")
        lu, piv = scipy.linalg.lu_factor(a, check_finite=False)
    return lu, piv


@_unary_matrix("lu_factor", lambda c, a: a.shape, square=False, privacy="public_only")
def _lu_factor(c: Call, args: list[Any], out: Array | None) -> Array:
    """LU with partial pivoting (LAPACK getrf), L and U packed in one matrix, like torch."""
    (a,) = args
    return _loop(c, lambda m: _lu(c, m)[0], [a], 2)


@_unary_matrix(
    "lu_pivots",
    lambda c, a: (*a.shape[:-2], min(a.shape[-2:])),
    out_int32=True,
    square=False,
    privacy="public_only",
)
def _lu_pivots(c: Call, args: list[Any], out: Array | None) -> Array:
    """The row swaps of ``lu_factor``: int32, 1-based (LAPACK's and torch's convention)."""
    (a,) = args
    return _loop(c, lambda m: _lu(c, m)[1] + 1, [a], 1)


def _lu_solve_infer(c: Call) -> TensorMeta:
    lu = _matrix(c, 0)
    piv = c.tensor(1)
    b = _matrix(c, 2, square=False)
    if piv.dtype.name != "int32" or piv.shape[-1:] != lu.shape[-1:]:
        raise c.fail("pivots must be int32 with one entry per row of LU", 1)
    if b.dtype != lu.dtype:
        raise c.fail(f"B dtype {b.dtype.name} must match LU dtype {lu.dtype.name}", 2)
    n = lu.shape[-1]
    left = c.attrs.get("left", True)
    if (b.shape[-2] if left else b.shape[-1]) != n:
        raise c.fail(f"B of shape {list(b.shape)} does not fit {n}x{n} factors", 2)
    batch = broadcast(c, [lu.shape[:-2], piv.shape[:-1], b.shape[:-2]])
    return TensorMeta((*batch, *b.shape[-2:]), b.dtype)


@prim(
    "lu_solve",
    privacy="public_only",
    args=3,
    attrs={
        "left": AttrSpec("bool", optional=True, default=True),
        "adjoint": AttrSpec("bool", optional=True, default=False),
    },
    infer=_lu_solve_infer,
    flops=lambda c: 2 * c.out().numel * c.tensor(0).shape[-1] + 1,
)
def _lu_solve(c: Call, args: list[Any], out: Array | None) -> Array:
    """Solve A X = B (or X A = B, or with A^T) from ``lu_factor``/``lu_pivots``."""
    lu, piv, b = args
    left, adjoint = c.attrs.get("left", True), bool(c.attrs.get("adjoint"))

    def one(f: Array, p: Array, rhs: Array) -> Array:
        if left:
            return np.asarray(scipy.linalg.lu_solve((f, p - 1), rhs, trans=1 if adjoint else 0))
        # X A = B  <=>  A^T X^T = B^T
        xt = scipy.linalg.lu_solve((f, p - 1), rhs.T, trans=0 if adjoint else 1)
        return np.asarray(xt).T

    piv2 = piv.reshape((*piv.shape[:-1], 1, piv.shape[-1]))
    return _loop(c, lambda f, p, rhs: one(f, p[0], rhs), [lu, piv2, b], 2)


def _qr_shape(c: Call, a: TensorMeta, part: str) -> tuple[int, ...]:
    m, n = a.shape[-2:]
    k = min(m, n)
    mode = c.attrs.get("mode") or "reduced"
    if mode not in ("reduced", "complete", "r"):
        raise c.fail(f"mode must be reduced, complete or r, got {mode!r}", "mode")
    if part == "q":
        cols = 0 if mode == "r" else (m if mode == "complete" else k)
        return (*a.shape[:-2], m if mode != "r" else 0, cols)
    return (*a.shape[:-2], m if mode == "complete" else k, n)


_QR_ATTRS = {"mode": AttrSpec("str", optional=True, default="reduced")}


def _qr(c: Call, a: Array, part: str) -> Array:
    mode = c.attrs.get("mode") or "reduced"
    npmode: Literal["complete", "reduced"] = "complete" if mode == "complete" else "reduced"
    if part == "q" and mode == "r":
        return np.zeros(c.out().shape, dtype=a.dtype)
    q, r = np.linalg.qr(a, mode=npmode)
    return np.ascontiguousarray(q if part == "q" else r)


@_unary_matrix(
    "qr_q",
    lambda c, a: _qr_shape(c, a, "q"),
    attrs=_QR_ATTRS,
    square=False,
    privacy="public_only",
)
def _qr_q(c: Call, args: list[Any], out: Array | None) -> Array:
    """Q of the Householder QR (LAPACK geqrf + orgqr); ``mode`` as in torch.linalg.qr."""
    return _qr(c, args[0], "q")


@_unary_matrix(
    "qr_r",
    lambda c, a: _qr_shape(c, a, "r"),
    attrs=_QR_ATTRS,
    square=False,
    privacy="public_only",
)
def _qr_r(c: Call, args: list[Any], out: Array | None) -> Array:
    """R of the Householder QR (upper triangular)."""
    return _qr(c, args[0], "r")


# -- spectra ------------------------------------------------------------------------------

_UPLO = {"upper": AttrSpec("bool", optional=True, default=False)}


def _sym(c: Call, a: Array) -> Literal["L", "U"]:
    return "U" if c.attrs.get("upper") else "L"


@_unary_matrix("eigvalsh", lambda c, a: a.shape[:-1], attrs=_UPLO, privacy="public_only")
def _eigvalsh(c: Call, args: list[Any], out: Array | None) -> Array:
    """Eigenvalues of a symmetric matrix (one triangle read), ascending."""
    (a,) = args
    return np.asarray(np.linalg.eigvalsh(a, UPLO=_sym(c, a)))


@_unary_matrix("eigh_vectors", lambda c, a: a.shape, attrs=_UPLO, privacy="public_only")
def _eigh_vectors(c: Call, args: list[Any], out: Array | None) -> Array:
    """Eigenvectors (columns) of a symmetric matrix, in the order of ``eigvalsh``."""
    (a,) = args
    return np.ascontiguousarray(np.linalg.eigh(a, UPLO=_sym(c, a))[1])


def _svd_shape(c: Call, a: TensorMeta, part: str) -> tuple[int, ...]:
    m, n = a.shape[-2:]
    k = min(m, n)
    full = bool(c.attrs.get("full_matrices"))
    if part == "s":
        return (*a.shape[:-2], k)
    if part == "u":
        return (*a.shape[:-2], m, m if full else k)
    return (*a.shape[:-2], n if full else k, n)


_FULL = {"full_matrices": AttrSpec("bool", optional=True, default=False)}


@_unary_matrix("svdvals", lambda c, a: _svd_shape(c, a, "s"), square=False, privacy="public_only")
def _svdvals(c: Call, args: list[Any], out: Array | None) -> Array:
    """Singular values, descending."""
    (a,) = args
    if 0 in a.shape[-2:]:
        return np.zeros(c.out().shape, dtype=a.dtype)
    return np.asarray(np.linalg.svd(a, compute_uv=False))


def _svd_part(c: Call, a: Array, part: str) -> Array:
    if 0 in a.shape[-2:]:
        r = np.zeros(c.out().shape, dtype=a.dtype)
        if c.attrs.get("full_matrices"):
            r[...] = np.eye(r.shape[-1], dtype=a.dtype)
        return r
    u, _, vh = np.linalg.svd(a, full_matrices=bool(c.attrs.get("full_matrices")))
    return np.ascontiguousarray(u if part == "u" else vh)


@_unary_matrix(
    "svd_u",
    lambda c, a: _svd_shape(c, a, "u"),
    attrs=_FULL,
    square=False,
    privacy="public_only",
)
def _svd_u(c: Call, args: list[Any], out: Array | None) -> Array:
    """Left singular vectors (LAPACK gesdd), columns in the order of ``svdvals``."""
    return _svd_part(c, args[0], "u")


@_unary_matrix(
    "svd_vh",
    lambda c, a: _svd_shape(c, a, "vh"),
    attrs=_FULL,
    square=False,
    privacy="public_only",
)
def _svd_vh(c: Call, args: list[Any], out: Array | None) -> Array:
    """Right singular vectors, as rows (Vh)."""
    return _svd_part(c, args[0], "vh")


# -- inverses, determinants, solves -------------------------------------------------------


@_unary_matrix("inv", lambda c, a: a.shape, privacy="public_only")
def _inv(c: Call, args: list[Any], out: Array | None) -> Array:
    """Matrix inverse (LAPACK getrf + getri/getrs)."""
    (a,) = args
    try:
        return np.asarray(np.linalg.inv(a))
    except np.linalg.LinAlgError:
        raise _fail(c, "the matrix is singular") from None


@_unary_matrix("det", lambda c, a: a.shape[:-2], privacy="public_only")
def _det(c: Call, args: list[Any], out: Array | None) -> Array:
    """Determinant (product of the LU diagonal, signed by the pivots)."""
    return np.asarray(np.linalg.det(args[0])).astype(c.out().dtype.np)


@_unary_matrix("slogdet", lambda c, a: (*a.shape[:-2], 2), privacy="public_only")
def _slogdet(c: Call, args: list[Any], out: Array | None) -> Array:
    """Sign and log of the absolute determinant, stacked in a last dim of size 2."""
    sign, logabs = np.linalg.slogdet(args[0])
    return np.stack([np.asarray(sign), np.asarray(logabs)], axis=-1).astype(c.out().dtype.np)


@_unary_matrix("matrix_exp", lambda c, a: a.shape, privacy="public_only")
def _matrix_exp(c: Call, args: list[Any], out: Array | None) -> Array:
    """exp(A) = sum A^k / k! (SciPy's scaling-and-squaring Pade approximation)."""
    (a,) = args
    if a.size == 0:
        return np.array(a, copy=True)
    # in float64: torch's float32 result carries its own rounding error, the truth is the target
    return np.asarray(scipy.linalg.expm(a.astype(np.float64))).astype(a.dtype)


def _solve_infer(c: Call) -> TensorMeta:
    a = _matrix(c, 0)
    b = _matrix(c, 1, square=False)
    if b.dtype != a.dtype:
        raise c.fail(f"B dtype {b.dtype.name} must match A dtype {a.dtype.name}", 1)
    n = a.shape[-1]
    left = c.attrs.get("left", True)
    if (b.shape[-2] if left else b.shape[-1]) != n:
        raise c.fail(f"B of shape {list(b.shape)} does not fit A of shape {list(a.shape)}", 1)
    batch = broadcast(c, [a.shape[:-2], b.shape[:-2]])
    return TensorMeta((*batch, *b.shape[-2:]), a.dtype)


def _solve_flops(c: Call) -> int:
    n = c.tensor(0).shape[-1]
    return 2 * math.prod(c.out().shape[:-2]) * n * n * (n + c.out().shape[-1]) + 1


@prim(
    "solve",
    privacy="public_only",
    args=2,
    attrs={"left": AttrSpec("bool", optional=True, default=True)},
    infer=_solve_infer,
    flops=_solve_flops,
)
def _solve(c: Call, args: list[Any], out: Array | None) -> Array:
    """X with A X = B (``left``) or X A = B; B holds one right-hand side per column."""
    a, b = args
    try:
        if c.attrs.get("left", True):
            return np.asarray(np.linalg.solve(a, b))
        return np.ascontiguousarray(
            np.swapaxes(np.linalg.solve(np.swapaxes(a, -1, -2), np.swapaxes(b, -1, -2)), -1, -2)
        )
    except np.linalg.LinAlgError:
        raise _fail(c, "the matrix is singular") from None


@prim(
    "solve_triangular",
    privacy="public_only",
    args=2,
    attrs={
        "upper": AttrSpec("bool"),
        "left": AttrSpec("bool", optional=True, default=True),
        "unitriangular": AttrSpec("bool", optional=True, default=False),
    },
    infer=_solve_infer,
    flops=_solve_flops,
)
def _solve_triangular(c: Call, args: list[Any], out: Array | None) -> Array:
    """Triangular solve (LAPACK trtrs): only A's ``upper`` or lower triangle is read."""
    a, b = args
    upper, left = bool(c.attr("upper")), c.attrs.get("left", True)
    unit = bool(c.attrs.get("unitriangular"))

    def one(m: Array, rhs: Array) -> Array:
        if left:
            return np.asarray(
                scipy.linalg.solve_triangular(
                    m, rhs, lower=not upper, unit_diagonal=unit, check_finite=False
                )
            )
        xt = scipy.linalg.solve_triangular(
            m, rhs.T, trans=1, lower=not upper, unit_diagonal=unit, check_finite=False
        )
        return np.asarray(xt).T

    with np.errstate(all="ignore"):
        try:
            return _loop(c, one, [a, b], 2)
        except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):
            raise _fail(c, "the triangular matrix is singular") from None


# -- LAPACK's Householder form (geqrf, orgqr, ormqr) ---------------------------------------


def _lapack(name: str, a: Array) -> Any:
    return scipy.linalg.get_lapack_funcs((name,), (a,))[0]


def _geqrf(a: Array) -> tuple[Array, Array]:
    if 0 in a.shape:
        return np.array(a, copy=True), np.zeros((0,), dtype=a.dtype)
    qr, tau, _, _info = _lapack("geqrf", a)(a)
    return np.asarray(qr), np.asarray(tau)


@_unary_matrix("geqrf", lambda c, a: a.shape, square=False, privacy="public_only")
def _geqrf_prim(c: Call, args: list[Any], out: Array | None) -> Array:
    """R and the Householder vectors packed as LAPACK's geqrf leaves them (torch.geqrf's a)."""
    return _loop(c, lambda m: _geqrf(m)[0], [args[0]], 2)


@_unary_matrix(
    "geqrf_tau",
    lambda c, a: (*a.shape[:-2], min(a.shape[-2:])),
    square=False,
    privacy="public_only",
)
def _geqrf_tau(c: Call, args: list[Any], out: Array | None) -> Array:
    """The Householder scalars of ``geqrf`` (torch.geqrf's tau)."""
    return _loop(c, lambda m: _geqrf(m)[1], [args[0]], 1)


def _householder_infer(c: Call) -> TensorMeta:
    a = _matrix(c, 0, square=False)
    tau = c.tensor(1)
    m, n = a.shape[-2:]
    if m < n or tau.ndim < 1 or tau.shape[-1] > n or tau.dtype != a.dtype:
        raise c.fail(
            f"needs m >= n >= k and tau of A's dtype, got A {list(a.shape)}, tau {list(tau.shape)}"
        )
    if tau.shape[:-1] != a.shape[:-2]:
        raise c.fail("tau's batch dims must equal A's", 1)
    return TensorMeta(a.shape, a.dtype)


@prim("householder_product", privacy="public_only", args=2, infer=_householder_infer, flops=_cubic)
def _householder_product(c: Call, args: list[Any], out: Array | None) -> Array:
    """The first n columns of the product of Householder reflectors (LAPACK orgqr)."""
    a, tau = args

    def one(m: Array, t: Array) -> Array:
        if 0 in m.shape:
            return np.zeros(m.shape, dtype=m.dtype)
        if t.shape[-1] == 0:
            return np.eye(*m.shape, dtype=m.dtype)
        q, _, _info = _lapack("orgqr", m)(m, t)
        return np.asarray(q)

    tau2 = tau.reshape((*tau.shape[:-1], 1, tau.shape[-1]))
    return _loop(c, lambda m, t: one(m, t[0]), [a, tau2], 2)


def _ormqr_infer(c: Call) -> TensorMeta:
    a = _matrix(c, 0, square=False)
    tau = c.tensor(1)
    other = _matrix(c, 2, square=False)
    if tau.dtype != a.dtype or other.dtype != a.dtype:
        raise c.fail("input, tau and other must share a dtype")
    left = c.attrs.get("left", True)
    mn = other.shape[-2] if left else other.shape[-1]
    if a.shape[-2] != mn or tau.shape[-1] > min(a.shape[-2:]):
        raise c.fail(f"reflectors of shape {list(a.shape)} do not fit other {list(other.shape)}")
    if not (a.shape[:-2] == tau.shape[:-1] == other.shape[:-2]):
        raise c.fail("input, tau and other need the same batch dims")
    return TensorMeta(other.shape, other.dtype)


@prim(
    "ormqr",
    privacy="public_only",
    args=3,
    attrs={
        "left": AttrSpec("bool", optional=True, default=True),
        "transpose": AttrSpec("bool", optional=True, default=False),
    },
    infer=_ormqr_infer,
    flops=lambda c: 4 * c.out().numel * c.tensor(0).shape[-2] + 1,
)
def _ormqr(c: Call, args: list[Any], out: Array | None) -> Array:
    """Q @ other (or other @ Q, or with Q^T) for Q held as geqrf's reflectors (LAPACK ormqr)."""
    a, tau, other = args
    side = "L" if c.attrs.get("left", True) else "R"
    trans = "T" if c.attrs.get("transpose") else "N"

    def one(m: Array, t: Array, rhs: Array) -> Array:
        if 0 in rhs.shape or t.shape[-1] == 0:
            return np.array(rhs, copy=True)
        lwork = max(1, 64 * max(rhs.shape))
        r = _lapack("ormqr", m)(side, trans, m, t, rhs, lwork)
        return np.asarray(r[0])

    tau2 = tau.reshape((*tau.shape[:-1], 1, tau.shape[-1]))
    return _loop(c, lambda m, t, rhs: one(m, t[0], rhs), [a, tau2, other], 2)


# -- LDL^T with Bunch-Kaufman pivoting (sytrf, sytrs) --------------------------------------


def _ldl(a: Array) -> tuple[Array, Array]:
    if a.shape[-1] == 0:
        return np.array(a, copy=True), np.zeros((0,), dtype=np.int32)
    ldu, piv, _info = _lapack("sytrf", a)(a, lower=1)
    return np.tril(ldu), np.asarray(piv, dtype=np.int32)


@_unary_matrix("ldl_factor", lambda c, a: a.shape, privacy="public_only")
def _ldl_factor(c: Call, args: list[Any], out: Array | None) -> Array:
    """The LDL^T factors of a symmetric matrix (lower triangle read), packed like torch's LD."""
    return _loop(c, lambda m: _ldl(m)[0], [args[0]], 2)


@_unary_matrix("ldl_pivots", lambda c, a: a.shape[:-1], out_int32=True, privacy="public_only")
def _ldl_pivots(c: Call, args: list[Any], out: Array | None) -> Array:
    """sytrf's int32 pivots (1-based; negative pairs mark 2x2 blocks), like torch's."""
    return _loop(c, lambda m: _ldl(m)[1], [args[0]], 1)


def _ldl_solve_infer(c: Call) -> TensorMeta:
    ld = _matrix(c, 0)
    piv = c.tensor(1)
    b = _matrix(c, 2, square=False)
    if piv.dtype.name != "int32" or piv.shape != ld.shape[:-1]:
        raise c.fail("pivots must be int32 with one entry per row of LD", 1)
    if b.dtype != ld.dtype or b.shape[-2] != ld.shape[-1]:
        raise c.fail(f"B of shape {list(b.shape)} does not fit LD of shape {list(ld.shape)}", 2)
    batch = broadcast(c, [ld.shape[:-2], b.shape[:-2]])
    return TensorMeta((*batch, *b.shape[-2:]), b.dtype)


@prim("ldl_solve", privacy="public_only", args=3, infer=_ldl_solve_infer, flops=_solve_flops)
def _ldl_solve(c: Call, args: list[Any], out: Array | None) -> Array:
    """Solve A X = B from ``ldl_factor``/``ldl_pivots`` (LAPACK sytrs)."""
    ld, piv, b = args

    def one(f: Array, p: Array, rhs: Array) -> Array:
        if 0 in rhs.shape:
            return np.zeros(rhs.shape, dtype=rhs.dtype)
        x, _info = _lapack("sytrs", f)(f, p, rhs, lower=1)
        return np.asarray(x)

    piv2 = piv.reshape((*piv.shape[:-1], 1, piv.shape[-1]))
    return _loop(c, lambda f, p, rhs: one(f, p[0], rhs), [ld, piv2, b], 2)

"""torch.linalg on remote tensors: factorizations, solves and spectra as the engine's matrix prims.

ATen's linalg ops return auxiliary outputs (``LU`` and ``pivots`` of a solve, the
``info`` codes of the ``_ex`` variants) that autograd may use; each gets a real
prim (``lu_factor``, ``lu_pivots``). ``info`` is always zero: where torch would
report a failure in it, the node raises an evaluation error instead.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from sdk._remote.dispatch import SPECIAL
from sdk._remote.graph import Node, prim
from sdk._remote.rules import dtype_name, implements

__all__: list[str] = []

aten = torch.ops.aten


def _mT(x: Node, nd: int) -> Node:
    dims = list(range(nd))
    dims[-1], dims[-2] = dims[-2], dims[-1]
    return prim("permute", x, dims=tuple(dims))


def _zeros(meta: torch.Tensor) -> Node:
    return prim("full", shape=tuple(meta.shape), value=0.0, dtype=dtype_name(meta.dtype))


def _nd(x: Node) -> int:
    return len(x.shape or ())


@implements(aten.linalg_cholesky_ex.default)
def _cholesky_ex(
    out: Any, a: Node, *, upper: bool = False, check_errors: bool = False
) -> tuple[Node, Node]:
    return prim("cholesky", a, upper=bool(upper)), _zeros(out[1])


implements(aten.cholesky.default)(
    lambda out, a, upper=False: prim("cholesky", a, upper=bool(upper))
)


def _from_factor(f: Node, upper: bool) -> Node:
    nd = _nd(f)
    return prim("matmul", _mT(f, nd), f) if upper else prim("matmul", f, _mT(f, nd))


implements(aten.cholesky_inverse.default)(
    lambda out, f, upper=False: prim("inv", _from_factor(f, bool(upper)))
)
implements(aten.cholesky_solve.default)(
    lambda out, b, f, upper=False: prim("solve", _from_factor(f, bool(upper)), b)
)


@implements(aten._linalg_det.default)
def _det(out: Any, a: Node) -> tuple[Node, Node, Node]:
    return prim("det", a), prim("lu_factor", a), prim("lu_pivots", a)


@implements(aten._linalg_slogdet.default)
def _slogdet(out: Any, a: Node) -> tuple[Node, Node, Node, Node]:
    both = prim("slogdet", a)
    sign, logabs = (
        prim("squeeze", prim("slice", both, dim=-1, start=k, end=k + 1, step=1), dims=(-1,))
        for k in (0, 1)
    )
    return sign, logabs, prim("lu_factor", a), prim("lu_pivots", a)


@implements(aten.linalg_inv_ex.default)
def _inv_ex(out: Any, a: Node, *, check_errors: bool = False) -> tuple[Node, Node]:
    return prim("inv", a), _zeros(out[1])


@implements(aten._linalg_solve_ex.default)
def _solve_ex(
    out: Any, a: Node, b: Node, *, left: bool = True, check_errors: bool = False
) -> tuple[Node, Node, Node, Node]:
    ashape, bshape = tuple(a.shape or ()), tuple(b.shape or ())
    vector = len(bshape) == 1 or (len(bshape) == len(ashape) - 1 and bshape == ashape[:-1])
    if vector:
        rhs = prim("unsqueeze", b, dim=-1 if left else -2)
        x = prim("solve", a, rhs, left=bool(left))
        x = prim("reshape", x, shape=tuple(out[0].shape))
    else:
        x = prim("solve", a, b, left=bool(left))
    return x, prim("lu_factor", a), prim("lu_pivots", a), _zeros(out[3])


@implements(aten.linalg_solve_triangular.default)
def _solve_triangular(
    out: torch.Tensor,
    a: Node,
    b: Node,
    *,
    upper: bool,
    left: bool = True,
    unitriangular: bool = False,
) -> Node:
    return prim(
        "solve_triangular",
        a,
        b,
        upper=bool(upper),
        left=bool(left),
        unitriangular=bool(unitriangular),
    )


@implements(aten.triangular_solve.default)
def _triangular_solve(
    out: Any,
    b: Node,
    a: Node,
    upper: bool = True,
    transpose: bool = False,
    unitriangular: bool = False,
) -> tuple[Node, Node]:
    m = _mT(a, _nd(a)) if transpose else a
    x = prim(
        "solve_triangular",
        m,
        b,
        upper=bool(upper) != bool(transpose),
        unitriangular=bool(unitriangular),
    )
    return x, a


@implements(aten._linalg_eigh.default)
def _eigh(out: Any, a: Node, UPLO: str = "L", compute_v: bool = True) -> tuple[Node, Node]:
    upper = UPLO.upper() == "U"
    vals = prim("eigvalsh", a, upper=upper)
    vecs = prim("eigh_vectors", a, upper=upper) if compute_v else _zeros(out[1])
    return vals, vecs


@implements(aten._linalg_svd.default)
def _svd(
    out: Any,
    a: Node,
    full_matrices: bool = False,
    compute_uv: bool = True,
    *,
    driver: Any = None,
) -> tuple[Node, Node, Node]:
    s = prim("svdvals", a)
    if not compute_uv:
        return _zeros(out[0]), s, _zeros(out[2])
    full = bool(full_matrices)
    return prim("svd_u", a, full_matrices=full), s, prim("svd_vh", a, full_matrices=full)


@implements(aten.linalg_qr.default)
def _qr(out: Any, a: Node, mode: str = "reduced") -> tuple[Node, Node]:
    return prim("qr_q", a, mode=mode), prim("qr_r", a, mode=mode)


# info codes are always zero here (the node raises instead), so checking them is a no-op
implements(aten._linalg_check_errors.default)(lambda out, info, api_name, *, is_matrix: None)
implements(aten.linalg_matrix_exp.default)(lambda out, a: prim("matrix_exp", a))


@implements(aten.linalg_lu_factor_ex.default)
def _lu_factor_ex(out: Any, a: Node, *, pivot: bool = True, check_errors: bool = False) -> Any:
    shape = tuple(a.shape or ())
    if not pivot or len(shape) < 2:
        return NotImplemented  # LU without pivoting is not a prim
    return prim("lu_factor", a), prim("lu_pivots", a), _zeros(out[2])


@implements(aten.linalg_lu_solve.default)
def _lu_solve(
    out: torch.Tensor, lu: Node, pivots: Node, b: Node, *, left: bool = True, adjoint: bool = False
) -> Node:
    return prim("lu_solve", lu, pivots, b, left=bool(left), adjoint=bool(adjoint))


@implements(aten.linalg_pinv.atol_rtol_tensor)
def _pinv(
    out: torch.Tensor,
    a: Node,
    *,
    atol: Any = None,
    rtol: Any = None,
    hermitian: bool = False,
) -> Node:
    # torch's own algorithm: drop singular values (|eigenvalues|) at or below
    # max(atol, rtol * largest); rtol defaults to eps * max(m, n) unless atol is given
    shape = tuple(a.shape or ())
    nd = len(shape)
    m, n = shape[-2:]
    if rtol is None:
        eps = torch.finfo(out.dtype).eps
        rtol = eps * max(m, n) if atol is None else 0.0
    if hermitian:
        vals = prim("eigvalsh", a)
        vecs = prim("eigh_vectors", a)
        s = prim("abs", vals)
        left, right = vecs, _mT(vecs, nd)
        largest = prim("amax", s, dims=(-1,), keepdim=True)
    else:
        vals = s = prim("svdvals", a)
        left, right = prim("svd_u", a), prim("svd_vh", a)
        largest = prim("slice", s, dim=-1, start=0, end=1, step=1)
    if min(m, n) == 0:
        return _zeros(out)
    tol = prim("mul", largest, _lift(rtol))
    if atol is not None:
        tol = prim("maximum", tol, _lift(atol))
    # the hermitian form inverts the signed eigenvalues
    inv_s = prim("where", prim("gt", s, tol), prim("reciprocal", vals if hermitian else s), 0.0)
    if hermitian:
        scaled = prim("mul", left, prim("unsqueeze", inv_s, dim=-2))
        return prim("matmul", scaled, right)
    # pinv = V diag(1/s) U^T
    scaled = prim("mul", _mT(right, nd), prim("unsqueeze", inv_s, dim=-2))
    return prim("matmul", scaled, _mT(left, nd))


def _lift(v: Any) -> Any:
    # a tolerance tensor of shape batch broadcasts against (batch, 1)
    if isinstance(v, Node) and v.shape:
        return prim("unsqueeze", v, dim=-1)
    return float(v) if not isinstance(v, Node) else v


@implements(aten._cdist_forward.default)
def _cdist(out: torch.Tensor, x1: Node, x2: Node, p: float, compute_mode: Any = None) -> Node:
    # |x1_i - x2_j|_p computed directly (torch may use a matmul expansion for p = 2,
    # which is less accurate; the direct form is within its tolerances)
    diff = prim("sub", prim("unsqueeze", x1, dim=-2), prim("unsqueeze", x2, dim=-3))
    return _pnorm(prim("abs", diff), float(p), out)


@implements(aten._pdist_forward.default)
def _pdist(out: torch.Tensor, x: Node, p: float = 2.0) -> Node:
    n = (x.shape or (0,))[0]
    rows = [i for i in range(n) for _ in range(i + 1, n)]
    cols = [j for i in range(n) for j in range(i + 1, n)]
    if not rows:
        return _zeros(out)
    a = prim("index_select", x, _index(rows), dim=0)
    b = prim("index_select", x, _index(cols), dim=0)
    return _pnorm(prim("abs", prim("sub", a, b)), float(p), out)


def _index(values: list[int]) -> Node:
    from sdk._remote.graph import constant

    return constant(torch.tensor(values, dtype=torch.int64))


def _pnorm(d: Node, p: float, out: torch.Tensor) -> Node:
    if p == 0:
        nz = prim("convert_element_type", prim("ne", d, 0), dtype=dtype_name(out.dtype))
        return prim("sum", nz, dims=(-1,))
    if math.isinf(p):
        return prim("amax", d, dims=(-1,))
    if p == 1:
        return prim("sum", d, dims=(-1,))
    if p == 2:
        return prim("sqrt", prim("sum", prim("mul", d, d), dims=(-1,)))
    return prim("pow", prim("sum", prim("pow", d, p), dims=(-1,)), 1.0 / p)


def _unpack(out: Any, lu: Node, pivots: Node, unpack_data: bool, unpack_pivots: bool) -> Any:
    """P, L, U from packed LU factors (A = P L U), like torch.lu_unpack."""
    shape = tuple(lu.shape or ())
    m, n = shape[-2:]
    k = min(m, n)
    batch = shape[:-2]
    name = dtype_name(out[1].dtype)
    if unpack_data:
        below = torch.ones(m, k, dtype=torch.bool).tril(-1)
        on_or_above = torch.ones(k, n, dtype=torch.bool).triu()
        from sdk._remote.graph import constant

        lower = prim("slice", lu, dim=-1, start=0, end=k, step=1)
        eye = constant(torch.eye(m, k, dtype=out[1].dtype))
        low = prim("add", prim("where", constant(below), lower, 0.0), eye)
        upper = prim("slice", lu, dim=-2, start=0, end=k, step=1)
        up = prim("where", constant(on_or_above), upper, 0.0)
    else:
        low, up = _zeros(out[1]), _zeros(out[2])
    if not unpack_pivots:
        return _zeros(out[0]), low, up
    # replay LAPACK's row swaps on 0..m-1: row i was exchanged with row pivots[i] - 1
    perm = prim(
        "expand",
        prim("arange", start=0.0, end=float(m), step=1.0, dtype="int64"),
        shape=(*batch, m),
    )
    piv = prim("sub", prim("convert_element_type", pivots, dtype="int64"), 1)
    for i in range(k):
        j = prim("slice", piv, dim=-1, start=i, end=i + 1, step=1)
        at_i = prim("full", shape=(*batch, 1), value=float(i), dtype="int64")
        pi = prim("slice", perm, dim=-1, start=i, end=i + 1, step=1)
        pj = prim("gather", perm, j, dim=-1)
        perm = prim("scatter", prim("scatter", perm, at_i, pj, dim=-1), j, pi, dim=-1)
    # P[r, c] = 1 where perm[c] == r
    rows = prim(
        "reshape", prim("arange", start=0.0, end=float(m), step=1.0, dtype="int64"), shape=(m, 1)
    )
    p = prim("eq", prim("unsqueeze", perm, dim=-2), rows)
    return prim("convert_element_type", p, dtype=name), low, up


@implements(aten.lu_unpack.default)
def _lu_unpack(
    out: Any, lu: Node, pivots: Node, unpack_data: bool = True, unpack_pivots: bool = True
) -> Any:
    return _unpack(out, lu, pivots, bool(unpack_data), bool(unpack_pivots))


@implements(aten.linalg_lu.default)
def _linalg_lu(out: Any, a: Node, *, pivot: bool = True) -> Any:
    if not pivot:
        return NotImplemented
    lu = prim("lu_factor", a)
    lu.shape, lu.dtype = a.shape, a.dtype
    return _unpack(out, lu, prim("lu_pivots", a), True, True)


def _geqrf(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # geqrf has no meta kernel: build torch's output layout (column-major a) by hand
    from sdk._remote.dispatch import _wrap, node_of
    from sdk._remote.tensor import RemoteTensor

    x = args[0]
    if not isinstance(x, RemoteTensor):
        return aten.geqrf.default(*args, **kwargs)
    shape = tuple(x.shape)
    m, n = shape[-2:]
    batch = shape[:-2]
    strides = [0] * len(shape)
    strides[-2], strides[-1] = 1, m
    acc = m * n
    for d in reversed(range(len(batch))):
        strides[d] = acc
        acc *= shape[d]
    a_meta = torch.empty_strided(shape, tuple(strides), dtype=x.dtype, device="meta")
    tau_meta = torch.empty((*batch, min(m, n)), dtype=x.dtype, device="meta")
    node = node_of(x)
    nodes = (prim("geqrf", node), prim("geqrf_tau", node))
    return _wrap((a_meta, tau_meta), nodes, x._source)


SPECIAL[aten.geqrf.default] = _geqrf


implements(aten.linalg_householder_product.default)(
    lambda out, a, tau: prim("householder_product", a, tau)
)
implements(aten.ormqr.default)(
    lambda out, a, tau, other, left=True, transpose=False: prim(
        "ormqr", a, tau, other, left=bool(left), transpose=bool(transpose)
    )
)


@implements(aten.linalg_ldl_factor_ex.default)
def _ldl_factor_ex(
    out: Any, a: Node, *, hermitian: bool = False, check_errors: bool = False
) -> tuple[Node, Node, Node]:
    # real matrices only: hermitian and symmetric are the same thing
    return prim("ldl_factor", a), prim("ldl_pivots", a), _zeros(out[2])


implements(aten.linalg_ldl_solve.default)(
    lambda out, ld, pivots, b, *, hermitian=False: prim("ldl_solve", ld, pivots, b)
)


# -- least squares: torch.linalg.lstsq on public matrices ----------------------------------


def _lstsq_metas(a: torch.Tensor, b: torch.Tensor, driver: str) -> tuple[torch.Tensor, ...]:
    """The four outputs' metadata, as torch's CPU kernel shapes them (it has no meta kernel)."""
    *batch_a, m, n = a.shape
    vector = b.ndim == 1
    *batch_b, _, k = (*b.shape, 1) if vector else b.shape
    batch = tuple(int(d) for d in np.broadcast_shapes(tuple(batch_a), tuple(batch_b)))
    dt = a.dtype
    solution = (*batch, n) if vector else (*batch, n, k)
    residuals = (*batch, k) if driver == "gels" and m > n else (0,)
    rank = batch if driver != "gels" else (0,)

    def meta(shape: tuple[int, ...], dtype: torch.dtype = dt) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device="meta")

    return meta(solution), meta(residuals), meta(rank, torch.int64), meta((0,))


def _lstsq(a: Node, b: Node, metas: tuple[torch.Tensor, ...], rcond: Any) -> tuple[Node, ...]:
    """The minimum-norm least-squares solution ``pinv(A) @ B`` (singular values at or below
    ``rcond`` times the largest dropped), and the rank and residuals torch reports."""
    solution, residuals, rank, singular = metas
    m, n = (a.shape or (0, 0))[-2:]
    vector = _nd(b) == 1
    rhs = prim("unsqueeze", b, dim=-1) if vector else b
    inverse_meta = torch.empty((*(a.shape or ())[:-2], n, m), dtype=solution.dtype, device="meta")
    x = prim("matmul", _pinv(inverse_meta, a, rtol=rcond), rhs)
    outs = [prim("squeeze", x, dims=(-1,)) if vector else x]
    if residuals.numel():  # 'gels', m > n: the squared residuals per column
        fitted = prim("sub", prim("matmul", a, x), rhs)
        outs.append(prim("sum", prim("mul", fitted, fitted), dims=(-2,)))
    else:
        outs.append(_zeros(residuals))
    if rank.numel():
        s = prim("svdvals", a)
        largest = prim("amax", s, dims=(-1,), keepdim=True)
        tol = prim("mul", largest, _lift(rcond if rcond is not None else _default_rcond(a, m, n)))
        outs.append(prim("sum", prim("gt", s, tol), dims=(-1,), dtype="int64"))
    else:
        outs.append(_zeros(rank))
    outs.append(_zeros(singular))
    return tuple(outs)


def _default_rcond(a: Node, m: int, n: int) -> float:
    return torch.finfo(a.dtype or torch.float32).eps * max(m, n)


def _lstsq_special(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from sdk._exceptions import UnsupportedOperationError
    from sdk._remote.dispatch import _to_nodes, _wrap
    from sdk._remote.tensor import RemoteTensor

    a, b = args[0], args[1] if len(args) > 1 else kwargs["b"]
    rcond = args[2] if len(args) > 2 else kwargs.get("rcond")
    driver = kwargs.get("driver") or "gelsy"
    tensors = [t for t in (a, b) if isinstance(t, torch.Tensor)]
    if not any(isinstance(t, RemoteTensor) for t in tensors):
        return aten.linalg_lstsq.default(*args, **kwargs)
    if driver not in ("gelsy", "gels"):
        raise UnsupportedOperationError(
            f"torch.linalg.lstsq with driver={driver!r}: its residuals' shape depends on the "
            "matrix's rank (a value); use the default driver ('gelsy') or 'gels'"
        )
    metas = _lstsq_metas(a, b, driver)
    nodes = _lstsq(_to_nodes(a), _to_nodes(b), metas, rcond)
    source = next(t._source for t in tensors if isinstance(t, RemoteTensor))
    return torch.return_types.linalg_lstsq(_wrap(metas, nodes, source))  # type: ignore[attr-defined]


SPECIAL[aten.linalg_lstsq.default] = _lstsq_special

"""Special functions: gamma family, error-function relatives, Bessel functions, polynomials.

Every prim here follows torch's dtype rules through the same families as the
elementwise prims (bool/int inputs give float32; the binary ones promote their
operands first) and refuses the dtypes torch's CPU kernels refuse (most of
``torch.special`` has no float16/bfloat16 kernel). Kernels are SciPy's, which
evaluate in double precision and round once; torch evaluates float32 in float32,
so results agree within torch's float32 tolerances. The orthogonal polynomials
are not SciPy's: they reproduce torch's own recurrences (same special cases at
``|x| = 1``, same trigonometric shortcut for high degrees, degree truncated
toward zero, negative degree gives 0), evaluated in the result dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.special  # type: ignore[import-untyped,unused-ignore]

from node.engine.dtypes import DEFAULT_FLOAT, DTYPES, opmath
from node.engine.prims.elementwise import _binary, _unary, as_np
from node.engine.prims.registry import (
    REGISTRY,
    Array,
    AttrSpec,
    Call,
    Privacy,
    TensorMeta,
    prim,
)

__all__ = ["MAX_DEGREE", "POLYNOMIALS"]

#: torch has no float16/bfloat16 CPU kernel for these
_NO_LOW = frozenset({"float16", "bfloat16"})


def _with_out(fn: Callable[[Array], Any]) -> Callable[..., Array]:
    def wrapped(x: Array, out: Array | None = None) -> Array:
        r = np.asarray(fn(x)).astype(x.dtype, copy=False)
        if out is None:
            return r
        np.copyto(out, r)
        return out

    return wrapped


def _spherical_j0(x: Array) -> Array:
    return np.asarray(scipy.special.spherical_jn(0, x))


def _airy_ai(x: Array) -> Array:
    return np.asarray(scipy.special.airy(x)[0])


# -- unary -------------------------------------------------------------------------------

for _name, _fn in {"lgamma": scipy.special.gammaln, "digamma": scipy.special.psi}.items():
    _unary(_name, _fn, "float", privacy="public_only")
for _name, _fn in {
    "bessel_i0": scipy.special.i0,
    "bessel_i0e": scipy.special.i0e,
    "bessel_i1": scipy.special.i1,
    "bessel_i1e": scipy.special.i1e,
}.items():
    _unary(_name, _fn, "float", privacy="public_only")
for _name, _fn in {
    "erfcx": scipy.special.erfcx,
    "ndtri": scipy.special.ndtri,
    "log_ndtr": scipy.special.log_ndtr,
    "bessel_j0": scipy.special.j0,
    "bessel_j1": scipy.special.j1,
    "bessel_y0": scipy.special.y0,
    "bessel_y1": scipy.special.y1,
    "modified_bessel_k0": scipy.special.k0,
    "modified_bessel_k1": scipy.special.k1,
    "scaled_modified_bessel_k0": scipy.special.k0e,
    "scaled_modified_bessel_k1": scipy.special.k1e,
    "spherical_bessel_j0": _with_out(_spherical_j0),
    "airy_ai": _with_out(_airy_ai),
}.items():
    _unary(_name, _fn, "float", refused=_NO_LOW, privacy="public_only")


# -- binary ------------------------------------------------------------------------------

_binary("zeta", scipy.special.zeta, "float", refused=_NO_LOW, privacy="public_only")
_binary(
    "igamma",
    scipy.special.gammainc,
    "same",
    refused=frozenset({"bool", "int"}),
    privacy="public_only",
)
_binary(
    "igammac",
    scipy.special.gammaincc,
    "same",
    refused=frozenset({"bool", "int"}),
    privacy="public_only",
)
_binary(
    "nextafter", np.nextafter, "same", refused=frozenset({"bool", "int"}), privacy="public_only"
)
_binary("gcd", np.gcd, "same", refused=frozenset({"bool", "float"}), privacy="public_only")


def _polygamma_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    if c.attr("n") < 0:
        raise c.fail("polygamma is not implemented for n < 0", "n")
    return TensorMeta(x.shape, x.dtype if x.dtype.is_float else DEFAULT_FLOAT)


@prim(
    "polygamma", privacy="public_only", args=1, attrs={"n": AttrSpec("int")}, infer=_polygamma_infer
)
def _polygamma(c: Call, args: list[Any], out: Array | None) -> Array:
    """The n-th derivative of digamma (n = 0 is digamma)."""
    (x,) = args
    res = c.out().dtype
    xv = as_np(x, opmath(res))
    n = c.attr("n")
    if n == 0:
        r = scipy.special.psi(xv)
    elif n == 1:
        r = _trigamma(xv)
    else:
        r = scipy.special.polygamma(n, xv)
    return np.asarray(r).astype(res.np)


def _trigamma(x: Array) -> Array:
    """torch's own trigamma (reflection below 0.5, six recurrence steps, asymptotic series).

    SciPy's is more accurate; torch's float32 version can be 2e-5 off, so reproduce it.
    """
    t = x.dtype.type
    pi = t(np.pi)
    with np.errstate(all="ignore"):
        neg = x < t(0.5)
        s = np.sin(pi * x)
        result = np.where(neg, -(pi * pi) / (s * s), t(0)).astype(x.dtype)
        x = np.where(neg, t(1) - x, x).astype(x.dtype)
        for _ in range(6):
            result = result + t(1) / (x * x)
            x = x + t(1)
        ixx = t(1) / (x * x)
        series = t(1) + t(1) / (t(2) * x) + ixx * (t(1 / 6) - ixx * (t(1 / 30) - ixx * t(1 / 42)))
        result = result + series / x
        return np.asarray(np.where(neg, -result, result), dtype=x.dtype)


# -- orthogonal polynomials (torch's recurrences) ----------------------------------------

#: degrees above this that need the recurrence are refused (bounded compute)
MAX_DEGREE = 4096


def _fma(a: Array, b: Array, c: Array) -> Array:
    """a * b + c rounded once, as torch's CPU kernels compute it (compiled with FMA).

    Exact for float32 (the float64 product of two float32 is exact); float64 rounds twice.
    """
    if a.dtype == np.float32:
        return (a.astype(np.float64) * b + c).astype(np.float32)
    return np.asarray(a * b + c)


class _DegreeError(Exception):
    """A recurrence longer than MAX_DEGREE (turned into an EvaluationError naming the node)."""


def _degree(n: Array) -> Array:
    """torch's ``static_cast<int64_t>(n)``: truncate; non-finite or huge -> negative (x86)."""
    ok = np.isfinite(n) & (np.abs(n) < 2.0**62)
    return np.where(ok, np.trunc(np.where(ok, n, 0)), -1).astype(np.int64)


def _chebyshev(kind: str, shifted: bool) -> Callable[[Array, Array], Array]:
    """T, U, V, W (and their shifted versions on [0, 1]) as torch computes them."""
    trig_above = {"t": 6, "u": 8, "v": 8, "w": 8}[kind]
    if shifted:
        trig_above = 4 if kind == "w" else 6

    def fn(x: Array, n: Array) -> Array:
        t = x.dtype.type
        one = t(1.0)
        y = (x + x - one) if shifted else x
        k = n.astype(x.dtype)  # torch mixes the int64 degree into float arithmetic
        r = np.full(x.shape, np.nan, dtype=x.dtype)
        done = np.zeros(x.shape, dtype=bool)

        def put(mask: Array, val: Any) -> None:
            m = mask & ~done
            r[m] = np.broadcast_to(val, x.shape)[m]
            done[m] = True

        odd = (n % 2) != 0
        put(n < 0, t(0.0))
        # |y| == 1 (x == 1 or x == 0 when shifted)
        pos, neg = (y == one), (y == -one)
        edge = {
            "t": (one, np.where(odd, -one, one)),
            "u": (k + one, np.where(odd, -(k + one), k + one)),
            "v": (one, np.where(odd, -(k + k + one), k + k + one)),
            "w": (k + k + one, np.where(odd, -one, one)),
        }[kind]
        put(pos, edge[0])
        put(neg, edge[1])
        trig = (n > trig_above) & (np.abs(y) < one) & ~done
        if trig.any():
            with np.errstate(all="ignore"):
                th = np.arccos(np.where(trig, y, 0)).astype(x.dtype)
                if kind == "t":
                    val = np.cos(k * th)
                elif kind == "u":
                    s = np.sin(th)
                    val = np.where(
                        s != 0,
                        np.sin((k + one) * th) / s,
                        (k + one) * np.cos((k + one) * th) / y,
                    )
                elif kind == "v":
                    val = np.where(
                        np.sin(th / t(2.0)) != one,
                        np.cos((k + t(0.5)) * th) / np.cos(th / t(2.0)),
                        np.where(odd, -(k + k + one), k + k + one),
                    )
                else:
                    fallback = np.where(odd, -one, one)
                    if not shifted:
                        fallback = np.where(x > 0, k + k + one, fallback)
                    val = np.where(
                        np.cos(th / t(2.0)) != one,
                        np.sin((k + t(0.5)) * th) / np.sin(th / t(2.0)),
                        fallback,
                    )
            put(trig, val.astype(x.dtype))
        q0 = {"t": y, "u": y + y, "v": y + y - one, "w": y + y + one}[kind]
        put(n == 0, one)
        put(n == 1, q0)
        _recur(r, done, n, one, q0, lambda j, p, q, yy: _fma(yy + yy, q, -p), y)
        return r

    return fn


def _recur(
    r: Array,
    done: Array,
    n: Array,
    p0: Any,
    q0: Array,
    step: Callable[[int, Array, Array, Array], Array],
    x: Array,
) -> None:
    """Run ``q_{j+1} = step(j, q_{j-1}, q_j, x)`` for j = 1 .. n - 1 where not yet done."""
    todo = ~done
    if not todo.any():
        return
    idx = np.flatnonzero(todo)
    deg = n.reshape(-1)[idx]
    if deg.max() > MAX_DEGREE:
        raise _DegreeError(f"a polynomial degree above {MAX_DEGREE}")
    order = np.argsort(-deg, kind="stable")  # longest recurrences first: actives are a prefix
    idx, deg = idx[order], deg[order]
    xs = np.broadcast_to(x, r.shape).reshape(-1)[idx]
    q = np.broadcast_to(q0, r.shape).reshape(-1)[idx].copy()
    p = np.full_like(q, p0)
    flat = r.reshape(-1)
    active = len(idx)
    with np.errstate(all="ignore"):
        for j in range(1, int(deg[0])):
            while active and deg[active - 1] <= j:
                active -= 1
            if not active:
                break
            nq = step(j, p[:active], q[:active], xs[:active]).astype(q.dtype, copy=False)
            p[:active], q[:active] = q[:active], nq
    flat[idx] = q
    r[...] = flat.reshape(r.shape)


def _hermite(physicists: bool) -> Callable[[Array, Array], Array]:
    def fn(x: Array, n: Array) -> Array:
        t = x.dtype.type
        limit = 128 if x.dtype == np.float32 else 512
        r = np.full(x.shape, np.nan, dtype=x.dtype)
        done = np.zeros(x.shape, dtype=bool)
        q0 = x + x if physicists else x
        for mask, val in (
            (n < 0, t(0.0)),
            (n == 0, t(1.0)),
            (n == 1, q0),
            (n > limit, t(np.nan)),
        ):
            m = mask & ~done
            r[m] = np.broadcast_to(val, x.shape)[m]
            done |= m
        if physicists:  # torch's k runs over 2, 4, ...: k = 2j
            _recur(r, done, n, t(1.0), q0, lambda j, p, q, xx: _fma(xx + xx, q, -(t(2 * j) * p)), x)
        else:
            _recur(r, done, n, t(1.0), q0, lambda j, p, q, xx: _fma(xx, q, -(t(j) * p)), x)
        return r

    return fn


def _laguerre(x: Array, n: Array) -> Array:
    t = x.dtype.type
    one = t(1.0)
    r = np.full(x.shape, np.nan, dtype=x.dtype)
    done = np.zeros(x.shape, dtype=bool)
    for mask, val in ((n < 0, t(0.0)), (x == 0, one), (n == 0, one), (n == 1, one - x)):
        m = mask & ~done
        r[m] = np.broadcast_to(val, x.shape)[m]
        done |= m
    _recur(
        r,
        done,
        n,
        one,
        one - x,
        lambda j, p, q, xx: _fma(t(j + j) + (one - xx), q, -(t(j) * p)) / t(j + 1),
        x,
    )
    return r


def _legendre(x: Array, n: Array) -> Array:
    t = x.dtype.type
    one = t(1.0)
    r = np.full(x.shape, np.nan, dtype=x.dtype)
    done = np.zeros(x.shape, dtype=bool)
    odd = (n % 2) != 0
    for mask, val in (
        (n < 0, t(0.0)),
        (x == one, one),
        (x == -one, np.where(odd, -one, one)),
        (n == 0, one),
        (n == 1, x),
    ):
        m = mask & ~done
        r[m] = np.broadcast_to(val, x.shape)[m]
        done |= m
    _recur(
        r,
        done,
        n,
        one,
        x,
        lambda j, p, q, xx: _fma(t(j + j + 1) * xx, q, -(t(j) * p)) / t(j + 1),
        x,
    )
    return r


POLYNOMIALS: dict[str, Callable[[Array, Array], Array]] = {
    **{f"chebyshev_polynomial_{k}": _chebyshev(k, False) for k in "tuvw"},
    **{f"shifted_chebyshev_polynomial_{k}": _chebyshev(k, True) for k in "tuvw"},
    "hermite_polynomial_h": _hermite(True),
    "hermite_polynomial_he": _hermite(False),
    "laguerre_polynomial_l": _laguerre,
    "legendre_polynomial_p": _legendre,
}


def _register_polynomial(
    name: str, fn: Callable[[Array, Array], Array], *, privacy: Privacy
) -> None:
    def ufunc(x: Array, n: Array, out: Array | None = None) -> Array:
        x, n = np.broadcast_arrays(x, n)
        r = fn(np.array(x, order="C"), _degree(n))
        if out is None:
            return r
        np.copyto(out, r)
        return out

    _binary(name, ufunc, "float", refused=_NO_LOW, privacy=privacy)
    d = REGISTRY[name]
    kernel = d.kernel

    def guarded(c: Call, args: list[Any], out: Array | None) -> Array:
        try:
            return kernel(c, args, out)
        except _DegreeError as e:
            raise c.eval_error(
                f"{e} needs {MAX_DEGREE}+ steps; refused (bounded compute)", 1
            ) from None

    d.kernel = guarded
    d.flops = lambda c: max(c.out().numel, 1) * MAX_DEGREE  # worst case: every degree at the cap
    d.doc = f"{name}(x, n): torch's recurrence, degree n truncated toward zero"


for _name, _fn in POLYNOMIALS.items():
    _register_polynomial(_name, _fn, privacy="public_only")


# -- frexp ---------------------------------------------------------------------------------


def _frexp_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    if not x.dtype.is_float:
        raise c.fail(f"frexp needs a floating tensor, got {x.dtype.name} (torch refuses it too)", 0)
    return TensorMeta(x.shape, x.dtype if c.op == "frexp_mantissa" else DTYPES["int32"])


@prim("frexp_mantissa", privacy="public_only", args=1, infer=_frexp_infer)
def _frexp_mantissa(c: Call, args: list[Any], out: Array | None) -> Array:
    """m with x = m * 2**e and 0.5 <= |m| < 1 (0, inf and NaN unchanged), like torch.frexp."""
    (x,) = args
    src = x.astype(np.float32) if x.dtype.kind == "V" else x
    return np.asarray(np.frexp(src)[0]).astype(c.out().dtype.np)


@prim("frexp_exponent", privacy="public_only", args=1, infer=_frexp_infer)
def _frexp_exponent(c: Call, args: list[Any], out: Array | None) -> Array:
    """The int32 exponent e of torch.frexp (0 for 0, inf and NaN)."""
    (x,) = args
    src = x.astype(np.float32) if x.dtype.kind == "V" else x
    return np.asarray(np.frexp(src)[1]).astype(np.int32)

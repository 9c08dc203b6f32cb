"""Relations around a max that intervals cannot see: ``x - amax(x) <= 0``,
``sum(exp(x - amax(x))) >= 1`` (softmax) and ``sum(x == amax(x)) >= 1`` (a max's gradient).

The SDK records ``softmax`` and ``log_softmax`` over ``dim`` as

    m = amax(x, dims=(dim,), keepdim=True);  z = x - m;  e = exp(max(z, -512))
    s = sum(e, dims=(dim,))
    softmax = e / s;  log_softmax = z - log(s)

Interval arithmetic treats ``m`` as independent of ``x``, so ``z`` gets the upper bound
``hi(x) - lo(m)``, which is positive and, for logits of a wide public range, large enough
that ``exp`` overflows float32: a small MLP's ``cross_entropy`` was refused as unbounded.
But ``z <= 0`` exactly (``m`` is the maximum of the same values, and amax does not round;
claimed only where no element may be ``+inf`` or NaN, where ``inf - inf`` is NaN),
and the element where ``x`` attains ``m`` has ``z = 0``, so ``e = 1`` there and ``s >= 1``.
That keeps ``log(s)`` in ``[0, log n]``, ``log_softmax`` in ``[lo(z) - log n, 0]`` and
``softmax`` in ``[0, 1]``.

This pass runs after each prim's rule and rounding (:func:`narrow`), recognises the
pattern by node identity (the ``sub`` must subtract the ``amax`` of its own first
argument, the ``sum`` must reduce an ``exp`` of such a difference over the same dims) and
intersects the bounds: it only ever *narrows* what the rules found, with facts that hold
of the engine's computed values as much as of exact ones. ``z <= 0`` survives rounding
(a difference of ``a <= b`` rounds to a value ``<= 0``); for ``s`` only ``s >= 1 - 64 u``
(``u`` the unit roundoff of its dtype) is claimed: the engine's ``exp(0)`` is within 32 ulps
of 1 (its library functions are assumed so, docs/sensitivity.md), one more for a cast, and
a floating-point sum of non-negative terms is at least each of its terms. Each element's
change is then capped at its narrowed width, as every rule's is
(:func:`dpnode.core.privacy.rules.base.finish`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpnode.core.privacy.rounding import unit, wide
from dpnode.core.privacy.rules.base import Ctx
from dpnode.core.privacy.rules.reductions import dims_of
from dpnode.core.privacy.state import Array, State

__all__ = ["narrow"]

#: ``sum(exp(x - amax(x)))`` is at least 1 - this many unit roundoffs, computed or exact
_SUM_SLACK_UNITS = 64


@dataclass(frozen=True)
class _MaxOf:
    """The state is ``amax(x, dims)`` of the tensor at node ``src``, with the reduced dims
    kept as 1s (``keepdim``: by the amax itself or by a reshape after it)."""

    src: int
    dims: tuple[int, ...]
    keepdim: bool = True


@dataclass(frozen=True)
class _IsMax:
    """The state is ``x == amax(x, dims)`` (as bool or cast): some element along the dims
    is the max itself (amax does not round), so a sum over them is at least 1."""

    dims: tuple[int, ...]


@dataclass(frozen=True)
class _Shifted:
    """The state is ``x - amax(x, dims)``, or ``exp`` of it (``exp=True``)."""

    dims: tuple[int, ...]
    exp: bool = False


def narrow(c: Ctx, s: State) -> State:
    """``s``, the state of prim application ``c``, with softmax's relations applied."""
    op = c.node.op
    a = c.args[0] if c.args else None
    if op == "amax" and c.refs and c.refs[0] is not None:
        assert a is not None
        keep = bool(c.call.attrs.get("keepdim"))
        return s.with_(tag=_MaxOf(c.refs[0], dims_of(c, len(a.shape)), keep))
    if a is None:
        return s
    m = c.args[1].tag if len(c.args) == 2 and c.args[1] is not None else None
    if op == "reshape" and isinstance(a.tag, _MaxOf) and not a.tag.keepdim:
        # the reduced dims put back as 1s: the shape amax(keepdim=True) would have had
        kept = [n for i, n in enumerate(s.shape) if i not in a.tag.dims]
        if all(s.shape[d] == 1 for d in a.tag.dims if d < len(s.shape)) and kept == list(a.shape):
            return s.with_(tag=_MaxOf(a.tag.src, a.tag.dims))
    elif op == "sub" and isinstance(m, _MaxOf) and m.keepdim and c.refs[0] == m.src:
        if a.shape == s.shape and _below_infinity(a):
            return _bounded(s, hi=0.0).with_(tag=_Shifted(m.dims))
    elif op == "eq" and len(c.args) == 2 and c.args[1] is not None:
        for x, mx, xref in ((a, m, c.refs[0]), (c.args[1], a.tag, c.refs[1])):
            if isinstance(mx, _MaxOf) and mx.keepdim and xref == mx.src and x.shape == s.shape:
                finite = bool(np.all(np.isfinite(x.lo)) and np.all(np.isfinite(x.hi)))
                if finite:  # no NaN: the max equals one of the elements
                    return s.with_(tag=_IsMax(mx.dims))
    elif op == "convert_element_type" and isinstance(a.tag, _IsMax):
        return s.with_(tag=a.tag)
    elif (
        op == "sum"
        and isinstance(a.tag, _IsMax)
        and a.shape
        and dims_of(c, len(a.shape)) == a.tag.dims
    ):
        return _bounded(s, lo=1.0)  # a count: exact in any dtype that holds it
    elif (
        op == "maximum"
        and isinstance(a.tag, _Shifted)
        and not a.tag.exp
        and s.shape == a.shape
        and _at_most_zero(c.args[1])
    ):
        # a floor below 0 (the SDK's before exp): each max is still 0, exactly
        return s.with_(tag=a.tag)
    elif op == "exp" and isinstance(a.tag, _Shifted) and not a.tag.exp:
        return s.with_(tag=_Shifted(a.tag.dims, exp=True))
    elif (
        op == "sum"
        and isinstance(a.tag, _Shifted)
        and a.tag.exp
        and a.shape
        and dims_of(c, len(a.shape)) == a.tag.dims
    ):
        return _bounded(s, lo=1.0 - _SUM_SLACK_UNITS * unit(c.meta.dtype))
    return s


def _at_most_zero(x: State | None) -> bool:
    """Whether ``x`` is public and nowhere above 0."""
    return x is not None and x.is_public and bool(np.all(np.asarray(x.hi) <= 0.0))


def _below_infinity(x: State) -> bool:
    """Whether no element of ``x`` may be ``+inf`` or NaN, computed or exact: else the max
    may be ``+inf`` and ``inf - inf`` is NaN, not ``<= 0``. (A slice of ``-inf`` only has the
    same NaN; the tracker's bounds of a masked fill do not tell it apart, a known gap.)"""
    lo, hi = wide(x)
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.asarray(hi) < np.inf)) and not bool(np.any(np.isnan(lo)))


def _bounded(s: State, *, lo: float = -np.inf, hi: float = np.inf) -> State:
    """``s`` with its exact and computed bounds intersected with ``[lo, hi]``."""

    def cap(a: Array | None, f: float, upper: bool) -> Array | None:
        if a is None:
            return None
        return np.minimum(a, f) if upper else np.maximum(a, f)

    new_lo, new_hi = np.maximum(s.lo, lo), np.minimum(s.hi, hi)
    width = np.maximum(new_hi - new_lo, 0.0)  # the exact value moves within it
    return s.with_(
        lo=new_lo,
        hi=new_hi,
        clo=cap(s.clo, lo, False),
        chi=cap(s.chi, hi, True),
        L=np.minimum(s.L, width),
        G=np.minimum(s.G, width),
    )

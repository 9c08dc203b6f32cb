"""The rule registry and what every rule shares: the call context, combining and finishing.

A rule maps the states of a prim's arguments to the state of its result. Rules are
keyed by prim name; a prim with no rule makes the tracker refuse any graph that
applies it to private data (safe by default).

``combine`` is the one place where owners, ``L`` and ``G`` of several arguments meet:
given, per argument, a factor ``k_i`` bounding how much the result moves per unit
move of that argument (a Lipschitz constant over the argument's interval, or
``inf`` for a discontinuity), the result moves by at most ``sum_i k_i * d_i``
where ``d_i`` is the argument's own change for the subject being replaced.
``finish`` caps every change at the result's interval width and makes bounds
respect the dtype (integer wrap-around, float overflow to inf).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from dpnode.core.engine.dtypes import DType
from dpnode.core.engine.graph import Node
from dpnode.core.engine.prims.registry import Call, TensorMeta
from dpnode.core.privacy.arrays import recompact
from dpnode.core.privacy.state import (
    MIXED,
    PUBLIC,
    Array,
    PrivacyTrackingError,
    State,
    fit,
    mul0,
)
from dpnode.core.privacy.subjects import all_owned, rows_of, same_values

__all__ = ["RULES", "Ctx", "Rule", "combine", "finish", "rule"]


@dataclass
class Ctx:
    """One prim application as a rule sees it."""

    index: int
    node: Node
    call: Call
    meta: TensorMeta
    #: a state per argument (scalars become public 0-d states; absent args None)
    args: list[State | None]
    #: the raw argument as the kernel takes it: a Python scalar, or None for tensors
    raw: list[Any]
    #: node index of each reference argument (None for scalars and absent args)
    refs: list[int | None]
    nsub: int

    def arg(self, i: int) -> State:
        a = self.args[i] if i < len(self.args) else None
        if a is None:
            raise self.fail(f"argument {i} is required")
        return a

    def fail(self, msg: str) -> PrivacyTrackingError:
        return PrivacyTrackingError(f"node {self.index} ({self.node.op}): {msg}")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.meta.shape


Rule = Callable[[Ctx], State]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Register the decorated function as the privacy rule of the prims ``names``."""

    def deco(fn: Rule) -> Rule:
        for n in names:
            if n in RULES:
                raise AssertionError(f"privacy rule for {n!r} registered twice")
            RULES[n] = fn
        return fn

    return deco


def combine(
    states: Sequence[State], ks: Sequence[Array | float], shape: tuple[int, ...]
) -> tuple[Array, Array, Array]:
    """Owner, ``L`` and ``G`` of a result that moves by at most ``sum_i k_i |d_i|``.

    Mixed arguments move by at most their bound whoever changes, so they do not take the
    owner away: if the owned arguments share one owner ``u`` the result keeps it, with
    ``L = sum_i k_i (L_i if owner_i = u else G_i)`` and ``G = sum_i k_i G_i``. If two
    owned arguments have different owners the result is mixed and its bound is the worst
    subject's: ``sum_i k_i G_i`` plus the largest ``sum_{i owned by s} k_i (L_i - G_i)``.
    """
    owners = [fit(s.owner, shape) for s in states]
    kL = [mul0(k, s.L) for s, k in zip(states, ks, strict=True)]
    kG = [mul0(k, s.G) for s, k in zip(states, ks, strict=True)]
    with np.errstate(invalid="ignore"):
        return _combine(owners, kL, kG, shape)


def _combine(
    owners: list[Array], kL: list[Array], kG: list[Array], shape: tuple[int, ...]
) -> tuple[Array, Array, Array]:
    private = [i for i, o in enumerate(owners) if not _public(o, shape)]
    first = owners[private[0]] if private else None
    if (
        first is not None
        and all_owned(first, shape)
        and all(_same_owner(owners[i], first) for i in private)
    ):
        # one owner per element, shared by every private argument (public ones add 0)
        return first, _total(kL), _total(kG)
    column = next((owners[i] for i in private if rows_of(owners[i], shape) is not None), None)
    if column is not None and all(
        same_values(owners[i], column) or bool(np.all(owners[i] < 0)) for i in private
    ):
        # one subject column, the other arguments owned by nobody (mixed or public): they
        # move by G whoever changes, so the result keeps the column (the general path
        # below gives the same, element by element)
        own_l = [kL[i] if same_values(o, column) else kG[i] for i, o in enumerate(owners)]
        return column, _total(own_l), _total(kG)
    own: Array = fit(np.int64(PUBLIC), shape)  # the owned owner so far (PUBLIC: none yet)
    conflict: Array = np.zeros((), dtype=bool)
    mixed: Array = np.zeros((), dtype=bool)
    for o in owners:
        owned = o >= 0
        conflict = conflict | (owned & (own >= 0) & (o != own))
        own = np.where(owned & (own < 0), o, own)
        mixed = mixed | (o == MIXED)
    base = _total(kG)
    mine: Array = np.zeros(())
    for i, oi in enumerate(owners):
        mine = mine + np.where((oi == own) & (own >= 0), kL[i] - kG[i], 0.0)
    out = np.where(conflict, MIXED, np.where(own >= 0, own, np.where(mixed, MIXED, PUBLIC)))
    if not conflict.any():
        return out, base + mine, base
    extra: Array = np.zeros(())
    for oj in owners:
        cand: Array = np.zeros(())
        for i, oi in enumerate(owners):
            cand = cand + np.where((oi == oj) & (oj >= 0), kL[i] - kG[i], 0.0)
        extra = np.maximum(extra, np.where(oj >= 0, cand, 0.0))
    worst = base + extra
    return out, np.where(conflict, worst, base + mine), np.where(conflict, worst, base)


def _same_owner(o: Array, owned: Array) -> bool:
    """Whether ``o`` equals ``owned`` (every element a subject id) element by element."""
    if same_values(o, owned):
        return True
    if o.size == 1 and int(o.reshape(-1)[0]) < 0:  # mixed or public: never a subject id
        return False
    return bool(np.all(o == owned))


def _public(owner: Array, shape: tuple[int, ...]) -> bool:
    return rows_of(owner, shape) is None and bool(np.all(owner == PUBLIC))


def _total(arrays: list[Array]) -> Array:
    t: Array = np.zeros(())
    for a in arrays:
        t = t + a
    return t


def _dtype_limits(meta: TensorMeta) -> tuple[float, float]:
    d = meta.dtype
    if d.is_bool:
        return 0.0, 1.0
    npd: Any = d.np
    if d.is_int:
        info = np.iinfo(npd)
        return float(info.min), float(info.max)
    return -largest_finite(d), largest_finite(d)


def largest_finite(d: DType) -> float:
    """A float dtype's largest finite value (bfloat16's is 3.3895e38, not float32's)."""
    npd: Any = d.np
    return float(ml_dtypes.finfo(npd).max)  # type: ignore[no-untyped-call]


def finish(
    meta: TensorMeta,
    lo: Array | float,
    hi: Array | float,
    owner: Array,
    L: Array,
    G: Array,
    **extra: Any,
) -> State:
    """A result state: dtype limits applied, changes capped at the width. NaN bounds (the
    result may be NaN: ``inf - inf``, ``0 * inf``, ``inf / inf``) stay NaN for a float result,
    which the tracker carries to everything computed from it and the report refuses; for an
    integer result (a cast of a NaN) they are the dtype's whole range."""
    shape = meta.shape
    with np.errstate(all="ignore"):
        keep_nan = meta.dtype.is_float
        lo = np.asarray(lo, dtype=np.float64)
        hi = np.asarray(hi, dtype=np.float64)
        if not keep_nan:
            lo, hi = np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)
        L = np.where(np.isnan(L), np.inf, np.asarray(L, dtype=np.float64))
        G = np.where(np.isnan(G), np.inf, np.asarray(G, dtype=np.float64))
        dmin, dmax = _dtype_limits(meta)
        if meta.dtype.is_float:
            # beyond the largest finite value the kernel overflows to inf
            lo = np.where(lo < dmin, -np.inf, lo)
            hi = np.where(hi > dmax, np.inf, hi)
        else:
            # an integer result outside the dtype may have wrapped: anything in range. The
            # bounds are float64's: a limit that rounds (int64's 2^63 - 1 is 2^63) is crossed
            # by a bound at it too (a sum whose exact bound was 2^63 wrapped, unseen)
            npd: Any = meta.dtype.np
            info = np.iinfo(npd) if meta.dtype.is_int else None
            below = lo <= dmin if info is not None and int(dmin) != info.min else lo < dmin
            above = hi >= dmax if info is not None and int(dmax) != info.max else hi > dmax
            wrap = below | above
            lo = np.where(wrap, dmin, np.maximum(lo, dmin))
            hi = np.where(wrap, dmax, np.minimum(hi, dmax))
            L = np.where(wrap & (L > 0), np.inf, L)
            G = np.where(wrap & (G > 0), np.inf, G)
        width = np.asarray(hi - lo)
        L = np.minimum(L, width)
        G = np.minimum(G, width)
    own = fit(owner, shape)
    if rows_of(own, shape) is not None:  # a subject column: no public or mixed element
        return State(
            shape,
            meta.dtype,
            fit(lo, shape),
            fit(hi, shape),
            own,
            fit(L, shape),
            fit(G, shape),
            **extra,
        )
    pub = own == PUBLIC
    if pub.any():
        L = np.where(pub, 0.0, L)
        G = np.where(pub, 0.0, G)
    mixed = own == MIXED
    if mixed.any():
        M = np.maximum(L, G)
        L = np.where(mixed, M, L)
        G = np.where(mixed, M, G)
    return State(
        shape,
        meta.dtype,
        _small(lo, shape),
        _small(hi, shape),
        own,
        _small(L, shape),
        _small(G, shape),
        **extra,
    )


#: a state's array with more elements is checked for axes along which it repeats
_LARGE = 1 << 14


def _small(a: Array | float, shape: tuple[int, ...]) -> Array:
    """``a`` fitted to ``shape``, and a large one reduced along the axes where it repeats
    (bounds that are the same on every row, though an operation computed them per row)."""
    f = fit(a, shape)
    return recompact(f) if f.size > _LARGE else f

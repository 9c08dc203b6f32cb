"""The privacy state of one tensor, and the arithmetic every rule shares.

A state describes, from public metadata only, how much each element of a tensor
can move between neighbouring datasets (one subject's records replaced within the
declared bounds). Per element it keeps:

- ``lo``/``hi``: bounds on the value on *any* dataset (interval arithmetic);
- ``owner``: the subject the element mainly depends on, ``MIXED`` (none singled out)
  or ``PUBLIC`` (never changes);
- ``L``: bound on the change when the owner's records are replaced;
- ``G``: bound on the change when any *other* subject's records are replaced
  (for ``MIXED`` elements ``L == G``: any subject).

The rules describe the *exact* result of each prim; ``E`` bounds how far the engine's
floating-point result can be from it (:mod:`dpnode.core.privacy.rounding`).

Optionally a per-subject *joint* bound (``t1[s]``, ``t2[s]``: the L1 and L2 norm of
the whole tensor's change when subject ``s`` is replaced) that is tighter than what
the per-element bounds give, and a finite-domain function table (see
:mod:`dpnode.core.privacy.tables`). Arrays are NumPy broadcast views where possible, so a
column's bounds cost one element, not ``n``. The proof is in ``docs/sensitivity.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from dpnode.core.engine.dtypes import DType
from dpnode.core.errors import GraphError
from dpnode.core.privacy.arrays import fit, recompact, reduce_array
from dpnode.core.privacy.subjects import Subjects, rows_of

if TYPE_CHECKING:
    from dpnode.core.privacy.casts import Casts
    from dpnode.core.privacy.tables import LazyIds, Table

__all__ = [
    "MIXED",
    "PUBLIC",
    "Array",
    "PrivacyTrackingError",
    "State",
    "fit",
    "joint",
    "mul0",
    "public_state",
]

Array: TypeAlias = npt.NDArray[Any]

#: below this, a norm computed from squares may have lost them to underflow
_UNDERFLOW = 1e-150

#: Owner id of an element that depends on several subjects, none singled out.
MIXED = -1
#: Owner id of an element that no subject can move (constants, model weights).
PUBLIC = -2


class PrivacyTrackingError(GraphError):
    """A graph whose sensitivity cannot be bounded soundly (refused before any release)."""

    code = "untrackable_graph"


@dataclass(eq=False)
class State:
    """What the tracker knows about one tensor (see the module docstring)."""

    shape: tuple[int, ...]
    dtype: DType
    lo: Array
    hi: Array
    owner: Array
    L: Array
    G: Array
    #: the value, when every element is public and it could be computed
    value: Array | None = None
    #: per-subject joint L1/L2 bounds on the whole tensor's change (None: derive)
    t1: Array | None = None
    t2: Array | None = None
    table: Table | None = None
    #: value identity: elements with equal ids are copies of one private scalar (inputs
    #: and their moved copies only), the root of threshold tables; an input's ids are
    #: formed lazily (``LazyIds``) until a rule needs them
    vid: Array | LazyIds | None = None
    #: the casts between the root of ``vid`` and these values (None: they are the root's
    #: values); the ids then name the engine's computed casts (:mod:`dpnode.core.privacy.casts`)
    casts: Casts | None = None
    #: partition axes: on every dataset, each slice along them (the other indices fixed)
    #: holds at most one nonzero element (:mod:`dpnode.core.privacy.partitions`)
    part: tuple[int, ...] | None = None
    #: pattern tag for structured rules (e.g. centred moments); never trusted alone
    tag: Any = field(default=None)
    #: per element, a bound on how far the engine's floating-point value can be from the
    #: exact value the other fields describe (None: exact); ``clo``/``chi`` bound the
    #: computed value (see :mod:`dpnode.core.privacy.rounding`)
    E: Array | None = None
    clo: Array | None = None
    chi: Array | None = None
    #: every computed value is an integer (always true of integer and bool dtypes)
    integral: bool = False

    @property
    def is_public(self) -> bool:
        if rows_of(self.owner, self.shape) is not None:  # a subject column: all owned
            return False
        return bool(np.all(self.owner == PUBLIC))

    def with_(self, **kw: Any) -> State:
        return replace(self, **kw)


def mul0(k: Array | float, d: Array | float) -> Array:
    """``k * d`` with ``0 * inf == 0``: an element that cannot move does not move.

    >>> mul0(np.inf, np.array([0.0, 1.0]))
    array([ 0., inf])
    """
    d = np.asarray(d, dtype=np.float64)
    with np.errstate(all="ignore"):
        r = np.asarray(k, dtype=np.float64) * d
    return np.where(d == 0, 0.0, np.where(np.isnan(r), np.inf, r))


def public_state(value: Array, dt: DType) -> State:
    """The state of a public tensor whose value is known."""
    v = np.asarray(value)
    f = v.astype(np.float64) if v.dtype.kind != "V" else v.astype(np.float32).astype(np.float64)
    shape = tuple(int(s) for s in v.shape)
    zero = fit(0.0, shape)
    # bounds that repeat along an axis (a mean's gradient, 1/n on every row) kept once along
    # it, so that the states this constant meets stay compact; the value itself is whole
    f = recompact(f)
    return State(shape, dt, f, f, fit(np.int64(PUBLIC), shape), zero, zero, value=v)


def _fallback(s: State, nsub: int) -> tuple[Array, Array]:
    """Per-subject L1/L2 bounds of the change, from per-element bounds (or the table), and
    from the partition axes (the tighter of the two)."""
    with np.errstate(all="ignore"):  # overflow to inf is a sound (refused) bound
        t1, t2 = fallback_bounds(s, nsub)
        if s.part is not None:
            from dpnode.core.privacy.partitions import bounds

            sliced = bounds(s, nsub)
            if sliced is not None:
                t1, t2 = np.minimum(t1, sliced[0]), np.minimum(t2, sliced[1])
        return t1, t2


def fallback_bounds(s: State, nsub: int) -> tuple[Array, Array]:
    if s.table is not None:
        groups = s.table.group_bounds(s, nsub)
        if groups is not None:  # a table covers every element of its state
            with np.errstate(all="ignore"):
                return groups[0], np.sqrt(groups[1])
    # work on the common fitted shape; each of its elements stands for ``rep`` real ones
    own_f, L_f, G_f = (fit(a, s.shape) for a in (s.owner, s.L, s.G))
    rows = rows_of(own_f, s.shape)
    if rows is not None:
        return _row_bounds(s.shape, rows.axis, rows.subjects, L_f, G_f, nsub)
    cshape = np.broadcast_shapes(own_f.shape, L_f.shape, G_f.shape)
    rep = math.prod(s.shape) // max(math.prod(cshape), 1)
    own = np.broadcast_to(own_f, cshape).reshape(-1)
    L = np.broadcast_to(L_f, cshape).reshape(-1)
    G = np.broadcast_to(G_f, cshape).reshape(-1)
    g = np.where(own != PUBLIC, G, 0.0)
    base1, base2 = rep * float(g.sum()), rep * float((g * g).sum())
    t1: Array = np.full(1, base1)  # per-subject vectors: shape (1,) or (nsub,)
    t2: Array = np.full(1, base2)
    priv = own >= 0
    if priv.any():
        o = own[priv]
        t1 = t1 + rep * np.bincount(o, (L - G)[priv], minlength=nsub)[:nsub]
        t2 = t2 + rep * np.bincount(o, (L * L - G * G)[priv], minlength=nsub)[:nsub]
    with np.errstate(all="ignore"):
        return t1, np.sqrt(np.maximum(t2, 0.0))


def _row_bounds(
    shape: tuple[int, ...], axis: int, subjects: Subjects, L: Array, G: Array, nsub: int
) -> tuple[Array, Array]:
    """``fallback_bounds`` when every element is owned by the subject of its row.

    Subject ``s`` owns the elements of its rows, so ``t1[s] = sum G + sum over its rows of
    the row's sum of (L - G)``; when that row sum does not vary along the rows, a
    subject's share is its row count times it, and nothing of size ``n`` is formed.
    """
    others = tuple(d for d in range(len(shape)) if d != axis)
    base1 = float(reduce_array(G, shape, tuple(range(len(shape)))).sum())
    base2 = float(reduce_array(G * G, shape, tuple(range(len(shape)))).sum())
    per1 = subjects.per_subject(reduce_array(L - G, shape, others))
    per2 = subjects.per_subject(reduce_array(L * L - G * G, shape, others))
    t1 = base1 + subjects.spread(per1, nsub)
    t2 = base2 + subjects.spread(per2, nsub)
    return t1, np.sqrt(np.maximum(t2, 0.0))


def joint(s: State, nsub: int) -> tuple[Array, Array]:
    """Per-subject bounds ``(t1, t2)`` on the L1 and L2 norm of the tensor's change.

    The tighter of the propagated joint bounds (if any) and those derived from the
    per-element bounds. ``nsub`` is the number of subjects (at least 1). Each vector has
    shape ``(nsub,)``, or ``(1,)`` when it is the same for every subject.
    """
    f1, f2 = _fallback(s, max(nsub, 1))
    if s.t1 is not None:
        f1 = np.minimum(f1, s.t1)
    if s.t2 is not None:
        f2 = np.minimum(f2, s.t2)
    # L2 <= L1; fmin: an overflowed (NaN) L2 falls back to L1, and so does one whose
    # squares may have underflowed to 0 (any change below 1e-150)
    return f1, np.where(f2 < _UNDERFLOW, f1, np.fmin(f2, f1))


def has_joint(s: State) -> bool:
    """Whether the state knows more than its per-element bounds tell (a joint bound, a table
    or partition axes)."""
    return has_t(s) or s.table is not None or s.part is not None


def has_t(s: State) -> bool:
    """Whether the state carries propagated per-subject joint bounds."""
    return s.t1 is not None or s.t2 is not None

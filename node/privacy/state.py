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

Optionally a per-subject *joint* bound (``t1[s]``, ``t2[s]``: the L1 and L2 norm of
the whole tensor's change when subject ``s`` is replaced) that is tighter than what
the per-element bounds give, and a finite-domain function table (see
:mod:`node.privacy.tables`). Arrays are NumPy broadcast views where possible, so a
column's bounds cost one element, not ``n``. The proof is in ``docs/sensitivity.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import numpy.typing as npt

from node.engine.dtypes import DType
from node.errors import GraphError

if TYPE_CHECKING:
    from node.privacy.tables import Table

__all__ = [
    "MIXED",
    "PUBLIC",
    "Array",
    "PrivacyTrackingError",
    "State",
    "full",
    "joint",
    "mul0",
    "public_state",
]

Array: TypeAlias = npt.NDArray[Any]

#: Owner id of an element that depends on several subjects, none singled out.
MIXED = -1
#: Owner id of an element that no subject can move (constants, model weights).
PUBLIC = -2


class PrivacyTrackingError(GraphError):
    """A graph whose sensitivity cannot be bounded soundly (refused before any release)."""


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
    #: pattern tag for structured rules (e.g. centred moments); never trusted alone
    tag: Any = field(default=None)

    @property
    def is_public(self) -> bool:
        return bool(np.all(self.owner == PUBLIC))

    def with_(self, **kw: Any) -> State:
        return replace(self, **kw)


def full(a: npt.ArrayLike, shape: Sequence[int]) -> Array:
    """``a`` broadcast to ``shape`` (a read-only view, no copy).

    >>> full(2.0, (2, 3)).shape
    (2, 3)
    """
    return np.broadcast_to(np.asarray(a), tuple(shape))


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
    zero = full(0.0, shape)
    return State(shape, dt, f, f, full(np.int64(PUBLIC), shape), zero, zero, value=v)


def _fallback(s: State, nsub: int) -> tuple[Array, Array]:
    """Per-subject L1/L2 bounds of the change, from per-element bounds (and tables)."""
    own = np.broadcast_to(s.owner, s.shape).reshape(-1)
    L = np.broadcast_to(s.L, s.shape).reshape(-1)
    G = np.broadcast_to(s.G, s.shape).reshape(-1)
    moving = own != PUBLIC
    g = np.where(moving, G, 0.0)
    base1, base2 = float(g.sum()), float((g * g).sum())
    priv = own >= 0
    grouped = np.zeros(own.shape, dtype=bool)
    t1 = np.full(nsub, base1)
    t2 = np.full(nsub, base2)
    if s.table is not None:
        grouped, g1, g2 = s.table.group_bounds(s, nsub)
        t1 += g1
        t2 += g2
    sel = priv & ~grouped
    if sel.any():
        o = own[sel]
        t1 += np.bincount(o, (L - G)[sel], minlength=nsub)[:nsub]
        t2 += np.bincount(o, (L * L - G * G)[sel], minlength=nsub)[:nsub]
    with np.errstate(all="ignore"):
        return t1, np.sqrt(np.maximum(t2, 0.0))


def joint(s: State, nsub: int) -> tuple[Array, Array]:
    """Per-subject bounds ``(t1, t2)`` on the L1 and L2 norm of the tensor's change.

    The tighter of the propagated joint bounds (if any) and those derived from the
    per-element bounds. ``nsub`` is the number of subjects (at least 1).
    """
    f1, f2 = _fallback(s, max(nsub, 1))
    if s.t1 is not None:
        f1 = np.minimum(f1, s.t1)
    if s.t2 is not None:
        f2 = np.minimum(f2, s.t2)
    return f1, np.minimum(f2, f1)


def has_joint(s: State) -> bool:
    """Whether the state knows more than its per-element bounds tell."""
    return s.t1 is not None or s.t2 is not None or s.table is not None

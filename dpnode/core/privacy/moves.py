"""How many elements of a tensor replacing one subject can move, and which values they take.

Statistics that *count* elements rather than add their values are bounded by how many
elements one subject can change, whatever the change: a quantile's score
(:mod:`dpnode.core.dp.selection`) moves by at most one per moved element, and so does a
count of distinct values (replacing one element removes at most one value and adds at most
one). From a state, an element moves when one subject is replaced if the subject owns it
and its ``L`` is not 0, or if its ``G`` is not 0, or if its computed value may differ from
the exact one (``E``: rounding can follow any input); a public element never moves.

:func:`support` is the other half of what a selection needs: a public finite set that
every computed element lies in, when the state knows one (a finite-domain or threshold
table: the values of an integer column, also after a cast to a float dtype that holds
them, or of anything computed from one private scalar per element).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpnode.core.privacy.state import Array, State, fit, joint
from dpnode.core.privacy.subjects import rows_of

__all__ = ["Span", "most", "moved", "moved_together", "owned_alike", "support"]

#: most table entries :func:`support` reads (a column's table is one row of its domain)
_SUPPORT_ENTRIES = 1 << 20


@dataclass(frozen=True, eq=False)
class Span:
    """Where an output's computed values lie, from public metadata: ``[lo, hi]``, whether
    every one is an integer, and the public finite set they lie in when one is known
    (sorted; None: not known)."""

    lo: float
    hi: float
    integral: bool = False
    values: Array | None = None


def _movable(s: State) -> tuple[Array, Array]:
    """Per element, 1 where replacing its owner (then any other subject) may move it."""
    if s.is_public:
        zero = np.zeros(())
        return zero, zero
    rounding_moves = np.asarray(False) if s.E is None else np.asarray(s.E) > 0
    own = np.where((np.asarray(s.L) > 0) | rounding_moves, 1.0, 0.0)
    other = np.where((np.asarray(s.G) > 0) | rounding_moves, 1.0, 0.0)
    return own, other


def _count(s: State, unit: tuple[Array, Array], nsub: int) -> Array:
    """Per subject (shape ``(nsub,)`` or ``(1,)``), the most elements of ``s`` it moves,
    given the masks of :func:`_movable`."""
    if s.is_public:
        return np.zeros(1)
    t1, _ = joint(s.with_(L=unit[0], G=unit[1], t1=None, t2=None, table=None, part=None), nsub)
    return np.ceil(t1)


def moved(s: State, nsub: int) -> Array:
    """Per subject (shape ``(nsub,)``, or ``(1,)`` when alike), the most elements of ``s``
    that replacing it can move (0 for a public state)."""
    return _count(s, _movable(s), nsub)


def moved_together(a: State, b: State, nsub: int) -> Array:
    """:func:`moved` for the elements of two states of one shape read together (a value and
    its group index): an element moves if it moves in either, counted once where both are
    owned alike (a subject's rows), else the two counts add up."""
    if a.is_public and b.is_public:
        return np.zeros(1)
    if owned_alike(a, b):
        (own_a, other_a), (own_b, other_b) = _movable(a), _movable(b)
        both = (np.maximum(own_a, own_b), np.maximum(other_a, other_b))
        return _count(a if not a.is_public else b, both, nsub)
    return moved(a, nsub) + moved(b, nsub)


def most(per_subject: Array) -> int:
    """The largest of per-subject counts (0 for none).

    >>> most(np.array([1.0, 3.0])), most(np.zeros(0))
    (3, 0)
    """
    return math.ceil(float(np.max(per_subject, initial=0.0)))


def owned_alike(a: State, b: State) -> bool:
    """Whether every element of ``a`` and ``b`` has the same owner (or one is public)."""
    if a.is_public or b.is_public:
        return True
    if a.shape != b.shape:
        return False
    ra, rb = rows_of(fit(a.owner, a.shape), a.shape), rows_of(fit(b.owner, b.shape), b.shape)
    if ra is not None and rb is not None:
        return ra.subjects is rb.subjects and ra.axis == rb.axis
    with np.errstate(all="ignore"):
        return bool(
            np.array_equal(np.broadcast_to(a.owner, a.shape), np.broadcast_to(b.owner, b.shape))
        )


def support(s: State) -> Array | None:
    """The sorted public values every computed element of ``s`` lies in, from its table
    (None: no table, or one too large to read). A table holds the engine's own computed
    values for every value of each element's root, and the root always lies in its domain
    (:mod:`dpnode.core.privacy.tables`), so the set depends on public bounds only."""
    t = s.table
    if t is None or s.E is not None or 0 in s.shape:
        return None
    if math.prod(t.vals.shape[:-1]) * t.size > _SUPPORT_ENTRIES:
        return None
    vals = t.full_vals() if t.valid is None else t.full_vals()[..., np.asarray(t.valid, bool)]
    if vals.dtype.kind == "V":  # bfloat16: float32 holds it exactly
        vals = vals.astype(np.float32)
    values = np.unique(np.asarray(vals, dtype=np.float64))
    if values.size == 0 or not np.isfinite(values).all():
        return None
    return values

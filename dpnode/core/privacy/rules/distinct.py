"""The rule of ``count_distinct``: a subject moves the count by the elements it changes.

Replacing one element of ``x`` takes one occurrence of a value away (the count falls by 1
if it was the value's last) and adds one of another (the count rises by 1 if it is new):
the count moves by at most 1, whatever the values, NaN included (every NaN is one value).
Replacing a subject changes at most ``k_s`` elements (:func:`dpnode.core.privacy.moves.moved`:
the elements it owns that may move, those any subject may move, those rounding may move), one
after the other: the count moves by at most ``k_s``. That is the L1 (and L2) sensitivity for
subject ``s``; with one row per subject and the column itself, 1.

Per group (a group index per element, public or not): a changed element, or one whose group
changes, leaves one group (its count falls by at most 1) and enters one (it rises by at most
1): every group's count moves by at most ``k_s`` and all of them by ``2 k_s`` in L1 and
``sqrt(2) k_s`` in L2 (an L1 of ``2 k`` with no element above ``k``), ``k_s`` counting an
element once if either its value or its group may move
(:func:`dpnode.core.privacy.moves.moved_together`). With a public index no element changes
group, and each moves one group's count: ``k_s`` in L1 too.

A count lies in ``[1, min(n, values)]`` for ``n`` elements (``[0, ...]`` per group, which may
be empty), ``values`` being how many values the elements can take when that is known: two
for bool, the integers of the range for integral values, a table's values.
"""

from __future__ import annotations

import math

import numpy as np

from dpnode.core.privacy import moves
from dpnode.core.privacy.rules.base import Ctx, finish, rule
from dpnode.core.privacy.state import MIXED, State

__all__ = ["count_distinct", "key_counts"]


def _values(x: State) -> float:
    """How many values ``x``'s elements can take, from public metadata (inf: unknown)."""
    from dpnode.core.privacy.rounding import integral, wide

    if x.dtype.is_bool:
        return 2.0
    known = moves.support(x)
    if known is not None:
        return float(known.size)
    if not integral(x):
        return math.inf
    lo, hi = wide(x)
    with np.errstate(invalid="ignore"):
        span = math.floor(float(np.max(hi))) - math.ceil(float(np.min(lo))) + 1
    return float(span) if math.isfinite(span) else math.inf


@rule("count_distinct")
def count_distinct(c: Ctx) -> State:
    """A count of distinct values (per group): see the module docstring."""
    x = c.arg(0)
    index = c.args[1] if len(c.args) > 1 else None
    groups = int(c.call.attr("groups"))
    n = math.prod(x.shape)
    if index is None:
        per = moves.moved(x, c.nsub)
        t1 = t2 = per
    else:
        per = moves.moved_together(x, index, c.nsub)
        # an element changes group only if its index may move; else it moves one group's
        spread = 1 if index.is_public else min(groups, 2)
        t1, t2 = spread * per, math.sqrt(spread) * per
    k = float(moves.most(per))
    lo = 0.0 if index is not None or n == 0 else 1.0
    hi = min(float(n), _values(x))
    owner = np.asarray(MIXED, dtype=np.int64)
    s = finish(c.meta, lo, hi, owner, np.asarray(k), np.asarray(k))
    return s.with_(t1=np.asarray(t1, dtype=np.float64), t2=np.asarray(t2, dtype=np.float64))


@rule("key_counts")
def key_counts(c: Ctx) -> State:
    """Which keys private data holds is released only above a noisy threshold, as a
    publish's output by itself (``dpnode.core.dp.keysets``); as an argument it is refused."""
    raise c.fail(
        "the keys of private data are released on their own, above a noisy threshold: "
        "publish key_counts by itself (ds.query().group_by(column).discover_keys(epsilon=..., "
        "delta=...)) and "
        "compute with the released keys"
    )

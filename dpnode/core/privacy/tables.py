"""Finite-domain function tables: joint bounds for one-hot codes and histograms.

Per-element bounds cannot see that a one-hot row changes in at most two places: each
of ``K`` indicators may flip, so they add up to ``K``. When an element is a function of
one private scalar that takes few values (a small integer or bool), we tabulate that
function on the whole domain, with the engine's own kernels. A *group* is every element
that depends on the same root scalar; its joint change is then exactly
``max over value pairs (p, q) of ||f(p) - f(q)||``, computed once per distinct table.

Invariant (all elements of a state with a table): the element equals
``vals[..., k]`` when its root scalar takes the ``k``-th value of the root's domain, the
root's value always lies in that domain, the element's owner is the root's owner and
its ``G`` is 0. Root ids are unique per (node, element), so two tables with equal
roots index the same domain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dpnode.core.privacy.arrays import compact, varying_axes
from dpnode.core.privacy.subjects import (
    KeptByBytes,
    all_owned,
    increasing_flat,
    register_distinct,
    rows_of,
)

if TYPE_CHECKING:
    from dpnode.core.privacy.state import Array, State

__all__ = [
    "MAX_DOMAIN",
    "LazyIds",
    "Table",
    "ids_of",
    "lazy_root_ids",
    "make_root",
    "root_ids",
]

#: Largest root domain tabulated (values of a small integer or bool).
MAX_DOMAIN = 256
_ROOT_SHIFT = 40


@dataclass(eq=False)
class Table:
    """Root ids (int64, broadcastable to the shape) and values (broadcastable to shape + (D,)).

    Integer roots index a per-element domain of values (``bps`` None). Float roots index
    the pieces of the real line cut at the sorted thresholds ``bps`` (see
    :mod:`dpnode.core.privacy.thresholds`); ``valid`` marks the pieces a root value can fall in.
    """

    root: Array
    vals: Array
    bps: Array | None = None
    valid: Array | None = None
    #: float roots: the union of the roots' bounds and their dtype name
    span: tuple[float, float, str] | None = None

    @property
    def size(self) -> int:
        """Columns of the domain (a float table's pieces; may be stored broadcast)."""
        return len(self.valid) if self.valid is not None else int(self.vals.shape[-1])

    def full_vals(self) -> Array:
        """``vals`` with the domain axis at its full length."""
        return np.broadcast_to(self.vals, (*self.vals.shape[:-1], self.size))

    def group_bounds(self, s: State, nsub: int) -> tuple[Array, Array] | None:
        """Per-subject joint L1 and squared-L2 bounds of the change of every element.

        None (no help) when roots and values vary along the same axis, which the cheap
        slice computation does not handle.
        """
        shape = s.shape
        nd = len(shape)
        none = None
        root_ax = varying_axes(self.root, shape, exact=True)
        vals_ax = varying_axes(self.full_vals(), (*shape, self.size), exact=True)[:nd]
        if any(r and v for r, v in zip(root_ax, vals_ax, strict=True)):
            return none
        vb = np.broadcast_to(self.full_vals(), (*shape, self.size))
        block = vb[tuple(slice(None) if v else 0 for v in vals_ax)].reshape(-1, self.size)
        block = block.astype(np.float64)
        if self.valid is not None:
            block = block[:, self.valid]
        copies = int(
            np.prod([n for n, r, v in zip(shape, root_ax, vals_ax, strict=True) if not r and not v])
        )
        best1 = best2 = 0.0
        for p in range(block.shape[1]):
            d = np.abs(block[:, p : p + 1] - block)
            best1 = max(best1, float(d.sum(axis=0).max()))
            best2 = max(best2, float(np.sqrt((d * d).sum(axis=0)).max()))
        slice1, slice2 = copies * best1, np.sqrt(copies) * best2
        pick = tuple(slice(None) if r else 0 for r in root_ax)
        roots = np.broadcast_to(self.root, shape)[pick].reshape(-1)
        owners = np.broadcast_to(s.owner, shape)[pick].reshape(-1)
        once = increasing_flat(roots)  # an input's own ids: each root once, none negative
        if not once and (roots < 0).any():
            return none
        rows = rows_of(owners, owners.shape)
        if rows is not None and once:  # each root on its own row: a subject's row count
            sub = rows.subjects
            g1 = sub.spread(sub.per_subject(np.full(1, slice1)), nsub)
            g2 = sub.spread(sub.per_subject(np.full(1, slice2**2)), nsub)
            return g1, g2
        if (owners < 0).any():
            return none
        if once or roots.size < 2 or bool((np.diff(roots) > 0).all()):  # each root once
            own, counts = owners, np.ones(roots.size, dtype=np.int64)
        else:
            _, first, counts = np.unique(roots, return_index=True, return_counts=True)
            own = owners[first]
        g1 = np.bincount(own, counts * slice1, minlength=nsub)[:nsub]
        g2 = np.bincount(own, counts * slice2**2, minlength=nsub)[:nsub]
        return g1, g2


def make_root(s: State, index: int) -> Table | None:
    """A table rooting every element of an integer/bool state at itself, if its domain is small.

    Needs every element owned by one subject, with ``G == 0``.
    """
    if s.dtype.is_float or not s.shape or 0 in s.shape:
        return None
    if not (all_owned(s.owner, s.shape) and np.all(s.G == 0)):
        return None
    lo = np.ceil(compact(s.lo, s.shape))
    hi = np.floor(compact(s.hi, s.shape))
    lo, hi = np.broadcast_arrays(lo, hi)
    if not (np.isfinite(lo).all() and np.isfinite(hi).all()) or (hi < lo).any():
        return None
    with np.errstate(over="ignore"):  # bounds wider than the largest float: no table
        span = float((hi - lo).max())
    if not span < MAX_DOMAIN:
        return None
    width = int(span) + 1
    dom = np.minimum(lo[..., None] + np.arange(width), hi[..., None])
    vals = dom.astype(s.dtype.np)
    return Table(root_ids(index, s.shape), vals)


class LazyIds:
    """Value ids not formed yet: most inputs are never compared with thresholds.

    ``make`` forms them (once) when a rule needs them.
    """

    def __init__(self, make: Callable[[], Array]) -> None:
        self._make = make
        self._ids: Array | None = None

    def array(self) -> Array:
        if self._ids is None:
            self._ids = self._make()
        return self._ids


def lazy_root_ids(index: int, shape: tuple[int, ...]) -> LazyIds:
    """``root_ids(index, shape)``, formed on first use.

    >>> lazy_root_ids(1, (2,)).array().tolist()
    [1099511627776, 1099511627777]
    """
    return LazyIds(lambda: root_ids(index, shape))


def ids_of(vid: Array | LazyIds) -> Array:
    """A state's value ids as an array."""
    return vid.array() if isinstance(vid, LazyIds) else vid


#: Root ids of recent (node, shape) pairs: a function of public structure only.
_ROOTS: KeptByBytes[tuple[int, tuple[int, ...]], Array] = KeptByBytes(64 * 1024 * 1024)


def root_ids(index: int, shape: tuple[int, ...]) -> Array:
    """Ids unique to each element of node ``index`` (read-only, registered as distinct).

    >>> root_ids(1, (2,)).tolist()
    [1099511627776, 1099511627777]
    """
    n = int(np.prod(shape))

    def make() -> Array:
        ids = (np.int64(index) << _ROOT_SHIFT) + np.arange(n, dtype=np.int64).reshape(shape)
        return register_distinct(ids)

    return _ROOTS.get((index, tuple(shape)), 8 * n, make)

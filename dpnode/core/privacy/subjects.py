"""The subject structure of private rows, and recognising owner arrays that follow it.

Every private input has one subject per row: the dataset's subject index, or row ``i``
is subject ``i``. A :class:`Subjects` holds that index as a read-only *column* with its
structure computed once (rows per subject, whether ids are all distinct, whether rows
of a subject are contiguous). A state's owner array is usually a *view* of the column
laid along one axis (the row axis) and broadcast along the others; elementwise prims,
views and reductions over other axes keep that view.

:func:`rows_of` recognises such a view in O(1) from its memory layout: it shares the
registered column's memory, starts at its first element and steps through it with its
stride along one axis, and is broadcast (stride 0) or of size 1 along every other axis.
The column is read-only and owns its memory (or views immutable bytes), so such a view
holds exactly the column's values: no element needs to be compared. Rules then take
the fast paths (per-subject sums from row counts instead of n-sized bincounts and
sorts); an owner array built any other way takes the general path, with the same result.
``tests/privacy/test_subjects.py`` checks the fast paths against the general ones.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from node.engine.identity import ByIdentity

__all__ = [
    "KeptByBytes",
    "Rows",
    "Subjects",
    "all_owned",
    "distinct_view",
    "first_rows",
    "general_paths",
    "increasing_flat",
    "register_distinct",
    "rows_of",
    "same_values",
]

Array = npt.NDArray[Any]
K = TypeVar("K")
V = TypeVar("V")

_REGISTRY: weakref.WeakValueDictionary[int, Subjects] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
_DISABLED = threading.local()
#: owners recognised as subject columns (a state's owner is asked about many times per
#: prim): the shape asked about, the subjects (weakly) and the axis
_FOUND: ByIdentity[tuple[tuple[int, ...], weakref.ReferenceType[Subjects], int]] = ByIdentity()


@dataclass(frozen=True, eq=False)
class Subjects:
    """One subject id per row, with its structure (build with :meth:`identity` or :meth:`of`).

    >>> s = Subjects.of(np.array([0, 0, 1, 2, 2, 2]))
    >>> s.count, s.distinct, s.contiguous, s.max_rows, s.counts.tolist()
    (3, False, True, 3, [2, 1, 3])
    >>> Subjects.identity(4).counts.tolist()
    [1]
    """

    #: read-only int64 subject id of each row
    column: Array
    #: ids span ``0 .. count - 1``
    count: int
    #: every row is its own subject
    distinct: bool
    #: rows of each subject are contiguous and ids increase (runs in order)
    contiguous: bool
    #: most rows of any subject
    max_rows: int
    #: rows per subject id, shape ``(count,)``, or ``(1,)`` when the same for every id
    counts: Array
    #: for contiguous ids: the first row of each run (``np.add.reduceat`` cuts)
    starts: Array | None

    @functools.cached_property
    def address(self) -> int:
        """Where the column's first element is in memory (views of it start there)."""
        return int(self.column.__array_interface__["data"][0])

    @property
    def rows(self) -> int:
        return int(self.column.shape[0])

    @staticmethod
    def identity(n: int) -> Subjects:
        """Row ``i`` is subject ``i`` (recent ones kept: public structure, not data)."""

        def make() -> Subjects:
            column = np.arange(n, dtype=np.int64)
            column.setflags(write=False)
            ones = np.ones(1, dtype=np.int64)
            return _register(Subjects(column, n, True, True, min(n, 1), ones, None))

        return IDENTITIES.get(n, 8 * n, make)

    @staticmethod
    def of(index: npt.ArrayLike) -> Subjects:
        """The structure of a subject index (non-negative integers, one per row)."""
        a = np.asarray(index)
        wrong = ValueError("a subject index must be one non-negative integer per row")
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise wrong
        column = a.astype(np.int64, copy=False)  # (a uint64 beyond int64 turns negative)
        if not _immutable(column):
            column = column.copy()
            column.setflags(write=False)
        n = column.shape[0]
        if n == 0:
            empty = np.zeros(0, dtype=np.int64)
            return _register(Subjects(column, 0, True, True, 0, empty, None))
        steps = np.diff(column)
        increasing = bool((steps >= 0).all())
        if int(column[0] if increasing else column.min()) < 0:
            raise wrong
        count = int(column[-1] if increasing else column.max()) + 1
        if increasing and bool((steps > 0).all()):
            counts = np.bincount(column, minlength=count)
            every = np.arange(n, dtype=np.int64)
            return _register(Subjects(column, count, True, True, 1, counts, every))
        counts = np.bincount(column, minlength=count)
        starts: Array | None = None
        if increasing:  # the first row of each run of equal ids
            starts = np.concatenate(([0], np.flatnonzero(steps) + 1))
        return _register(
            Subjects(column, count, False, increasing, int(counts.max()), counts, starts)
        )

    def spread(self, v: Array, nsub: int) -> Array:
        """A per-subject vector of this index (``(1,)`` or ``(count,)``) for ``nsub`` ids.

        Ids this index does not use get 0. The result is ``(1,)`` or ``(nsub,)``.
        """
        if self.count == nsub:
            return v
        out = np.zeros(nsub)
        out[: self.count] = v
        return out

    def per_subject(self, per_row: Array) -> Array:
        """``sum`` of ``per_row`` (shape ``(1,)`` or ``(rows,)``) over each subject's rows.

        The result has shape ``(1,)`` when it is the same for every id, else ``(count,)``.

        >>> Subjects.of(np.array([1, 1, 0])).per_subject(np.array([2.0])).tolist()
        [2.0, 4.0]
        """
        v = np.asarray(per_row, dtype=np.float64).reshape(-1)
        if v.shape[0] == 1:
            if self.counts.shape[0] == 1:
                return v * float(self.counts[0])
            return np.asarray(self.counts * v[0])
        if self.distinct and self.count == self.rows and self.contiguous:
            return v  # the identity: subject i is row i
        if self.contiguous and self.starts is not None:
            out = np.zeros(self.count)
            out[self.column[self.starts]] = np.add.reduceat(v, self.starts)
            return out
        return np.bincount(self.column, v, minlength=self.count)


class KeptByBytes(Generic[K, V]):
    """A small LRU of values made from public structure, bounded by their size in bytes.

    Thread-safe; a value larger than the budget is made and returned but not kept.

    >>> kept = KeptByBytes[int, str](10)
    >>> kept.get(1, 6, lambda: "a"), kept.get(2, 6, lambda: "b"), kept.get(1, 6, lambda: "c")
    ('a', 'b', 'c')
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, key: K, nbytes: int, make: Callable[[], V]) -> V:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found[0]
        value = make()
        if nbytes <= self.max_bytes:
            with self._lock:
                if key not in self._items:
                    self._items[key] = (value, nbytes)
                    self._size += nbytes
                while self._size > self.max_bytes:
                    _, (_, old) = self._items.popitem(last=False)
                    self._size -= old
        return value


#: Identity subject columns of recent row counts (8 bytes a row).
IDENTITIES: KeptByBytes[int, Subjects] = KeptByBytes(64 * 1024 * 1024)


def _immutable(a: Array) -> bool:
    """Whether nobody can change ``a``'s values: read-only over immutable bytes or its own."""
    if a.flags.writeable:
        return False
    base: Any = a
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        if base.base is None:
            return False  # owns its memory but someone could flip it back to writeable
        base = base.base
    return isinstance(base, bytes)


def _register(s: Subjects) -> Subjects:
    with _LOCK:
        _REGISTRY[id(s.column)] = s
    return s


@dataclass(frozen=True)
class Rows:
    """An owner array recognised as a subject column laid along ``axis``."""

    subjects: Subjects
    axis: int


def rows_of(owner: Array, shape: Sequence[int]) -> Rows | None:
    """The subject column ``owner`` is a view of, and its axis, if it is one (see module).

    Recognised only for non-empty ``shape``; None means "use the general path".
    """
    if getattr(_DISABLED, "on", False) or not isinstance(owner, np.ndarray):
        return None
    shape = tuple(shape)
    if owner.ndim != len(shape) or owner.size <= 1:  # a one-element owner is no column
        return None
    seen = _FOUND.get(owner)
    if seen is not None and seen[0] == shape:
        subjects = seen[1]()
        if subjects is not None:
            return Rows(subjects, seen[2])
    if math.prod(shape) == 0:
        return None
    base: Any = owner
    found: Subjects | None = None
    while isinstance(base, np.ndarray):
        cand = _REGISTRY.get(id(base))
        if cand is not None and cand.column is base:
            found = base = cand
            break
        base = base.base
    if found is None:
        return None
    col = found.column
    n = col.shape[0]
    if owner.dtype != col.dtype or owner.__array_interface__["data"][0] != found.address:
        return None
    axis: int | None = None
    for d, (m, st) in enumerate(zip(owner.shape, owner.strides, strict=True)):
        if m == 1:
            continue
        if m != shape[d]:
            return None
        if st == 0:  # broadcast along d
            continue
        if axis is not None or m != n or st != col.strides[0]:
            return None
        axis = d
    if axis is None:  # a one-row column: the general path is cheap
        return None
    _FOUND.put(owner, (shape, weakref.ref(found), axis))
    return Rows(found, axis)


#: Arrays of distinct ids (a table's root ids): id of the array -> weak reference to it.
_DISTINCT: ByIdentity[bool] = ByIdentity()


def register_distinct(ids: Array) -> Array:
    """Mark ``ids`` (C-contiguous, every value different, increasing in C order) read-only
    and recognisable by :func:`distinct_view` and :func:`increasing_flat`."""
    if not ids.flags.c_contiguous:
        raise ValueError("distinct ids must be C-contiguous")
    ids.setflags(write=False)
    _DISTINCT.put(ids, True)
    return ids


def _distinct_base(a: Array) -> Array | None:
    if getattr(_DISABLED, "on", False) or not isinstance(a, np.ndarray):
        return None
    base: Any = a
    while isinstance(base, np.ndarray):
        if _DISTINCT.get(base):
            return base
        base = base.base
    return None


def distinct_view(a: Array) -> bool:
    """Whether ``a`` views registered distinct ids (so along any axis of size > 1 and
    nonzero stride its elements differ: they are different elements of the ids)."""
    return _distinct_base(a) is not None


def increasing_flat(a: Array) -> bool:
    """Whether ``a`` is all of a registered distinct-ids array, flat and in order."""
    base = _distinct_base(a)
    return (
        base is not None
        and a.ndim == 1
        and a.size == base.size
        and a.dtype == base.dtype
        and (a.size < 2 or a.strides[0] == base.itemsize)
        and a.__array_interface__["data"][0] == base.__array_interface__["data"][0]
    )


def all_owned(owner: Array, shape: Sequence[int]) -> bool:
    """Whether every element of ``owner`` (broadcast to ``shape``) is a subject id (>= 0)."""
    return rows_of(owner, shape) is not None or bool(np.all(np.asarray(owner) >= 0))


def same_values(a: Array, b: Array) -> bool:
    """Whether two arrays are views of the same memory with the same layout (so equal).

    A cheap sufficient test before comparing elements.
    """
    if a is b:
        return True
    return (
        a.shape == b.shape
        and a.strides == b.strides
        and a.dtype == b.dtype
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    )


@contextmanager
def general_paths() -> Iterator[None]:
    """Within this block (this thread), no owner array is recognised: general paths only.

    For tests that compare the fast paths with the general ones.
    """
    before = getattr(_DISABLED, "on", False)
    _DISABLED.on = True
    try:
        yield
    finally:
        _DISABLED.on = before


def first_rows(ids: npt.ArrayLike | None, rows: int) -> npt.NDArray[np.int64]:
    """Each row labelled by the first row of its subject: the partition, without the ids.

    The public grouping a node binds to ``dataset:<id>/@subject`` (None: one subject a row).

    >>> first_rows(np.array([5, 2, 5, 0]), 4).tolist()
    [0, 1, 0, 3]
    >>> first_rows(None, 3).tolist()
    [0, 1, 2]
    """
    if ids is None:
        return np.arange(rows, dtype=np.int64)
    _, first, inverse = np.unique(np.asarray(ids), return_index=True, return_inverse=True)
    return first[inverse.reshape(-1)].astype(np.int64)

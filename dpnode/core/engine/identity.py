"""Facts about live objects, kept by identity for as long as the object lives.

Graphs and arrays are asked the same question many times (is this graph validated, is this
array a view of a subject column); the answer is attached to the object itself, by ``id``,
through a weak reference that removes the entry when the object dies. Nothing is kept alive,
and a reused ``id`` never finds an older object's entry.
"""

from __future__ import annotations

import weakref
from typing import Any, Generic, TypeVar

__all__ = ["ByIdentity"]

V = TypeVar("V")


class ByIdentity(Generic[V]):
    """A value per live object, looked up by identity (objects must accept weak references).

    >>> import numpy as np
    >>> seen = ByIdentity[str]()
    >>> a = np.zeros(3)
    >>> seen.put(a, "zeros"); seen.get(a), seen.get(np.zeros(3)), len(seen)
    ('zeros', None, 1)
    >>> del a; len(seen)
    0
    """

    def __init__(self) -> None:
        self._items: dict[int, tuple[weakref.ReferenceType[Any], V]] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, obj: object) -> V | None:
        item = self._items.get(id(obj))
        return item[1] if item is not None and item[0]() is obj else None

    def put(self, obj: object, value: V) -> None:
        key = id(obj)
        items = self._items

        def drop(ref: weakref.ReferenceType[Any]) -> None:
            # may run inside a garbage collection anywhere: no lock; an entry of a newer
            # object with the same id is left alone
            item = items.get(key)
            if item is not None and item[0] is ref:
                items.pop(key, None)

        items[key] = (weakref.ref(obj, drop), value)

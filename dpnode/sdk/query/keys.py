"""Group keys: the public cells a query's rows fall in, and each row's cell on the node.

A key column's keys are public metadata: a categorical column's categories, every integer of
an integer (or boolean) column's declared bounds, or the keys the caller declares
(``keys={"age": [30, 40]}``; rows with another value then fall in no cell). Several key
columns make one cell per combination, numbered row-major (the first key varies slowest):
each row's cell is one combined code, and its membership one one-hot row. A row is in at
most one cell, so a replaced row moves out of one cell and into another whatever the
number of cells: the sensitivity does not grow with the cells. The memory does (rows x
cells per part), which :data:`MAX_CELLS` and :data:`MAX_CELL_ELEMENTS` bound.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dpnode.sdk.query.errors import NoPublicKeysError, QueryError, TooManyCellsError
from dpnode.sdk.query.expressions import (
    as_number,
    column_info,
    is_integral,
    value_span,
)

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle

__all__ = ["MAX_CELLS", "MAX_CELL_ELEMENTS", "Key", "cell_index", "cell_members", "resolve_keys"]

#: more cells than this is a histogram of a continuous column, not a group-by
MAX_CELLS = 10_000
#: rows x cells of one part of a release (a float64 each on the node: 1 GiB)
MAX_CELL_ELEMENTS = 1 << 27


@dataclass(frozen=True)
class Key:
    """One key column: its keys (as the result shows them) and codes (as stored).

    ``full``: the codes are every integer from ``codes[0]`` up, covering all the column
    can hold, so a row's index among them is its value less the first (no comparison).
    """

    column: str
    keys: tuple[Any, ...]
    codes: tuple[Any, ...]
    full: bool


def _declared(ds: DatasetHandle, column: str, declared: Sequence[Any]) -> Key:
    info = column_info(ds, column)
    keys = tuple(declared)
    if not keys:
        raise QueryError(f"keys={{{column!r}: []}} declares no key: give at least one")
    if any(keys.index(k) != i for i, k in enumerate(keys)):  # unhashable keys too
        raise QueryError(f"keys={{{column!r}: ...}} lists a key twice: {list(keys)}")
    if info.categories is not None:
        unknown = [k for k in keys if k not in info.categories]
        if unknown:
            raise QueryError(
                f"keys {unknown} are not categories of column {column!r}; its categories "
                f"are {list(info.categories)}"
            )
        return Key(column, keys, tuple(info.categories.index(k) for k in keys), False)
    if any(isinstance(k, str) for k in keys):
        raise QueryError(
            f"column {column!r} is {info.dtype}: its keys are numbers, not {list(keys)}"
        )
    codes = tuple(as_number(info, k) for k in keys)
    lo, hi = value_span(info)
    never = [
        k
        for k, c in zip(keys, codes, strict=True)
        if not lo <= c <= hi or (is_integral(info) and c != int(c))
    ]
    if never:
        raise QueryError(
            f"keys {never} of column {column!r} are values it never holds ({info.dtype} "
            f"in [{info.bounds[0]:g}, {info.bounds[1]:g}]): declare keys among its values"
        )
    return Key(column, keys, codes, False)


def _public(ds: DatasetHandle, column: str) -> Key:
    info = column_info(ds, column)
    if info.categories is not None:
        codes = tuple(range(len(info.categories)))
        return Key(column, tuple(info.categories), codes, True)
    if info.dtype.startswith(("int", "uint", "bool")):
        lo, hi = info.bounds
        if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo + 1 > MAX_CELLS:
            raise NoPublicKeysError(
                f"group_by({column!r}): column {column!r} has bounds [{lo:g}, {hi:g}], "
                f"more than {MAX_CELLS:,} keys: declare the keys to group by, "
                f"group_by({column!r}, keys={{{column!r}: [...]}})"
            )
        ints = tuple(range(math.ceil(lo), math.floor(hi) + 1))
        keys = tuple(bool(k) for k in ints) if info.dtype == "bool" else ints
        return Key(column, keys, ints, True)
    raise NoPublicKeysError(
        f"group_by({column!r}): column {column!r} is {info.dtype}: group by a categorical or "
        f"integer column, whose keys are public, or declare the keys, "
        f"group_by({column!r}, keys={{{column!r}: [...]}})"
    )


def resolve_keys(
    ds: DatasetHandle, columns: Sequence[str], declared: Mapping[str, Sequence[Any]] | None
) -> tuple[Key, ...]:
    """The public keys of each key column.

    Raises:
        UnknownColumnError, NoPublicKeysError, TooManyCellsError, QueryError.
    """
    declared = dict(declared or {})
    extra = [c for c in declared if c not in columns]
    if extra:
        raise QueryError(f"keys= names {extra}, which the query does not group by")
    if len(set(columns)) != len(columns):
        raise QueryError(f"group_by lists a column twice: {list(columns)}")
    out = tuple(_declared(ds, c, declared[c]) if c in declared else _public(ds, c) for c in columns)
    cells = math.prod(len(k.keys) for k in out)
    if cells > MAX_CELLS:
        sizes = " x ".join(f"{len(k.keys)} ({k.column})" for k in out)
        raise TooManyCellsError(
            f"group_by({', '.join(map(repr, columns))}) makes {sizes} = {cells:,} groups, "
            f"more than {MAX_CELLS:,}: group by fewer columns, or declare fewer keys with keys="
        )
    return out


def labels(keys: Sequence[Key]) -> list[tuple[Any, ...]]:
    """Each cell's keys, in cell order (row-major, the first key varying slowest)."""
    return list(itertools.product(*(k.keys for k in keys)))


def _index(ds: DatasetHandle, key: Key) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's index among the key's codes, and where it has one (None: always)."""
    x: torch.Tensor = ds[key.column]
    if key.full:
        first = int(key.codes[0])
        x = x.to(torch.int64)
        return (x - first if first else x), None
    codes = torch.tensor(key.codes, dtype=torch.float64 if x.dtype.is_floating_point else None)
    hit = x.unsqueeze(-1) == codes.to(x.dtype)
    positions = torch.arange(len(key.codes), dtype=torch.int64)
    return (hit.to(torch.int64) * positions).sum(-1), hit.any(-1)


def cell_index(ds: DatasetHandle, keys: Sequence[Key], where: torch.Tensor | None) -> torch.Tensor:
    """Each row's cell, an int64 in ``[0, cells)``, or -1 for a row in none (its key is not
    declared, or ``where`` excludes it)."""
    code: torch.Tensor | None = None
    inside = where
    for key in keys:
        index, hit = _index(ds, key)
        code = index if code is None else code * len(key.keys) + index
        if hit is not None:
            inside = hit if inside is None else inside & hit
    assert code is not None
    if inside is None:
        return code
    # -1 outside: arithmetic rather than a branch per row
    keep = inside.to(torch.int64)
    return (code + 1) * keep - 1


def cell_members(ds: DatasetHandle, keys: Sequence[Key]) -> torch.Tensor:
    """``(rows, cells)`` bool: the one-hot of each row's cell (all false: in none).

    One key compares its column with its codes directly; several compare their combined
    code with the cells' numbers.
    """
    if len(keys) == 1:
        (key,) = keys
        x = ds[key.column]
        codes = torch.tensor(key.codes, dtype=torch.float64 if x.dtype.is_floating_point else None)
        return x.unsqueeze(-1) == codes.to(x.dtype)
    cells = math.prod(len(k.keys) for k in keys)
    return cell_index(ds, keys, None).unsqueeze(-1) == torch.arange(cells, dtype=torch.int64)


def check_memory(rows: int, cells: int, parts: int, what: str) -> None:
    """Refuse a release whose per-row parts would not fit in memory on the node.

    Raises:
        TooManyCellsError: rows x cells x parts above :data:`MAX_CELL_ELEMENTS`.
    """
    if rows * cells * parts > MAX_CELL_ELEMENTS:
        raise TooManyCellsError(
            f"{what}: {rows:,} rows x {cells:,} groups x {parts} parts is more than the "
            f"{MAX_CELL_ELEMENTS:,} values one release may hold per row and group: group by "
            "fewer keys, or ask fewer statistics at once"
        )

"""Columns and predicates: ``col("age") > 30``, ``col("sex") == "F"``, combined with ``& | ~``.

A predicate compares a column with public constants; on the node it becomes a 0/1 weight
per row, multiplied into each row's contribution before that contribution is bounded, so a
filter never changes a shape (the row count stays public) and costs nothing by itself: a
replaced row may enter or leave the filter, which is one row's move like any other.
Categorical columns compare with their category names (``== "F"``, ``isin(["F", "M"])``);
they have no order, so ``<`` on them is refused.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dpnode.sdk.query.errors import AggregateTypeError, QueryError, UnknownColumnError

if TYPE_CHECKING:
    from dpnode.sdk._handles import ColumnInfo, DatasetHandle

__all__ = ["Column", "Predicate", "col", "column_info"]

#: the comparisons a predicate may make, by their Python spelling
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


def column_info(ds: DatasetHandle, name: str) -> ColumnInfo:
    """The public facts of one per-row scalar column.

    Raises:
        UnknownColumnError: no such column (the message lists them).
        AggregateTypeError: a column with a per-row shape (an image, a vector).
    """
    info = ds.columns.get(name)
    if info is None:
        raise UnknownColumnError(
            f"dataset {ds.name!r} has no column {name!r}; its columns are {sorted(ds.columns)}"
        )
    if info.shape:
        raise AggregateTypeError(
            f"column {name!r} holds a {info.shape} tensor per row, not one value: a query "
            f"works on scalar columns (compute on ds[{name!r}] with torch instead)"
        )
    return info


def _code(info: ColumnInfo, value: Any) -> Any:
    """``value`` as the column stores it: a category's index for a categorical column."""
    if info.categories is None:
        if isinstance(value, str):
            raise AggregateTypeError(
                f"column {info.name!r} is {info.dtype}, not categorical: compare it with a "
                f"number, not {value!r}"
            )
        if not (isinstance(value, (int, float, bool)) and not math.isnan(float(value))):
            raise QueryError(f"compare column {info.name!r} with a number, got {value!r}")
        return value
    if value not in info.categories:
        raise QueryError(
            f"{value!r} is not a category of column {info.name!r}; its categories are "
            f"{list(info.categories)}"
        )
    return info.categories.index(value)


class Predicate:
    """A condition on each row, from public constants; combine with ``&``, ``|`` and ``~``."""

    def mask(self, ds: DatasetHandle) -> torch.Tensor:
        """A remote bool tensor ``(rows,)``: where the condition holds."""
        raise NotImplementedError

    def columns(self) -> set[str]:
        """The columns the condition reads."""
        raise NotImplementedError

    def __and__(self, other: Predicate) -> Predicate:
        return _Both(self, _predicate(other), "&")

    def __or__(self, other: Predicate) -> Predicate:
        return _Both(self, _predicate(other), "|")

    def __invert__(self) -> Predicate:
        return _Not(self)

    def __bool__(self) -> bool:
        raise TypeError(
            "a predicate has no truth value here (it is evaluated on the node): combine "
            "predicates with & | ~, not and/or/not"
        )


def _predicate(value: Any) -> Predicate:
    if not isinstance(value, Predicate):
        raise QueryError(f"expected a predicate such as col('age') > 30, got {value!r}")
    return value


@dataclass(frozen=True, eq=False)
class _Compare(Predicate):
    column: str
    op: str
    value: Any

    def mask(self, ds: DatasetHandle) -> torch.Tensor:
        info = column_info(ds, self.column)
        if info.categories is not None and self.op not in ("==", "!="):
            raise AggregateTypeError(
                f"column {self.column!r} is categorical, without an order: use == != or "
                f"col({self.column!r}).isin([...]), not {self.op}"
            )
        return _COMPARE[self.op](ds[self.column], _code(info, self.value))  # type: ignore[no-any-return]

    def columns(self) -> set[str]:
        return {self.column}

    def __repr__(self) -> str:
        return f"col({self.column!r}) {self.op} {self.value!r}"


@dataclass(frozen=True, eq=False)
class _IsIn(Predicate):
    column: str
    values: tuple[Any, ...]

    def mask(self, ds: DatasetHandle) -> torch.Tensor:
        info = column_info(ds, self.column)
        codes = [_code(info, v) for v in self.values]
        x = ds[self.column]
        if not codes:
            return x != x if x.dtype.is_floating_point else torch.zeros_like(x) != 0
        keys = torch.tensor(codes, dtype=torch.float64 if x.dtype.is_floating_point else None)
        return (x.unsqueeze(-1) == keys.to(x.dtype)).any(-1)

    def columns(self) -> set[str]:
        return {self.column}

    def __repr__(self) -> str:
        return f"col({self.column!r}).isin({list(self.values)!r})"


@dataclass(frozen=True, eq=False)
class _Both(Predicate):
    left: Predicate
    right: Predicate
    how: str

    def mask(self, ds: DatasetHandle) -> torch.Tensor:
        a, b = self.left.mask(ds), self.right.mask(ds)
        return a & b if self.how == "&" else a | b

    def columns(self) -> set[str]:
        return self.left.columns() | self.right.columns()

    def __repr__(self) -> str:
        return f"({self.left!r}) {self.how} ({self.right!r})"


@dataclass(frozen=True, eq=False)
class _Not(Predicate):
    inner: Predicate

    def mask(self, ds: DatasetHandle) -> torch.Tensor:
        return ~self.inner.mask(ds)

    def columns(self) -> set[str]:
        return self.inner.columns()

    def __repr__(self) -> str:
        return f"~({self.inner!r})"


@dataclass(frozen=True)
class Column:
    """A column by name, to compare with public constants: ``col("age") > 30``."""

    name: str

    def _compare(self, op: str, value: Any) -> Predicate:
        return _Compare(self.name, op, value)

    def __gt__(self, value: Any) -> Predicate:
        return self._compare(">", value)

    def __ge__(self, value: Any) -> Predicate:
        return self._compare(">=", value)

    def __lt__(self, value: Any) -> Predicate:
        return self._compare("<", value)

    def __le__(self, value: Any) -> Predicate:
        return self._compare("<=", value)

    def __eq__(self, value: Any) -> Predicate:  # type: ignore[override]
        return self._compare("==", value)

    def __ne__(self, value: Any) -> Predicate:  # type: ignore[override]
        return self._compare("!=", value)

    def __hash__(self) -> int:
        return hash(self.name)

    def between(self, low: Any, high: Any) -> Predicate:
        """``low <= column <= high`` (both ends included, as SQL's BETWEEN)."""
        return self._compare(">=", low) & self._compare("<=", high)

    def isin(self, values: Iterable[Any]) -> Predicate:
        """The column equals one of ``values`` (category names for a categorical column)."""
        return _IsIn(self.name, tuple(values))


def col(name: str) -> Column:
    """A column of the queried dataset, by name: ``col("age") > 30``."""
    if not isinstance(name, str):
        raise QueryError(f"col() takes a column name, got {name!r}")
    return Column(name)

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
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpnode.sdk.query.errors import AggregateTypeError, QueryError, UnknownColumnError

if TYPE_CHECKING:
    from dpnode.sdk._handles import ColumnInfo, DatasetHandle

__all__ = [
    "Column",
    "Predicate",
    "as_number",
    "col",
    "column_info",
    "is_integral",
    "value_span",
]

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


def as_number(info: ColumnInfo, value: Any) -> int | float:
    """``value`` as a Python number to compare a numeric column with: a float for a float
    column, an int for an integer column if it is one (a NumPy scalar's value).

    Raises:
        AggregateTypeError: a string against a numeric column, or a boolean against one
            that is not boolean (``True`` is not the number 1 to a query).
        QueryError: anything else that is not a number, or NaN (which no row equals).
    """
    if isinstance(value, str):
        raise AggregateTypeError(
            f"column {info.name!r} is {info.dtype}, not categorical: compare it with a "
            f"number, not {value!r}"
        )
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) and info.dtype != "bool":
        raise AggregateTypeError(
            f"column {info.name!r} is {info.dtype}, not bool: compare it with a number "
            f"({int(value)}), not {value!r}"
        )
    if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        raise QueryError(f"compare column {info.name!r} with a number, got {value!r}")
    if not is_integral(info):  # a float column compares with floats (10**30 as 1e30)
        return float(value) if abs(value) <= _FLOAT_MAX else math.inf if value > 0 else -math.inf
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


_FLOAT_MAX = sys.float_info.max


def is_integral(info: ColumnInfo) -> bool:
    """Whether the column holds whole numbers (integers, booleans, category codes)."""
    return info.dtype.startswith(("int", "uint", "bool"))


def value_span(info: ColumnInfo) -> tuple[float, float]:
    """The values the column can hold: its bounds (an integer column's as ints, within
    int64, so that a comparison with them is exact)."""
    lo, hi = info.bounds
    if is_integral(info):
        return max(math.ceil(lo), -(2**63)), min(math.floor(hi), 2**63 - 1)
    return lo, hi


def _code(info: ColumnInfo, value: Any) -> Any:
    """``value`` as the column stores it: a category's index for a categorical column."""
    if info.categories is None:
        return as_number(info, value)
    if value not in info.categories:
        raise QueryError(
            f"{value!r} is not a category of column {info.name!r}; its categories are "
            f"{list(info.categories)}"
        )
    return info.categories.index(value)


def _always(x: torch.Tensor, truth: bool) -> torch.Tensor:
    """A condition that holds on every row (``truth``) or on none: still a per-row mask,
    so the query's shapes stay what they are."""
    none = torch.zeros_like(x) != 0
    return ~none if truth else none


#: what each comparison says of every row when the constant is above all the column's
#: values (below all of them: the mirror)
_ABOVE_ALL = {">": False, ">=": False, "==": False, "<": True, "<=": True, "!=": True}
_BELOW_ALL = {">": True, ">=": True, "==": False, "<": False, "<=": False, "!=": True}


def _compare(info: ColumnInfo, x: torch.Tensor, op: str, value: int | float) -> torch.Tensor:
    """``x op value`` for a number ``value``, exactly: a constant outside the column's
    bounds decides every row alike (and never meets a dtype it does not fit, 10**30 or
    inf against int64), a fraction against integers becomes the integer it means."""
    lo, hi = value_span(info)
    if value > hi:
        return _always(x, _ABOVE_ALL[op])
    if value < lo:
        return _always(x, _BELOW_ALL[op])
    if isinstance(value, float) and is_integral(info):  # 2.5 against integers
        if op in ("==", "!="):
            return _always(x, op == "!=")
        value = math.ceil(value) if op in (">", ">=") else math.floor(value)
        op = ">=" if op in (">", ">=") else "<="
    return _COMPARE[op](x, value)  # type: ignore[no-any-return]


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
        x = ds[self.column]
        if info.categories is not None:
            return _COMPARE[self.op](x, _code(info, self.value))  # type: ignore[no-any-return]
        return _compare(info, x, self.op, as_number(info, self.value))

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
        if info.categories is None:  # values no row can hold match none: 2.5, 10**30, inf
            lo, hi = value_span(info)
            integral = is_integral(info)
            codes = [v for v in codes if lo <= v <= hi and not (integral and v != int(v))]
        x = ds[self.column]
        if not codes:
            return _always(x, False)
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

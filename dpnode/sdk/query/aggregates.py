"""The aggregates a query computes: ``count()``, ``mean("income")``, ``quantile("hours", 0.9)``...

Each aggregate belongs to one *family*, which decides how it is released:

* ``noised`` (count, sum, mean, var, std): sums over the rows of bounded per-row parts,
  released with additive noise in one publish for the whole query;
* ``selected`` (median, quantile, min, max): selected over the column's public range by
  permute-and-flip, in one publish for all of the query's quantiles;
* ``distinct`` (count_distinct): how many distinct values a column holds, noised in a
  publish of its own (its sensitivity is not a sum of rows').

Names shadow Python's ``sum``, ``min`` and ``max`` on purpose (as Polars' ``pl.sum``): import
the module (``from dpnode.sdk import query as dq``) to keep the builtins at hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dpnode.sdk.query.errors import (
    AggregateTypeError,
    QueryError,
    UnboundedColumnError,
)
from dpnode.sdk.query.expressions import Column, column_info

if TYPE_CHECKING:
    from dpnode.sdk._handles import ColumnInfo, DatasetHandle

__all__ = [
    "FAMILIES",
    "Aggregate",
    "count",
    "count_distinct",
    "max",
    "mean",
    "median",
    "min",
    "quantile",
    "std",
    "sum",
    "var",
]

#: the family of each aggregate kind (see the module docstring)
FAMILIES: dict[str, str] = {
    "count": "noised",
    "sum": "noised",
    "mean": "noised",
    "var": "noised",
    "std": "noised",
    "median": "selected",
    "quantile": "selected",
    "min": "selected",
    "max": "selected",
    "count_distinct": "distinct",
}


@dataclass(frozen=True)
class Aggregate:
    """One statistic of a query: its kind, column, quantile and output name."""

    kind: str
    column: str | None = None
    q: float | None = None
    alias_: str | None = None

    @property
    def family(self) -> str:
        return FAMILIES[self.kind]

    @property
    def name(self) -> str:
        """The output column's name: the alias, else ``count``, ``<column>_<kind>``, or
        ``<column>_q<q>`` for a quantile."""
        if self.alias_ is not None:
            return self.alias_
        if self.column is None:
            return self.kind
        if self.kind == "quantile":
            return f"{self.column}_q{self.q:g}"
        return f"{self.column}_{self.kind}"

    def alias(self, name: str) -> Aggregate:
        """The same aggregate under another output name."""
        if not isinstance(name, str) or not name:
            raise QueryError(f"an alias is a non-empty string, got {name!r}")
        return replace(self, alias_=name)

    def check(self, ds: DatasetHandle) -> ColumnInfo | None:
        """The column's facts, once checked that this aggregate is defined on it.

        Raises:
            UnknownColumnError, AggregateTypeError, UnboundedColumnError.
        """
        if self.column is None:
            return None
        info = column_info(ds, self.column)
        if self.kind == "count_distinct":
            distinct_values(info)
            return info
        if info.categories is not None:
            raise AggregateTypeError(
                f"{self.kind}({self.column!r}): column {self.column!r} is categorical, its "
                f"values are category codes, not numbers: count() per group "
                f"(group_by({self.column!r})) or count_distinct({self.column!r}) instead"
            )
        lo, hi = info.bounds
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise UnboundedColumnError(
                f"{self.kind}({self.column!r}): column {self.column!r} has bounds "
                f"[{lo:g}, {hi:g}], and one row could move the {self.kind} without limit: "
                "ask the dataset's owner to declare finite bounds, or count() rows by a "
                "filter on it instead"
            )
        return info


def distinct_values(info: ColumnInfo) -> int | None:
    """How many values a column can take, from its public metadata: its categories, two
    for bool, the integers in an integer column's bounds; None when unknown (a float or
    unbounded column). ``count_distinct`` stays within it.

    Raises:
        AggregateTypeError: a column with several values per row.
    """
    if info.shape:
        raise AggregateTypeError(
            f"count_distinct({info.name!r}): column {info.name!r} holds {list(info.shape)} "
            "values per row: count distinct values of a column of scalars, or of one "
            "element of it with sdk.count_distinct(ds[column][:, i])"
        )
    if info.categories is not None:
        return len(info.categories)
    if info.dtype == "bool":
        return 2
    lo, hi = info.bounds
    if not info.dtype.startswith(("int", "uint")) or not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    span = math.floor(hi) - math.ceil(lo) + 1  # (``max`` is the aggregate here)
    return span if span > 0 else 1


def _name(column: str | Column) -> str:
    if isinstance(column, Column):
        return column.name
    if not isinstance(column, str):
        raise QueryError(f"an aggregate takes a column name or col(name), got {column!r}")
    return column


def count() -> Aggregate:
    """The number of rows (per group, after the filter)."""
    return Aggregate("count")


def sum(column: str | Column) -> Aggregate:
    """The column's sum."""
    return Aggregate("sum", _name(column))


def mean(column: str | Column) -> Aggregate:
    """The column's mean: a noised sum over a noised count, within the column's bounds."""
    return Aggregate("mean", _name(column))


def var(column: str | Column) -> Aggregate:
    """The column's (population) variance, within ``[0, (width / 2)^2]``."""
    return Aggregate("var", _name(column))


def std(column: str | Column) -> Aggregate:
    """The column's (population) standard deviation: the square root of :func:`var`."""
    return Aggregate("std", _name(column))


def quantile(column: str | Column, q: float) -> Aggregate:
    """The column's ``q`` quantile, selected over its public range."""
    try:
        value = float(q)
    except (TypeError, ValueError):
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise QueryError(f"quantile({_name(column)!r}, {q!r}): q must be a number in [0, 1]")
    return Aggregate("quantile", _name(column), value)


def median(column: str | Column) -> Aggregate:
    """The column's (lower) median, selected over its public range."""
    return Aggregate("median", _name(column), 0.5)


def min(column: str | Column) -> Aggregate:
    """The column's 0 quantile, selected: a noisy low value, not the exact minimum."""
    return Aggregate("min", _name(column), 0.0)


def max(column: str | Column) -> Aggregate:
    """The column's 1 quantile, selected: a noisy high value, not the exact maximum."""
    return Aggregate("max", _name(column), 1.0)


def count_distinct(column: str | Column) -> Aggregate:
    """How many distinct values the column holds (per group, after the filter), noised: of
    any column, floating point included (every NaN is one value, as in ``np.unique``)."""
    return Aggregate("count_distinct", _name(column))

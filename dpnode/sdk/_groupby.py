"""``ds.groupby(key)`` (or a list of keys): statistics per public group, each in one call.

A thin face on the query builder (:mod:`dpnode.sdk.query`), which does the work: the same
graph, mechanisms and receipts as ``ds.query().group_by(...).agg(...).publish(...)``.
``count``, ``sum``, ``mean``, ``var``, ``std`` and ``agg`` release noised sums per group
(one publish; a mean is a noised sum over a noised count, within the bounds), and
``median``, ``quantile``, ``min``, ``max`` select per group by permute-and-flip over the
column's public range (one publish). See docs/statistics.md for the mechanisms and errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dpnode.sdk.query import aggregates as dq
from dpnode.sdk.query.errors import QueryError

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle
    from dpnode.sdk._publish import Receipt
    from dpnode.sdk.query import Aggregate, QueryResult

__all__ = ["GroupStatistics", "Grouped"]

#: what ``agg(column=...)`` accepts, and the aggregate for each
_NOISED = {"mean": dq.mean, "sum": dq.sum, "var": dq.var, "std": dq.std}


class GroupStatistics(dict[Any, Any]):
    """One statistic per group (key -> value), with the publish's ``receipt``."""

    receipt: Receipt


class Grouped:
    """The rows of a dataset grouped by one or more public keys; see the module docstring.

    Args:
        ds: the dataset.
        by: a column, or a list of columns (one group per combination of their keys).
        categories: the keys of a single ``by`` column, when its own are not public (a
            float column) or to keep only some.

    Raises:
        KeyError: no such column (``UnknownColumnError``).
        DPNodeError: a column without public keys, or too many groups (``QueryError``).
    """

    def __init__(self, ds: DatasetHandle, by: str | Sequence[str], categories: Any = None) -> None:
        columns = [by] if isinstance(by, str) else list(by)
        keys = None
        if categories is not None:
            if len(columns) != 1:
                raise QueryError(
                    "categories= gives one key column's keys; with several, pass "
                    "ds.query().group_by(..., keys={column: [...]})"
                )
            keys = {columns[0]: list(categories)}
        self.ds = ds
        self.by: str | list[str] = by if isinstance(by, str) else columns
        self.query = ds.query().group_by(*columns, keys=keys)
        groups = self.query.groups()
        #: each group's key (a tuple of keys when grouped by several columns)
        self.keys: list[Any] = [g[0] for g in groups] if isinstance(by, str) else groups

    def _run(self, aggs: list[Aggregate], epsilon: float, delta: float | None) -> QueryResult:
        return self.query.agg(*aggs).publish(epsilon=epsilon, delta=delta)

    def _column(self, result: QueryResult, name: str, role: str) -> GroupStatistics:
        out = GroupStatistics(zip(self.keys, result.column(name), strict=True))
        out.receipt = next(s.receipt for s in result.receipt.spends if s.role == role)
        return out

    def _one(self, agg: Aggregate, epsilon: float, delta: float | None) -> GroupStatistics:
        result = self._run([agg], epsilon, delta)
        return self._column(result, agg.name, "noised" if agg.family == "noised" else "selected")

    def count(self, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """Rows per group, noised (Laplace; Gaussian with ``delta``)."""
        return self._one(dq.count(), epsilon, delta)

    def sum(self, column: str, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """The column's sum per group, noised."""
        return self._one(dq.sum(column), epsilon, delta)

    def mean(self, column: str, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """The column's mean per group: noised sum over noised count, within the bounds."""
        return self._one(dq.mean(column), epsilon, delta)

    def var(self, column: str, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """The column's population variance per group, within ``[0, (width / 2)^2]``."""
        return self._one(dq.var(column), epsilon, delta)

    def std(self, column: str, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """The column's population standard deviation per group."""
        return self._one(dq.std(column), epsilon, delta)

    def quantile(self, column: str, q: Any, *, epsilon: float) -> GroupStatistics:
        """The column's ``q`` quantile per group (a number, or several: a list per group),
        selected by permute-and-flip over the column's public range (pure epsilon; several
        quantiles share ``epsilon`` equally).

        Raises:
            QueryError: a ``q`` outside [0, 1].
        """
        several = isinstance(q, (list, tuple))
        qs = list(q) if several else [q]
        try:
            aggs = [dq.quantile(column, float(v)).alias(f"q{i}") for i, v in enumerate(qs)]
        except (TypeError, ValueError):
            raise QueryError(
                f"q must be a number or a list of numbers in [0, 1], got {q!r}"
            ) from None
        if not aggs:
            raise QueryError("q must be a number or a list of numbers in [0, 1], got []")
        result = self._run(aggs, epsilon, None)
        columns = [result.column(a.name) for a in aggs]
        values = [list(v) for v in zip(*columns, strict=True)] if several else columns[0]
        out = GroupStatistics(zip(self.keys, values, strict=True))
        out.receipt = result.receipt.spends[0].receipt
        return out

    def median(self, column: str, *, epsilon: float) -> GroupStatistics:
        """The column's (lower) median per group, selected as :meth:`quantile`."""
        return self._one(dq.median(column), epsilon, None)

    def min(self, column: str, *, epsilon: float) -> GroupStatistics:
        """The column's 0 quantile per group: a noisy low value, not the exact minimum."""
        return self._one(dq.min(column), epsilon, None)

    def max(self, column: str, *, epsilon: float) -> GroupStatistics:
        """The column's 1 quantile per group: a noisy high value, not the exact maximum."""
        return self._one(dq.max(column), epsilon, None)

    def agg(
        self, *, epsilon: float, delta: float | None = None, **statistics: str
    ) -> dict[str, GroupStatistics]:
        """Several noised statistics per group in one publish, charged once:
        ``agg(bmi="mean", age="sum", epsilon=1.0)``; the result also has ``"count"``.

        Raises:
            QueryError: a statistic other than mean, sum, var or std, or none asked.
        """
        if not statistics:
            raise QueryError('agg needs at least one column="mean" (or "sum", "var", "std")')
        for column, how in statistics.items():
            if how not in _NOISED:
                raise QueryError(
                    f'{column}={how!r}: a statistic is "mean", "sum", "var" or "std" (medians '
                    "and quantiles per group are selected, not noised: .median(column) or "
                    ".quantile(column, q), or ds.query().group_by(...).agg(median(column)))"
                )
        aggs = [_NOISED[how](column).alias(column) for column, how in statistics.items()]
        result = self._run([dq.count(), *aggs], epsilon, delta)
        out = {column: self._column(result, column, "noised") for column in statistics}
        out["count"] = self._column(result, "count", "noised")
        return out

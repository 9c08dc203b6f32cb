"""``ds.describe(epsilon=...)``: pandas' describe, released in two publishes.

Per numeric column with finite bounds: ``count`` (the row count: public, exact), ``mean``
and ``std`` (one noised publish for all columns: two parts per row and column), ``min``,
``25%``, ``50%``, ``75%`` and ``max`` (one selected publish for all: quantiles 0, 0.25, 0.5,
0.75 and 1, selected over each column's public range). The budget splits as any query's,
by the values each publish releases: 2 against 5 per column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dpnode.sdk.query.aggregates import Aggregate, max, mean, min, quantile, std
from dpnode.sdk.query.errors import QueryError
from dpnode.sdk.query.expressions import column_info
from dpnode.sdk.query.result import QueryResult

if TYPE_CHECKING:
    from dpnode.sdk._handles import ColumnInfo, DatasetHandle

__all__ = ["describe"]

#: pandas' rows, and the aggregate for each
_STATISTICS = {
    "mean": mean,
    "std": std,
    "min": min,
    "25%": lambda c: quantile(c, 0.25),
    "50%": lambda c: quantile(c, 0.5),
    "75%": lambda c: quantile(c, 0.75),
    "max": max,
}


def _described(info: ColumnInfo) -> bool:
    lo, hi = info.bounds
    return (
        not info.shape
        and info.categories is None
        and info.dtype != "bool"
        and math.isfinite(lo)
        and math.isfinite(hi)
    )


def describe(
    ds: DatasetHandle,
    *,
    epsilon: float,
    delta: float | None = None,
    columns: Sequence[str] | None = None,
) -> QueryResult:
    """See :meth:`dpnode.sdk.DatasetHandle.describe`; one row per column described, with
    each statistic's noise scale beside it (``mean_scale``, ...)."""
    if columns is not None:
        if isinstance(columns, str):
            columns = [columns]
        for name in columns:
            if not _described(column_info(ds, name)):
                raise QueryError(
                    f"column {name!r} cannot be described: describe takes numeric columns "
                    "with finite bounds; count() rows per category with "
                    "ds.query().group_by(...) instead"
                )
        columns = list(dict.fromkeys(columns))
    else:
        columns = [name for name, info in ds.columns.items() if _described(info)]
    if not columns:
        raise QueryError(
            f"dataset {ds.name!r} has no numeric column with finite bounds to describe: "
            "count() rows per category with ds.query().group_by(...) instead"
        )
    aggs: list[Aggregate] = []
    for c in columns:
        aggs += [make(c).alias(f"{label} of {c}") for label, make in _STATISTICS.items()]
    from dpnode.sdk.query.aggregates import count

    wide = ds.query().agg(count(), *aggs).publish(epsilon=epsilon, delta=delta)
    (row,) = wide.rows()
    out_columns = ["column", "count"]
    for label in _STATISTICS:
        out_columns += [label, f"{label}_scale"]
    rows = []
    bars = {
        label: [wide.error_bars[f"{label} of {c}"][0] for c in columns] for label in _STATISTICS
    }
    bars["count"] = [None] * len(columns)
    for c in columns:
        values: list[object] = [c, row["count"]]
        for label in _STATISTICS:
            values += [row[f"{label} of {c}"], row[f"{label} of {c}_scale"]]
        rows.append(tuple(values))
    return QueryResult(out_columns, rows, wide.receipt, bars)

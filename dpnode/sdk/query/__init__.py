"""Statistics on a table, the way analysts write them: filters, group keys, aggregates.

>>> from dpnode.sdk.query import col, count, mean, median
>>> (ds.query().filter(col("age") > 30).group_by("education", "sex")  # doctest: +SKIP
...    .agg(count(), mean("income"), median("hours")).publish(epsilon=1.0))

Compiled to remote tensors and released by ``sdk.publish``: the same graph, tracker, noise,
budget and ledger as any torch code. See ``docs/statistics.md``.
"""

from dpnode.sdk.query.aggregates import (
    Aggregate,
    count,
    count_distinct,
    max,
    mean,
    median,
    min,
    quantile,
    std,
    sum,
    var,
)
from dpnode.sdk.query.errors import (
    AggregateTypeError,
    InvalidBudgetError,
    NoPublicKeysError,
    QueryError,
    TooManyCellsError,
    UnboundedColumnError,
    UnknownColumnError,
)
from dpnode.sdk.query.expressions import Column, Predicate, col
from dpnode.sdk.query.plan import Query
from dpnode.sdk.query.result import QueryReceipt, QueryResult, Spend

__all__ = [
    "Aggregate",
    "AggregateTypeError",
    "Column",
    "InvalidBudgetError",
    "NoPublicKeysError",
    "Predicate",
    "Query",
    "QueryError",
    "QueryReceipt",
    "QueryResult",
    "Spend",
    "TooManyCellsError",
    "UnboundedColumnError",
    "UnknownColumnError",
    "col",
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

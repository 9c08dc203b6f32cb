"""Why a query is refused, before anything is sent or charged.

QueryError(DPNodeError)              a query that cannot be released as written
├── UnknownColumnError (+ KeyError)  no such column (the message lists them)
├── UnboundedColumnError             a statistic of a column without finite declared bounds
├── NoPublicKeysError                a group key whose keys are not public (pass ``keys=``)
├── TooManyCellsError                more groups, or rows x groups, than a query may hold
├── InvalidBudgetError               epsilon or delta that is not a finite positive number
└── AggregateTypeError               an aggregate or a predicate not defined on a column's dtype

Every message names the construct refused and what to write instead.
"""

from __future__ import annotations

from dpnode.sdk._exceptions import DPNodeError

__all__ = [
    "AggregateTypeError",
    "InvalidBudgetError",
    "NoPublicKeysError",
    "QueryError",
    "TooManyCellsError",
    "UnboundedColumnError",
    "UnknownColumnError",
]


class QueryError(DPNodeError):
    """A query refused by the SDK before any request: nothing was charged."""

    code = "invalid_query"


class UnknownColumnError(QueryError, KeyError):
    """No column of that name (also a ``KeyError``, as ``ds["nope"]`` raises)."""

    def __str__(self) -> str:
        return self.detail


class UnboundedColumnError(QueryError):
    """A sum, mean, spread or quantile of a column whose declared bounds are not finite."""


class NoPublicKeysError(QueryError):
    """A group key whose possible values are not public metadata."""


class TooManyCellsError(QueryError):
    """More groups than a query may hold, or more rows x groups than fit in memory."""


class InvalidBudgetError(QueryError):
    """An epsilon or delta that is not a finite number > 0."""


class AggregateTypeError(QueryError):
    """An aggregate (or a comparison) that is not defined on the column's dtype."""

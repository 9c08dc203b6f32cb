"""The exceptions ``client.sql`` raises, all before anything is sent to the node.

QueryError                          the query builder's refusals (dpnode.sdk.query.errors)
└── SQLError                        a statement refused: nothing was charged
    ├── SQLSyntaxError              sqlglot cannot parse it (``line``, ``column``)
    ├── UnsupportedSQLError         a construct with no DP counterpart (``construct``)
    └── UnknownTableError           no such dataset (also a NotFoundError)

An unknown column is the builder's ``UnknownColumnError``, as for ``col("nope")``.
"""

from __future__ import annotations

from sqlglot import exp

from dpnode.sdk._exceptions import NotFoundError
from dpnode.sdk.query.errors import QueryError

__all__ = [
    "SQLError",
    "SQLSyntaxError",
    "UnknownTableError",
    "UnsupportedSQLError",
    "refuse",
    "shown",
]


class SQLError(QueryError):
    """A SQL statement refused before anything was sent to the node: nothing was charged."""

    code = "invalid_sql"


class SQLSyntaxError(SQLError):
    """sqlglot could not parse the statement; ``line`` and ``column`` say where (1-based)."""

    code = "sql_syntax"
    line: int | None = None
    column: int | None = None


class UnsupportedSQLError(SQLError):
    """A construct this SQL does not translate; ``construct`` names it, the message says what
    to do instead."""

    code = "unsupported_sql"
    construct: str = ""


class UnknownTableError(SQLError, NotFoundError):
    """No dataset of that name; the message lists those you can read."""

    code = "unknown_table"


def refuse(construct: str, instead: str) -> UnsupportedSQLError:
    """The refusal of ``construct``, saying what to do ``instead``."""
    error = UnsupportedSQLError(f"{construct} is not supported: {instead}")
    error.construct = construct
    return error


def shown(node: exp.Expr) -> str:
    """A node's SQL, shortened for a message.

    >>> shown(exp.column("income") * 2)
    'income * 2'
    """
    text = node.sql()
    return text if len(text) <= 60 else text[:57] + "..."

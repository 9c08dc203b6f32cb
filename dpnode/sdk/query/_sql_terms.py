"""The terms of a SELECT statement: its columns, constants, WHERE conditions and aggregates,
each translated into the query builder's own (``col("age") > 30``, ``mean("income")``) by a
table of rules keyed by sqlglot's node type.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from dpnode.sdk import query as builder
from dpnode.sdk.query._sql_errors import UnknownTableError, refuse, shown
from dpnode.sdk.query.errors import UnknownColumnError

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle

__all__ = ["SUPPORTED", "Constant", "Table", "aggregate", "constant", "predicate"]

Constant = int | float | str | bool


# -- names and constants ---------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """The dataset a statement reads, and the names SQL may qualify its columns with."""

    ds: DatasetHandle
    names: frozenset[str]

    def column(self, node: exp.Expr, where: str) -> str:
        """The dataset column ``node`` names (exact, else a unique case-insensitive match when
        unquoted).

        Raises:
            UnsupportedSQLError: ``node`` is not a column.
            UnknownTableError: a column qualified by another table's name.
            UnknownColumnError: no such column (the message lists them).
        """
        if not isinstance(node, exp.Column) or not isinstance(node.this, exp.Identifier):
            raise refuse(f"{shown(node)} in {where}", f"{where} takes a column of the dataset")
        if node.table and node.table not in self.names:
            raise UnknownTableError(
                f"{shown(node)}: the statement reads one dataset, {self.ds.name!r}"
            )
        name = node.name
        if name in self.ds.columns:
            return name
        if not node.this.quoted:
            same = [c for c in self.ds.columns if c.lower() == name.lower()]
            if len(same) == 1:
                return same[0]
        raise UnknownColumnError(
            f"no column {name!r} in dataset {self.ds.name!r}; its columns: "
            + ", ".join(self.ds.columns)
        )


def constant(node: exp.Expr) -> Constant:
    """A public constant: a number, a string or a boolean.

    >>> constant(-exp.Literal.number(2.5)), constant(exp.Literal.string("F"))
    (-2.5, 'F')

    Raises:
        UnsupportedSQLError: anything else (NULL, arithmetic, a column, a function).
    """
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Null):
        raise refuse(
            "NULL",
            "datasets hold no missing values (the node refuses or fills them at upload)",
        )
    numeric = isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal)
    if isinstance(node, exp.Boolean) or (isinstance(node, exp.Literal) or numeric):
        if numeric and node.this.is_string:
            raise refuse(f"{shown(node)}", "negate a number, not a string")
        value = node.to_py()
        return float(value) if isinstance(value, Decimal) else value
    raise refuse(
        f"{shown(node)} as a constant",
        "compare a column with a number, a string or TRUE/FALSE",
    )


# -- WHERE -----------------------------------------------------------------------------------

_COMPARE: dict[type[exp.Expr], Callable[[Any, Any], Any]] = {
    exp.GT: operator.gt,
    exp.GTE: operator.ge,
    exp.LT: operator.lt,
    exp.LTE: operator.le,
    exp.EQ: operator.eq,
    exp.NEQ: operator.ne,
}
#: ``30 < age`` is ``age > 30``
_FLIPPED: dict[type[exp.Expr], type[exp.Expr]] = {
    exp.GT: exp.LT,
    exp.GTE: exp.LTE,
    exp.LT: exp.GT,
    exp.LTE: exp.GTE,
    exp.EQ: exp.EQ,
    exp.NEQ: exp.NEQ,
}


#: names SQL reads as columns that a user means as numbers, and what to write instead
_NOT_NUMBERS = {
    "nan": "no value equals NaN; compare the column with a number",
    "infinity": "compare with a number beyond the column's bounds (e.g. 1e308), or leave the "
    "condition out",
    "inf": "compare with a number beyond the column's bounds (e.g. 1e308), or leave the "
    "condition out",
}


def predicate(table: Table, node: exp.Expr) -> Any:
    """The builder's predicate for a WHERE condition."""
    rule = _PREDICATES.get(type(node))
    if rule is not None:
        return rule(table, node)
    if type(node) in _COMPARE:
        return _comparison(table, node)
    if isinstance(node, exp.Column):
        name = table.column(node, "WHERE")
        if table.ds.columns[name].dtype != "bool":
            raise refuse(
                f"WHERE {name}",
                f"a condition compares a column with a constant, e.g. {name} > 0",
            )
        return builder.col(name) == True  # noqa: E712  (the builder's predicate, not a bool)
    raise refuse(
        f"{shown(node)} in WHERE",
        "WHERE takes comparisons of a column with a constant (=, <>, <, <=, >, >=), BETWEEN, "
        "IN (...), combined with AND, OR, NOT and parentheses",
    )


def _comparison(table: Table, node: exp.Expr) -> Any:
    kind, left, right = type(node), node.this, node.expression
    if not isinstance(left, exp.Column) and isinstance(right, exp.Column):
        kind, left, right = _FLIPPED[kind], right, left
    for side in (left, right):
        if isinstance(side, exp.Func | exp.Binary) and side.find(exp.Column):
            raise refuse(
                f"a function or arithmetic on a column in WHERE ({shown(side)})",
                "compare the column itself with a constant (e.g. age > 29, not age + 1 > 30)",
            )
    if isinstance(right, exp.Column):
        if not right.table and right.name.lower() in _NOT_NUMBERS:
            raise refuse(f"{right.name} as a constant", _NOT_NUMBERS[right.name.lower()])
        table.column(right, "WHERE")  # a name that is no column is refused as such
        raise refuse(
            f"a comparison of two columns ({shown(node)})",
            "compare a column with a constant",
        )
    return _COMPARE[kind](builder.col(table.column(left, "WHERE")), constant(right))


def _between(table: Table, node: exp.Expr) -> Any:
    name = table.column(node.this, "BETWEEN")
    return builder.col(name).between(constant(node.args["low"]), constant(node.args["high"]))


def _isin(table: Table, node: exp.Expr) -> Any:
    if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
        raise refuse(f"{shown(node)}", "IN takes a list of constants: IN ('a', 'b')")
    name = table.column(node.this, "IN")
    return builder.col(name).isin([constant(v) for v in node.expressions])


def _refused_test(construct: str, instead: str) -> Callable[[Table, exp.Expr], Any]:
    def refused(table: Table, node: exp.Expr) -> Any:
        raise refuse(f"{construct} ({shown(node)})", instead)

    return refused


_PREDICATES: dict[type[exp.Expr], Callable[[Table, exp.Expr], Any]] = {
    exp.And: lambda t, n: predicate(t, n.this) & predicate(t, n.expression),
    exp.Or: lambda t, n: predicate(t, n.this) | predicate(t, n.expression),
    exp.Not: lambda t, n: ~predicate(t, n.this),
    exp.Paren: lambda t, n: predicate(t, n.this),
    exp.Between: _between,
    exp.In: _isin,
    exp.Is: _refused_test(
        "IS", "datasets hold no missing values; compare with = TRUE / = FALSE for booleans"
    ),
    exp.Like: _refused_test(
        "LIKE", "list the values with IN (...); ds.columns[name].categories names them"
    ),
    exp.ILike: _refused_test(
        "ILIKE", "list the values with IN (...); ds.columns[name].categories names them"
    ),
}

# -- aggregates ------------------------------------------------------------------------------


def _argument(table: Table, node: exp.Expr, call: exp.Expr) -> str:
    """The one column an aggregate call takes."""
    if isinstance(node, exp.Distinct):
        raise refuse(
            f"DISTINCT inside {shown(call)}",
            "COUNT(DISTINCT column) is the only distinct aggregate",
        )
    if not isinstance(node, exp.Column) or call.expressions:
        raise refuse(
            f"an expression in an aggregate ({shown(call)})",
            "aggregates take one column; compute with the released numbers afterwards (e.g. "
            "SUM(income) * 2), or with remote tensors (ds['income'] * 2).publish(...)",
        )
    return table.column(node, shown(call))


def _fraction(node: exp.Expr, call: exp.Expr) -> float:
    value = constant(node)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise refuse(f"{shown(call)}", "a quantile is a number between 0 and 1")
    return float(value)


def _count(table: Table, node: exp.Expr) -> Any:
    inner = node.this
    if isinstance(inner, exp.Distinct) and len(inner.expressions) == 1 and not node.expressions:
        return builder.count_distinct(table.column(inner.expressions[0], shown(node)))
    if isinstance(inner, exp.Star) and not node.expressions:
        return builder.count()
    # COUNT(column) counts the rows: datasets hold no missing values
    _argument(table, inner, node)
    return builder.count()


def _within_group(table: Table, node: exp.Expr) -> Any:
    """``PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY column [DESC])``."""
    call, order = node.this, node.expression
    keys = order.expressions if isinstance(order, exp.Order) else []
    if not isinstance(call, exp.PercentileCont | exp.PercentileDisc) or len(keys) != 1:
        raise refuse(
            f"{shown(node)}", "WITHIN GROUP takes PERCENTILE_CONT(q) (ORDER BY one column)"
        )
    q = _fraction(call.this, node)
    column = table.column(keys[0].this, shown(node))
    # descending: the 1 - q quantile, in decimal so that 0.9 gives 0.1 (not 0.09999...)
    return builder.quantile(column, float(1 - Decimal(repr(q))) if keys[0].args.get("desc") else q)


def _unary(make: Callable[[str], Any]) -> Callable[[Table, exp.Expr], Any]:
    return lambda table, node: make(_argument(table, node.this, node))


def _quantile(table: Table, node: exp.Expr) -> Any:
    """``QUANTILE(column, q)``, ``APPROX_QUANTILE(column, q)``, ``PERCENTILE_CONT(column, q)``."""
    q = node.args.get("quantile") or node.args.get("expression")
    if q is None:
        raise refuse(f"{shown(node)}", "QUANTILE takes a column and a number q in [0, 1]")
    column = _argument(table, node.this, node)
    return builder.quantile(column, _fraction(q, node))


def _named_quantile(table: Table, node: exp.Expr) -> Any:
    """``QUANTILE_CONT(column, q)``: a function sqlglot does not know by name."""
    if len(node.expressions) != 2:
        raise refuse(f"{shown(node)}", "QUANTILE_CONT takes a column and a number q in [0, 1]")
    column, q = node.expressions
    return builder.quantile(table.column(column, shown(node)), _fraction(q, node))


Rule = Callable[[Table, exp.Expr], Any]

#: sqlglot's aggregate nodes -> the builder's aggregate. Sample and population variances are
#: one statistic here: their n/(n-1) differs far less than the noise at any useful epsilon.
_AGGREGATES: dict[type[exp.Expr], Rule] = {
    exp.Count: _count,
    exp.Sum: _unary(builder.sum),
    exp.Avg: _unary(builder.mean),
    exp.Variance: _unary(builder.var),
    exp.VariancePop: _unary(builder.var),
    exp.Stddev: _unary(builder.std),
    exp.StddevSamp: _unary(builder.std),
    exp.StddevPop: _unary(builder.std),
    exp.Median: _unary(builder.median),
    exp.Min: _unary(builder.min),
    exp.Max: _unary(builder.max),
    exp.WithinGroup: _within_group,
    exp.Quantile: _quantile,
    exp.ApproxQuantile: _quantile,
    exp.PercentileCont: _quantile,
    exp.PercentileDisc: _quantile,
}
#: aggregates sqlglot parses as anonymous functions, by upper-case name
_NAMED: dict[str, Rule] = {
    "STD": _unary(builder.std),
    "VAR": _unary(builder.var),
    "QUANTILE_CONT": _named_quantile,
    "QUANTILE_DISC": _named_quantile,
}
SUPPORTED = (
    "COUNT(*), COUNT(column), COUNT(DISTINCT column), SUM, AVG, VARIANCE/VAR_SAMP/VAR_POP, "
    "STDDEV, MEDIAN, PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY column), QUANTILE(column, q), "
    "MIN, MAX"
)


def aggregate(table: Table, node: exp.Expr) -> Any:
    """The builder's aggregate for a SELECT item that is not a column."""
    rule = _AGGREGATES.get(type(node))
    if rule is None and isinstance(node, exp.Anonymous):
        rule = _NAMED.get(node.name.upper())
    if rule is not None:
        return rule(table, node)
    if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and node.is_star):
        raise refuse(
            "SELECT *",
            "rows are never released: ds.mock() gives fake rows to look at, and aggregates "
            f"({SUPPORTED}) are released noised",
        )
    if isinstance(node, exp.AggFunc):
        raise refuse(f"the aggregate {shown(node)}", f"the aggregates released are {SUPPORTED}")
    raise refuse(
        f"the expression {shown(node)} in SELECT",
        "SELECT group keys and aggregates; compute with the released numbers afterwards "
        "(post-processing: free)",
    )

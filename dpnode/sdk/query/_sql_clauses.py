"""The clauses of a SELECT around its terms: the outputs SELECT lists, GROUP BY's keys,
ORDER BY's outputs, LIMIT and OFFSET."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from dpnode.sdk.query._sql_errors import refuse, shown
from dpnode.sdk.query._sql_terms import Table, aggregate, constant

if TYPE_CHECKING:
    from dpnode.sdk.query.aggregates import Aggregate

__all__ = ["RANK", "Output", "group_keys", "limit_offset", "order_by", "outputs"]


@dataclass(frozen=True)
class Output:
    """One column SELECT asks for: ``column`` in the builder's table, shown as ``name``."""

    column: str
    name: str
    node: exp.Expr
    aggregate: bool


def outputs(
    table: Table, select: exp.Select, keys: Sequence[str]
) -> tuple[list[Output], list[Aggregate]]:
    """SELECT's items as outputs (group keys and aggregates), and the builder's aggregates."""
    found: list[Output] = []
    aggregates: list[Aggregate] = []
    for item in select.expressions:
        node, alias = (item.this, item.alias) if isinstance(item, exp.Alias) else (item, "")
        if isinstance(node, exp.Column) and not node.is_star:
            column = table.column(node, "SELECT")
            if column not in keys:
                raise refuse(
                    f"the column {column} outside GROUP BY",
                    "rows are never released: GROUP BY it for aggregates per value, or look "
                    "at fake rows with ds.mock()",
                )
            found.append(Output(column, alias or column, node, aggregate=False))
            continue
        term = aggregate(table, node)
        if alias:
            term = term.alias(alias)
        aggregates.append(term)
        found.append(Output(term.name, term.name, node, aggregate=True))
    names = [o.name for o in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise refuse(f"two outputs named {twice}", "tell them apart with AS name")
    return found, aggregates


def group_keys(table: Table, select: exp.Select) -> list[str]:
    group = select.args.get("group")
    if group is None:
        return []
    for key in ("rollup", "cube", "grouping_sets", "totals"):
        if group.args.get(key):
            raise refuse(key.upper().replace("_", " "), "run one GROUP BY per set of keys")
    aliases = {i.alias: i.this for i in select.expressions if isinstance(i, exp.Alias)}
    keys: list[str] = []
    for node in group.expressions:
        if isinstance(node, exp.Literal) and not node.is_string:
            node = _position(select, node, "GROUP BY")
            node = node.this if isinstance(node, exp.Alias) else node
        elif isinstance(node, exp.Column) and node.name not in table.ds.columns:
            node = aliases.get(node.name, node)  # GROUP BY an alias of SELECT
        if isinstance(node, exp.Cube | exp.Rollup | exp.GroupingSets):
            raise refuse(f"GROUP BY {shown(node)}", "run one GROUP BY per set of keys")
        if not isinstance(node, exp.Column):
            raise refuse(
                f"GROUP BY {shown(node)}",
                "group by columns: a categorical or integer column's values are public keys",
            )
        column = table.column(node, "GROUP BY")
        if column not in keys:
            keys.append(column)
    return keys


def _position(select: exp.Select, node: exp.Literal, clause: str) -> exp.Expr:
    """The SELECT item a 1-based position names (``GROUP BY 1``, ``ORDER BY 2``)."""
    index = int(node.to_py()) if node.is_int else 0
    if not 1 <= index <= len(select.expressions):
        raise refuse(
            f"{clause} {node.sql()}",
            f"a position counts SELECT's items from 1 to {len(select.expressions)}",
        )
    item: exp.Expr = select.expressions[index - 1]
    return item


#: ORDER BY's name for a count of rows that SELECT does not show (only top_k ranks by it)
RANK = "\0count"


def order_by(
    table: Table, select: exp.Select, outputs: Sequence[Output]
) -> tuple[tuple[tuple[str, bool], ...], str | None]:
    """ORDER BY as ``(output name, descending)`` pairs, each naming a column of the result,
    and the name of the output that counts rows, if any (what top_k ranks by)."""
    counts = [o.name for o in outputs if _counts_rows(o.node)]
    ranked = counts[0] if counts else None
    order = select.args.get("order")
    if order is None:
        return (), ranked
    pairs = []
    for ordered in order.expressions:
        target: exp.Expr = ordered.this
        found: Output | None = None
        if isinstance(target, exp.Literal) and not target.is_string:
            found = outputs[select.expressions.index(_position(select, target, "ORDER BY"))]
        elif isinstance(target, exp.Column) and not target.table:
            found = next((o for o in outputs if o.name == target.name), None)
            if found is None:
                column = table.column(target, "ORDER BY")
                found = next((o for o in outputs if o.column == column and not o.aggregate), None)
        else:
            found = next((o for o in outputs if o.node == target), None)
        if found is None and ranked is None and _counts_rows(target):
            ranked = RANK  # ORDER BY COUNT(*) of groups SELECT shows without their counts
            pairs.append((RANK, bool(ordered.args.get("desc"))))
            continue
        if found is None:
            raise refuse(
                f"ORDER BY {shown(target)}",
                "order by a column of the result: a group key or an aggregate of SELECT (as "
                "written there, by its alias or by its position)",
            )
        pairs.append((found.name, bool(ordered.args.get("desc"))))
    return tuple(pairs), ranked


def _counts_rows(node: exp.Expr) -> bool:
    """COUNT(*) or COUNT(column): the rows (datasets hold no missing values)."""
    return isinstance(node, exp.Count) and not isinstance(node.this, exp.Distinct)


def limit_offset(select: exp.Select) -> tuple[int | None, int]:
    """LIMIT and OFFSET, as whole numbers."""
    limit, offset = select.args.get("limit"), select.args.get("offset")
    count: int | None = None
    if isinstance(limit, exp.Fetch):
        options = limit.args.get("limit_options")
        if options is not None and (options.args.get("percent") or options.args.get("with_ties")):
            raise refuse(f"{shown(limit)}", "FETCH FIRST takes a number of rows")
        count = _whole(limit.args.get("count"), "FETCH FIRST")
    elif limit is not None:
        count = _whole(limit.expression, "LIMIT")
    return count, 0 if offset is None else _whole(offset.expression, "OFFSET")


def _whole(node: exp.Expr | None, clause: str) -> int:
    value = None if node is None else constant(node)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise refuse(f"{clause} {node.sql() if node else ''}".strip(), "give a whole number")
    return value

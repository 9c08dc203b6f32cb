"""SQL over the query builder: ``client.sql("SELECT sex, AVG(income) FROM census GROUP BY sex",
epsilon=1.0)``.

One SELECT is parsed by sqlglot and translated, clause by clause, into the builder's public calls
(``ds.query().filter(...).group_by(...).agg(...)``): the same query, the same publish and the same
charge as writing those calls. Only the dataset's name is looked up on the node; everything the
builder cannot express is refused here, before anything is sent (nothing is charged), with the
construct named and what to do instead: a small grammar refused loudly rather than a large one
approximated. ``docs/statistics.md`` lists the grammar.

ORDER BY, LIMIT and OFFSET act on the released table (post-processing: free; the order is the
noised values' order), except ``ORDER BY COUNT(*) DESC LIMIT k`` on a grouped count alone, which
asks for the k largest groups: the builder's ``top_k(k)`` (see :func:`_wants_top_k`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpnode.sdk._exceptions import NotFoundError
from dpnode.sdk.query._sql_errors import (
    SQLError,
    SQLSyntaxError,
    UnknownTableError,
    UnsupportedSQLError,
    refuse,
    shown,
)
from dpnode.sdk.query._sql_terms import Table, aggregate, constant, predicate
from dpnode.sdk.query.result import QueryResult

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle
    from dpnode.sdk.query.aggregates import Aggregate
    from dpnode.sdk.query.plan import Query

__all__ = [
    "SQLError",
    "SQLSyntaxError",
    "Translation",
    "UnknownTableError",
    "UnsupportedSQLError",
    "publish_sql",
    "translate",
]


class Catalog(Protocol):
    """Where FROM's name is looked up (a :class:`~dpnode.sdk.Client`)."""

    def dataset(self, ref: int | str) -> DatasetHandle: ...

    def datasets(self) -> list[DatasetHandle]: ...


# -- one statement ---------------------------------------------------------------------------

_NOT_READ_ONLY = (
    "this SQL is a read-only differential-privacy query language: one SELECT of aggregates "
    "per call; datasets change through their owner (upload_dataset, delete)"
)

#: SELECT clauses the builder has no counterpart for: the construct, and what to do instead
_CLAUSES: dict[str, tuple[str, str]] = {
    "with_": (
        "WITH (a common table expression)",
        "query the dataset directly, one SELECT per call",
    ),
    "joins": (
        "JOIN",
        "joins are not supported yet: query each dataset on its own, or ask its owner to "
        "upload the joined table as one dataset",
    ),
    "having": (
        "HAVING",
        "filter the released groups yourself, e.g. r.frame[r.frame['count'] > 10] "
        "(post-processing: free)",
    ),
    "qualify": ("QUALIFY", "window values are per row, and rows are never released"),
    "windows": ("WINDOW", "window values are per row, and rows are never released"),
    "distinct": (
        "SELECT DISTINCT",
        "which values occur is private; the groups are public: ds.columns[name].categories "
        "lists them, and GROUP BY with COUNT(*) counts their rows",
    ),
    "laterals": ("LATERAL", "query the dataset directly, one SELECT per call"),
    "pivots": ("PIVOT", "GROUP BY both columns instead"),
    "sample": ("TABLESAMPLE", "aggregates are released over the whole dataset"),
    "into": ("SELECT INTO", _NOT_READ_ONLY),
    "locks": ("FOR UPDATE", _NOT_READ_ONLY),
}
#: how sqlglot names a token in a message: "<Token token_type: ..., text: FROM, ...>"
_TOKEN = re.compile(r"<Token token_type: [^,]*, text: ([^,]*), [^>]*>")
#: and a clause: "<class 'sqlglot.expressions.query.Where'>"
_CLASS = re.compile(r"<class 'sqlglot\.[\w.]*\.(\w+)'>")
_KNOWN_CLAUSES = {"expressions", "from_", "where", "group", "order", "limit", "offset", "kind"}


def parse(sql: str) -> exp.Select:
    """The one SELECT statement ``sql`` holds, checked for what it may contain.

    Raises:
        SQLSyntaxError: sqlglot cannot parse it (its message, shortened, with the position).
        UnsupportedSQLError: not exactly one SELECT, or a clause with no DP counterpart.
    """
    try:
        statements = [s for s in sqlglot.parse(sql) if s is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        description = str(first.get("description", exc))
        raise _syntax(description, first.get("line"), first.get("col")) from None
    except TokenError as exc:
        raise _syntax(str(exc), None, None) from None
    if not statements:
        raise refuse("an empty statement", "write one SELECT, e.g. SELECT COUNT(*) FROM name")
    if len(statements) > 1:
        raise refuse(
            f"{len(statements)} statements in one call",
            "send one SELECT per call (each is one publish, charged on its own)",
        )
    statement = statements[0]
    if isinstance(statement, exp.SetOperation):
        raise refuse(
            statement.key.upper(),
            "publish each SELECT with its own client.sql call and combine the released tables",
        )
    if isinstance(statement, exp.Condition):  # an expression alone, such as "SEL" or "1 + 1"
        raise refuse(
            f"{shown(statement)} (not a statement)",
            "write one SELECT, e.g. SELECT COUNT(*) FROM name",
        )
    if not isinstance(statement, exp.Select):
        word = statement.name if isinstance(statement, exp.Command) else statement.key
        raise refuse(f"{word.upper()} statement", _NOT_READ_ONLY)
    for node in statement.walk():
        if isinstance(node, exp.Select) and node is not statement:
            raise refuse(
                f"a subquery ({shown(node)})",
                "publish the inner query with its own client.sql call and use the released "
                "numbers as constants",
            )
        if isinstance(node, exp.Window):
            raise refuse(
                f"a window function ({shown(node)})",
                "window values are per row, and rows are never released; GROUP BY gives "
                "aggregates per group",
            )
    for key, value in statement.args.items():
        if value in (None, False, []) or key in _KNOWN_CLAUSES:
            continue
        construct, instead = _CLAUSES.get(
            key, (key.rstrip("_").upper(), "see docs/statistics.md for the SQL supported")
        )
        raise refuse(construct, instead)
    return statement


def _syntax(message: str, line: int | None, column: int | None) -> SQLSyntaxError:
    message = _TOKEN.sub(lambda m: repr(m.group(1)), message).replace("'SENTINEL'", "the end")
    message = _CLASS.sub(lambda m: m.group(1).upper(), message)
    where = f" (line {line}, column {column})" if line is not None else ""
    error = SQLSyntaxError(f"cannot parse the SQL{where}: {message[:200]}")
    error.line, error.column = line, column
    return error


def _lookup(catalog: Catalog, table: exp.Table) -> DatasetHandle:
    """The dataset FROM names: by its exact name, else (unquoted) by a case-insensitive match.

    Raises:
        UnknownTableError: no such dataset (the message lists the datasets you can read).
    """
    if table.args.get("db") or table.args.get("catalog"):
        raise refuse(
            f"a qualified table name ({shown(table)})",
            'FROM names one dataset as the catalog does; quote a name with dots: "a.b"',
        )
    if not isinstance(table.this, exp.Identifier):
        raise refuse(f"FROM {shown(table.this)}", "FROM names one dataset")
    name = table.name
    try:
        return catalog.dataset(name)
    except NotFoundError:
        pass
    known = catalog.datasets()
    if not table.this.quoted:
        same = [d for d in known if d.name.lower() == name.lower()]
        if len(same) == 1:
            return same[0]
    listed = ", ".join(repr(d.name) for d in known) or "none"
    raise UnknownTableError(f"no dataset {name!r} on the node; datasets you can read: {listed}")


# -- the statement ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """One column SELECT asks for: ``column`` in the builder's table, shown as ``name``."""

    column: str
    name: str
    node: exp.Expr
    aggregate: bool


@dataclass(frozen=True)
class Translation:
    """A SELECT statement as the builder's query, and what is done to the released table.

    Attributes:
        query: the builder's query; publishing it is the one charge.
        outputs: the SELECT list, in its order.
        order: ``(name, descending)`` pairs of ORDER BY, applied to the released table.
        limit: LIMIT (``None``: every row) and ``offset``: OFFSET, applied after ORDER BY.
    """

    query: Query
    outputs: tuple[Output, ...]
    order: tuple[tuple[str, bool], ...] = ()
    limit: int | None = None
    offset: int = 0

    def plan(self, *, epsilon: float | None = None, delta: float | None = None) -> str:
        """The builder's plan (no request), and what is then done locally.

        Raises:
            QueryError: the builder would refuse the query.
        """
        lines = [self.query.plan(epsilon=epsilon, delta=delta)]
        shown = ", ".join(o.name for o in self.outputs)
        lines.append(f"  then locally (free): columns {shown}")
        if self.order:
            keys = ", ".join(f"{n} {'DESC' if d else 'ASC'}" for n, d in self.order)
            lines.append(f"  ORDER BY {keys}")
        if self.limit is not None or self.offset:
            lines.append(f"  LIMIT {self.limit} OFFSET {self.offset}")
        return "\n".join(lines)

    def publish(self, *, epsilon: float, delta: float | None = None) -> QueryResult:
        """Publish the query (one charge, split by the builder) and return its table as
        SELECT, ORDER BY, OFFSET and LIMIT ask."""
        return self.finish(self.query.publish(epsilon=epsilon, delta=delta))

    def finish(self, result: QueryResult) -> QueryResult:
        """``result`` with SELECT's columns in its order (each aggregate's noise scale beside
        it), renamed as AS asks, sorted and cut: post-processing of the released values."""
        names: list[str] = []
        values: list[list[Any]] = []
        for out in self.outputs:
            names.append(out.name)
            values.append(result.column(out.column))
            if out.aggregate:
                names.append(f"{out.name}_scale")
                values.append(result.column(f"{out.column}_scale"))
        rows = list(zip(*values, strict=True))
        for name, descending in reversed(self.order):  # stable sorts, the last key first
            at = names.index(name)
            rows.sort(key=lambda row: row[at], reverse=descending)
        end = None if self.limit is None else self.offset + self.limit
        return QueryResult(names, rows[self.offset : end], result.receipt)


def translate(sql: str, catalog: Catalog) -> Translation:
    """Translate one SELECT into the query builder's calls; nothing is published.

    Args:
        sql: the statement (see docs/statistics.md for the grammar).
        catalog: where FROM's dataset is looked up by name (a client).

    Raises:
        SQLSyntaxError: the statement does not parse.
        UnsupportedSQLError: a construct with no DP counterpart (named, with an alternative).
        UnknownTableError: no such dataset (the message lists them).
        UnknownColumnError: no such column (the message lists them).
    """
    select = parse(sql)
    source = select.args.get("from_")
    if source is None:
        raise refuse("SELECT without FROM", "name the dataset: SELECT COUNT(*) FROM name")
    if not isinstance(source.this, exp.Table):
        raise refuse(f"FROM {shown(source.this)}", "FROM names one dataset")
    ds = _lookup(catalog, source.this)
    table = Table(ds, frozenset({source.this.name, source.this.alias_or_name}))
    keys = _group_keys(table, select)
    outputs, aggregates = _outputs(table, select, keys)
    query = ds.query()
    where = select.args.get("where")
    if where is not None:
        query = query.filter(predicate(table, where.this))
    order, ranked = _order(table, select, outputs)
    limit, offset = _limit(select)
    top = bool(keys and limit and not offset and ranked and order == ((ranked, True),))
    if any(name == _RANK for name, _ in order) and not top:
        raise refuse(
            "ORDER BY COUNT(*) without COUNT(*) in SELECT",
            "add COUNT(*) to SELECT, or ask for the largest groups with ORDER BY COUNT(*) DESC "
            "LIMIT k (no OFFSET)",
        )
    if not aggregates and not top:
        raise refuse(
            "GROUP BY without an aggregate",
            "which groups occur is private: add COUNT(*) or another aggregate, or ask for the "
            "largest groups with ORDER BY COUNT(*) DESC LIMIT k",
        )
    if keys:
        query = query.group_by(*keys)
    if top and limit:
        # the k groups with the most rows, ranked by the noised counts released with the
        # query's other noised values: the same rows as sorting the whole table (see docs)
        query = query.top_k(limit, counts=False)
        order = () if ranked == _RANK else order
    return Translation(query.agg(*aggregates), tuple(outputs), order, limit, offset)


def publish_sql(
    catalog: Catalog, sql: str, *, epsilon: float, delta: float | None = None
) -> QueryResult:
    """Translate one SELECT (:func:`translate`) and publish it: ``client.sql(...)``."""
    return translate(sql, catalog).publish(epsilon=epsilon, delta=delta)


def _outputs(
    table: Table, select: exp.Select, keys: Sequence[str]
) -> tuple[list[Output], list[Aggregate]]:
    """SELECT's items as outputs (group keys and aggregates), and the builder's aggregates."""
    outputs: list[Output] = []
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
            outputs.append(Output(column, alias or column, node, aggregate=False))
            continue
        term = aggregate(table, node)
        if alias:
            term = term.alias(alias)
        aggregates.append(term)
        outputs.append(Output(term.name, term.name, node, aggregate=True))
    names = [o.name for o in outputs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise refuse(f"two outputs named {twice}", "tell them apart with AS name")
    return outputs, aggregates


def _group_keys(table: Table, select: exp.Select) -> list[str]:
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
_RANK = "\0count"


def _order(
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
            ranked = _RANK  # ORDER BY COUNT(*) of groups SELECT shows without their counts
            pairs.append((_RANK, bool(ordered.args.get("desc"))))
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


def _limit(select: exp.Select) -> tuple[int | None, int]:
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

"""SQL over the query builder: ``client.sql("SELECT sex, AVG(income) FROM census GROUP BY sex",
epsilon=1.0)``.

One SELECT is parsed by sqlglot and translated, clause by clause, into the builder's public calls
(``ds.query().filter(...).group_by(...).agg(...)``): the same query, the same publish and the same
charge as writing those calls. Only the dataset's name is looked up on the node; everything the
builder cannot express is refused here, before anything is sent (nothing is charged), with the
construct named and what to do instead: a small grammar refused loudly rather than a large one
approximated. ``docs/statistics.md`` lists the grammar.

ORDER BY, LIMIT and OFFSET act on the released table (post-processing: free; the order is the
noised values' order), except ``ORDER BY COUNT(*) DESC LIMIT k`` on a grouped statement, which
asks for the k largest groups: the builder's ``top_k(k)``, which releases the same rows (see
docs/statistics.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from dpnode.sdk._exceptions import NotFoundError
from dpnode.sdk.query._sql_clauses import (
    RANK,
    Output,
    group_keys,
    limit_offset,
    order_by,
    outputs,
)
from dpnode.sdk.query._sql_errors import (
    SQLError,
    SQLSyntaxError,
    UnknownTableError,
    UnsupportedSQLError,
    refuse,
    shown,
)
from dpnode.sdk.query._sql_terms import Table, predicate
from dpnode.sdk.query.result import QueryResult

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle
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

    def publish(
        self, *, epsilon: float, delta: float | None = None, description: str = ""
    ) -> QueryResult:
        """Publish the query (one charge, split by the builder) and return its table as
        SELECT, ORDER BY, OFFSET and LIMIT ask (``description``: as for ``Query.publish``)."""
        return self.finish(
            self.query.publish(epsilon=epsilon, delta=delta, description=description)
        )

    def finish(self, result: QueryResult) -> QueryResult:
        """``result`` with SELECT's columns in its order (each aggregate's noise scale and
        error bars beside it), renamed as AS asks, sorted and cut: post-processing of the
        released values."""
        names: list[str] = []
        values: list[list[Any]] = []
        bars: dict[str, list[Any]] = {}
        for out in self.outputs:
            names.append(out.name)
            values.append(result.column(out.column))
            if out.aggregate:
                names.append(f"{out.name}_scale")
                values.append(result.column(f"{out.column}_scale"))
                if out.column in result.error_bars:
                    bars[out.name] = result.error_bars[out.column]
        rows = list(zip(*values, strict=True))
        order = list(range(len(rows)))
        for name, descending in reversed(self.order):  # stable sorts, the last key first
            at = names.index(name)
            order.sort(key=lambda i: rows[i][at], reverse=descending)
        end = None if self.limit is None else self.offset + self.limit
        kept = order[self.offset : end]
        return QueryResult(
            names,
            [rows[i] for i in kept],
            result.receipt,
            {name: [column[i] for i in kept] for name, column in bars.items()},
        )


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
    keys = group_keys(table, select)
    items, aggregates = outputs(table, select, keys)
    query = ds.query()
    where = select.args.get("where")
    if where is not None:
        query = query.filter(predicate(table, where.this))
    order, ranked = order_by(table, select, items)
    limit, offset = limit_offset(select)
    top = bool(keys and limit and not offset and ranked and order == ((ranked, True),))
    if any(name == RANK for name, _ in order) and not top:
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
        order = () if ranked == RANK else order
    return Translation(query.agg(*aggregates), tuple(items), order, limit, offset)


def publish_sql(
    catalog: Catalog,
    sql: str,
    *,
    epsilon: float,
    delta: float | None = None,
    description: str = "",
) -> QueryResult:
    """Translate one SELECT (:func:`translate`) and publish it: ``client.sql(...)``."""
    return translate(sql, catalog).publish(epsilon=epsilon, delta=delta, description=description)

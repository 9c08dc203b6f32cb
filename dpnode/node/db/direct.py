"""Core statements run straight on the DB-API cursor of a transaction SQLAlchemy began.

A publish's charge runs a handful of small statements, and SQLAlchemy's work around each
(an execution context, parameter processing, a result object, its events) costs several
times what SQLite spends running it: in a loop, a charge's transaction took 265 µs through
``Connection.execute`` and 115 µs with the same statements on the cursor. :class:`Direct`
keeps what makes SQLAlchemy worth having and drops the rest:

- the SQL is the dialect's own compilation of an ordinary Core statement, made once per
  dialect (so the same statement serves SQLite and PostgreSQL, with the dialect's
  placeholders, quoting and ``RETURNING``);
- each parameter goes through its type's bind processor for that dialect and each result
  column through its result processor, as SQLAlchemy would (a ``UTCDateTime`` refuses a
  naive time and is stored in SQLAlchemy's format, JSON is serialised by the dialect);
- the transaction is the caller's: SQLAlchemy began it (on SQLite, ``BEGIN IMMEDIATE`` and the
  process's write queue, :mod:`dpnode.node.db.session`) and commits or rolls it back;
- a driver error is raised as SQLAlchemy's (``IntegrityError``, ``OperationalError``: the
  API's handlers answer them as before), and a lost connection is invalidated;
- ``before_cursor_execute`` listeners still see each statement (tests count them).

What it leaves out is checked when a statement is prepared, not discovered later: a column
default computed in Python (pass the value), an expanding ``IN`` or any parameter rendered
at execution time (use ``Connection.execute``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exc
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable, Insert, Select

__all__ = ["Direct", "connection_of"]


def connection_of(on: Session | Connection) -> Connection:
    """The connection statements of ``on`` run on: ``on`` itself, or a session's (which
    begins its transaction). A service that runs only Core statements takes either, so that
    a charge can run it on a bare connection, without a session's work around each
    transaction (:func:`dpnode.node.services.budget.charge`)."""
    return on if isinstance(on, Connection) else on.connection()


_Processor = Callable[[Any], Any] | None


@dataclass(frozen=True)
class _Prepared:
    sql: str
    #: each parameter in order: its name, its bound value (``required`` if the caller gives
    #: it) and its type's bind processor
    binds: tuple[tuple[str, Any, _Processor], ...]
    positional: bool
    #: each result column's result processor (empty: the statement returns no rows)
    columns: tuple[_Processor, ...]


_REQUIRED = object()


class Direct:
    """A Core statement, compiled once per dialect, run on the cursor of an open transaction.

    ``keys``: for an ``INSERT``, the columns the caller gives (the others take their server
    defaults). Raises ``ValueError`` on first use with a dialect if the statement needs what
    :class:`Direct` does not do (see the module docstring).
    """

    def __init__(self, statement: Executable, keys: Sequence[str] | None = None) -> None:
        self.statement = statement
        self.keys = None if keys is None else list(keys)
        self._prepared: weakref.WeakKeyDictionary[Dialect, _Prepared] = weakref.WeakKeyDictionary()

    def _prepare(self, dialect: Dialect) -> _Prepared:
        statement: Any = self.statement
        compiled: Any = statement.compile(dialect=dialect, column_keys=self.keys)
        if compiled.insert_prefetch or compiled.update_prefetch:
            names = [c.key for c in (*compiled.insert_prefetch, *compiled.update_prefetch)]
            raise ValueError(f"give the columns with a Python default ({names}): they are unset")
        if "POSTCOMPILE" in compiled.string or compiled.literal_execute_params:
            raise ValueError("a parameter rendered at execution time: use Connection.execute")
        if compiled.escaped_bind_names:
            raise ValueError(
                f"parameter names the driver cannot take: {compiled.escaped_bind_names}"
            )
        positional = bool(dialect.positional)
        order = compiled.positiontup if positional else list(compiled.binds)
        binds = []
        for name in order:
            bind = compiled.binds[name]
            if bind.expanding:
                raise ValueError(f"an expanding parameter ({name}): use Connection.execute")
            value = _REQUIRED if bind.required else bind.effective_value
            binds.append((name, value, bind.type.dialect_impl(dialect).bind_processor(dialect)))
        selected: Any = ()
        if isinstance(self.statement, Select):
            selected = self.statement.selected_columns
        elif isinstance(self.statement, Insert):
            selected = self.statement.exported_columns  # its RETURNING, if any
        columns: tuple[_Processor, ...] = tuple(
            c.type.dialect_impl(dialect).result_processor(dialect, None) for c in selected
        )
        return _Prepared(compiled.string, tuple(binds), positional, columns)

    def prepared(self, dialect: Dialect) -> _Prepared:
        found = self._prepared.get(dialect)
        if found is None:
            found = self._prepared[dialect] = self._prepare(dialect)
        return found

    def _parameters(self, prepared: _Prepared, values: Mapping[str, Any]) -> Any:
        out = []
        for name, value, processor in prepared.binds:
            if value is _REQUIRED:
                try:
                    value = values[name]
                except KeyError:
                    raise exc.ArgumentError(f"a value is required for parameter {name!r}") from None
            out.append(value if processor is None else processor(value))
        if prepared.positional:
            return tuple(out)
        return dict(zip((b[0] for b in prepared.binds), out, strict=True))

    def execute(
        self, connection: Connection, values: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    ) -> list[tuple[Any, ...]]:
        """Run with ``values`` (a sequence of them: once for each, with ``executemany``) in
        ``connection``'s transaction, which must have begun; the rows it returns, processed."""
        if not connection.in_transaction():
            raise exc.InvalidRequestError("Direct statements run in a transaction already begun")
        dialect = connection.dialect
        prepared = self.prepared(dialect)
        many = not isinstance(values, Mapping)
        parameters: Any = (
            self._parameters(prepared, values)
            if isinstance(values, Mapping)
            else [self._parameters(prepared, v) for v in values]
        )
        fairy = connection.connection
        cursor = fairy.cursor()
        try:
            if connection.dispatch.before_cursor_execute:  # listeners see it, as they would
                connection.dispatch.before_cursor_execute(
                    connection, cursor, prepared.sql, parameters, None, many
                )
            if many:
                cursor.executemany(prepared.sql, parameters)
            else:
                cursor.execute(prepared.sql, parameters)
            rows = cursor.fetchall() if prepared.columns else []
        except dialect.loaded_dbapi.Error as error:
            lost = dialect.is_disconnect(error, fairy.dbapi_connection, cursor)
            if lost:
                connection.invalidate(error)
            raise exc.DBAPIError.instance(
                prepared.sql,
                parameters,
                error,
                dialect.loaded_dbapi.Error,
                connection_invalidated=lost,
                dialect=dialect,
                ismulti=many,
            ) from error
        finally:
            cursor.close()
        return list(_processed(rows, prepared.columns))


def _processed(rows: Sequence[Any], columns: tuple[_Processor, ...]) -> Iterator[tuple[Any, ...]]:
    if not any(columns):
        yield from (tuple(row) for row in rows)
        return
    for row in rows:
        yield tuple(v if p is None else p(v) for p, v in zip(columns, row, strict=True))

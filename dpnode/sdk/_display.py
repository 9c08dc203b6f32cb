"""Notebook views of what the node answers: small HTML tables, and pandas frames.

Jupyter shows an object's ``_repr_html_``; the tables here are plain ``<table>`` markup with
every value escaped (names, tags and reasons come from other people) and no external asset,
so they render the same offline. ``to_pandas()`` needs pandas, an optional dependency: its
absence is a clear error, never an import failure of the SDK.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from html import escape
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

T = TypeVar("T")

#: Rows a list shows before it says how many more there are.
MAX_ROWS = 50
_CELL_CHARS = 200


def require_pandas(what: str) -> Any:
    """The pandas module, or an ImportError saying how to get it."""
    try:
        import pandas
    except ImportError:
        raise ImportError(
            f"{what} needs pandas, an optional dependency: pip install 'dpnode[pandas]'"
        ) from None
    return pandas


def text(value: Any) -> str:
    """One value as a short string (before escaping).

    >>> text(0.1 + 0.2), text(None), text(("a", "b")), text(datetime(2026, 1, 2, 3, 4, 5))
    ('0.3', '', 'a, b', '2026-01-02 03:04:05')
    """
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, list | tuple):
        return ", ".join(text(v) for v in value)
    if isinstance(value, dict):
        shown = json.dumps(value, default=str, sort_keys=True)
    else:
        shown = str(value)
    return shown if len(shown) <= _CELL_CHARS else shown[: _CELL_CHARS - 3] + "..."


def _cell(tag: str, value: Any) -> str:
    return f"<{tag}>{escape(text(value))}</{tag}>"


def fields_table(title: str, rows: Iterable[tuple[str, Any]], after: str = "") -> str:
    """A two-column table (field, value) under a bold ``title``; ``after`` is markup that
    follows it (already escaped).

    >>> html = fields_table("<b>", [("x", "<i>")])
    >>> "<i>" in html, html.count("&lt;"), "<th>x</th><td>&lt;i&gt;</td>" in html
    (False, 2, True)
    """
    body = "".join(f"<tr>{_cell('th', k)}{_cell('td', v)}</tr>" for k, v in rows)
    return f'<div class="dpnode"><strong>{escape(title)}</strong><table>{body}</table>{after}</div>'


def records_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    limit: int = MAX_ROWS,
    *,
    after_rows: Sequence[str] = (),
) -> str:
    """A table of records, at most ``limit`` rows shown and the rest counted. ``after_rows``:
    markup (already escaped) shown across the table under the row of the same index, if any
    (a run's steps under a disclosure, say)."""
    head = "".join(_cell("th", c) for c in columns)
    more_rows = [*after_rows, *[""] * (len(rows) - len(after_rows))]

    def under(markup: str) -> str:
        return f'<tr><td colspan="{len(columns)}">{markup}</td></tr>' if markup else ""

    body = "".join(
        "<tr>" + "".join(_cell("td", v) for v in row) + "</tr>" + under(extra)
        for row, extra in zip(rows[:limit], more_rows, strict=False)
    )
    more = f"<p>... {len(rows) - limit} more</p>" if len(rows) > limit else ""
    return (
        f'<div class="dpnode"><strong>{escape(title)}</strong> ({len(rows)})'
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}</div>"
    )


def dataclass_rows(obj: Any, skip: Iterable[str] = ()) -> list[tuple[str, Any]]:
    """(name, value) of a dataclass's public fields."""
    hidden = set(skip)
    return [
        (f.name, getattr(obj, f.name))
        for f in dataclasses.fields(obj)
        if not f.name.startswith("_") and f.name not in hidden
    ]


class Records(list[T], Generic[T]):
    """A list of records from the node (dataclasses), shown as a table in a notebook and
    turned into a DataFrame by :meth:`to_pandas`. It is a list: everything a list does works.
    """

    title = "records"

    def _columns(self) -> list[str]:
        if not self:
            return []
        return [f.name for f in dataclasses.fields(self[0]) if not f.name.startswith("_")]  # type: ignore[arg-type]

    def _repr_html_(self) -> str:
        columns = self._columns()
        rows = [[getattr(r, c) for c in columns] for r in self]
        return records_table(self.title, columns, rows)

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame``, one row a record, one column a field.

        Raises:
            ImportError: pandas is not installed (``pip install 'dpnode[pandas]'``).
        """
        pandas = require_pandas(f"{type(self).__name__}.to_pandas()")
        columns = self._columns()
        return pandas.DataFrame([[getattr(r, c) for c in columns] for r in self], columns=columns)


class AuditLog(Records[T]):
    """Audit events, newest first (``client.audit()``)."""

    title = "audit log"


class Grants(Records[T]):
    """Budget grants, newest first (``client.grants()``)."""

    title = "budget grants"


class Columns(dict[str, npt.NDArray[Any]]):
    """Downloaded columns by name (a dataset's mock data, say): a dict of arrays, with
    :meth:`to_pandas`, :meth:`to_arrow` and :meth:`to_polars`.

    ``categories``: the public categories of categorical columns (stored as indices), which
    the frames show as strings. ``synthetic``: a mock's provenance when the node synthesized
    it (``ds.synthesize_mock``), else ``None``.
    """

    categories: dict[str, tuple[str, ...]]
    synthetic: dict[str, Any] | None = None

    def __init__(
        self, *args: Any, categories: dict[str, tuple[str, ...]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.categories = dict(categories or {})

    def __repr__(self) -> str:
        """A line per column, not every value (a download can hold thousands of rows).

        >>> Columns({"age": np.array([30, 41]), "x": np.zeros((2, 3))})
        <Columns: 2 rows; .to_pandas(), .to_polars() or .to_arrow() for a table
          age  int64
          x    float64 (3,)>
        """
        rows = len(next(iter(self.values()))) if self else 0
        width = max((len(k) for k in self), default=0)
        lines = [f"<Columns: {rows} rows; .to_pandas(), .to_polars() or .to_arrow() for a table"]
        for k, v in self.items():
            shape = np.shape(v)[1:]
            kind = f"categories {list(self.categories[k])}" if k in self.categories else ""
            lines.append(
                f"  {k:<{width}}  {np.asarray(v).dtype}{f' {shape}' if shape else ''}"
                + (f" {kind}" if kind else "")
            )
        return "\n".join(lines) + ">"

    def _cells(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self.items():
            if k in self.categories and np.ndim(v) == 1:
                names = np.asarray(self.categories[k], dtype=object)
                out[k] = names[np.asarray(v, dtype=np.int64)]
            else:
                out[k] = v if np.ndim(v) == 1 else list(v)
        return out

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame`` of the rows; a column with a per-row shape (an image)
        holds one array per row.

        Raises:
            ImportError: pandas is not installed (``pip install 'dpnode[pandas]'``).
        """
        pandas = require_pandas("to_pandas()")
        return pandas.DataFrame(self._cells(), copy=False)

    def to_arrow(self) -> Any:
        """A ``pyarrow.Table`` of the rows (scalar columns)."""
        import pyarrow

        return pyarrow.table(
            {k: list(v) if v.dtype == object else v for k, v in self._cells().items()}
        )

    def to_polars(self) -> Any:
        """A ``polars.DataFrame`` of the rows (scalar columns), through Arrow.

        Raises:
            ImportError: polars is not installed (``pip install 'dpnode[polars]'``).
        """
        try:
            import polars
        except ImportError:
            raise ImportError(
                "to_polars() needs polars, an optional dependency: pip install 'dpnode[polars]'"
            ) from None
        return polars.from_arrow(self.to_arrow())

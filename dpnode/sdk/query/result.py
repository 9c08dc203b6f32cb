"""What a query returns: a table of noised statistics, each beside its noise scale, and
the receipts of the publishes that paid for it.

pandas and Polars are optional: ``.rows()`` and ``print(result)`` work without either;
``.frame`` / ``.to_pandas()`` need pandas, ``.to_polars()`` Polars.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from dpnode.sdk._exceptions import DPNodeError
from dpnode.sdk.query.errorbars import ErrorBar, caption, shown

if TYPE_CHECKING:
    from dpnode.sdk._publish import Receipt

__all__ = ["QueryReceipt", "QueryResult", "Spend"]


@dataclass(frozen=True)
class Spend:
    """One publish of a query: what it released, the share of the budget it was given,
    and the node's receipt for it."""

    #: ``"noised"`` (counts, sums, means, spreads), ``"distinct"`` or ``"selected"``
    role: str
    #: the output names it released
    outputs: tuple[str, ...]
    epsilon: float
    delta: float | None
    receipt: Receipt


@dataclass(frozen=True)
class QueryReceipt:
    """The receipts of a query's publishes, with the budget split among them."""

    spends: tuple[Spend, ...]
    epsilon: float
    delta: float | None

    @property
    def receipts(self) -> list[Receipt]:
        return [s.receipt for s in self.spends]

    @property
    def charged_epsilon(self) -> float:
        """What the publishes took from the budget together (for Gaussian ones, the growth
        of the converted zCDP total, which can be below what was asked)."""
        return math.fsum(s.receipt.epsilon for s in self.spends)

    @property
    def mock(self) -> bool:
        return any(s.receipt.mock for s in self.spends)

    def __iter__(self) -> Iterator[Receipt]:
        return iter(self.receipts)

    def __len__(self) -> int:
        return len(self.spends)

    def __str__(self) -> str:
        if not self.spends:
            return "nothing published: every value is public (the row count), nothing charged"
        delta = "" if self.delta is None else f", delta {self.delta:g}"
        lines = [f"epsilon {self.epsilon:g}{delta} split across {len(self.spends)} publish(es):"]
        for s in self.spends:
            share = f"epsilon {s.epsilon:.6g}" + ("" if s.delta is None else f", delta {s.delta:g}")
            lines.append(f"  {s.role} ({', '.join(s.outputs)}): {share}; {s.receipt}")
        return "\n".join(lines)


class QueryResult:
    """A query's released table: one row per group (one row without ``group_by``), one
    column per key, and per statistic its value and its noise scale (``<name>_scale``:
    the standard deviation of the noise in it, to first order for a ratio; for a selected
    quantile, the exponential mechanism's scale in rows).

    ``error_bars``: per statistic, per row, its 95% error bar (None: exact), which a
    notebook shows beside each value (``47.9 ± 1.2``; see ``dpnode.sdk.query.errorbars``).
    """

    def __init__(
        self,
        columns: list[str],
        rows: list[tuple[Any, ...]],
        receipt: QueryReceipt,
        error_bars: Mapping[str, Sequence[ErrorBar | None]] | None = None,
    ) -> None:
        self.columns = list(columns)
        self._rows = [tuple(r) for r in rows]
        self.receipt = receipt
        self.error_bars = {name: list(bars) for name, bars in (error_bars or {}).items()}

    def rows(self) -> list[dict[str, Any]]:
        """The table as a list of ``{column: value}``, without pandas."""
        return [dict(zip(self.columns, r, strict=True)) for r in self._rows]

    def column(self, name: str) -> list[Any]:
        """One column's values, in row order.

        Raises:
            KeyError: no such column (the message lists them).
        """
        if name not in self.columns:
            raise KeyError(f"no column {name!r} in the result; its columns are {self.columns}")
        i = self.columns.index(name)
        return [r[i] for r in self._rows]

    def __getitem__(self, name: str) -> list[Any]:
        return self.column(name)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def frame(self) -> Any:
        """The table as a pandas DataFrame."""
        return self.to_pandas()

    def to_pandas(self) -> Any:
        """The table as a pandas DataFrame.

        Raises:
            DPNodeError: pandas is not installed (``pip install 'dpnode[pandas]'``).
        """
        try:
            import pandas as pd
        except ImportError:
            raise DPNodeError(
                "QueryResult.frame needs pandas: pip install 'dpnode[pandas]' (or use "
                ".rows(), or .to_polars())"
            ) from None
        return pd.DataFrame(self._rows, columns=self.columns)

    def to_polars(self) -> Any:
        """The table as a Polars DataFrame.

        Raises:
            DPNodeError: Polars is not installed (``pip install 'dpnode[polars]'``).
        """
        try:
            import polars as pl
        except ImportError:
            raise DPNodeError(
                "QueryResult.to_polars() needs Polars: pip install 'dpnode[polars]'"
            ) from None
        return pl.DataFrame(self._rows, schema=self.columns, orient="row")

    def __str__(self) -> str:
        cells = [[_show(v) for v in r] for r in self._rows]
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]
        head = "  ".join(c.rjust(w) for c, w in zip(self.columns, widths, strict=True))
        body = ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
        return "\n".join([head, *body, str(self.receipt)])

    def __repr__(self) -> str:
        return f"<QueryResult {len(self)} rows x {len(self.columns)} columns>\n{self}"

    def _repr_html_(self) -> str:
        """The table with each statistic as ``value ± error bar`` (its scale folded in),
        what the bars mean beneath it, then the receipts."""
        from dpnode.sdk._display import records_table

        bars = self.error_bars
        columns = [c for c in self.columns if not (c.endswith("_scale") and c[:-6] in bars)]
        at = [self.columns.index(c) for c in columns]
        rows = [
            tuple(
                shown(row[j], bars[c][i]) if c in bars else row[j]
                for c, j in zip(columns, at, strict=True)
            )
            for i, row in enumerate(self._rows)
        ]
        table = records_table("query result", columns, rows)
        note = caption([b for c in columns if c in bars for b in bars[c]])
        return (
            f'<div class="dpnode">{table}<p>{escape(note)}</p>'
            f"<pre>{escape(str(self.receipt))}</pre></div>"
        )


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)

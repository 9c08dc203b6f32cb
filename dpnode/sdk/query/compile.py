"""A query compiled to remote tensors: the publishes it makes, and how each is read back.

Everything here is ordinary remote-tensor code, recorded into the node's graph and released
by ``sdk.publish``: the same tracker, budget and ledger as any torch computation. A query
makes at most three publishes, by family (``dpnode.sdk.query.aggregates``):

* **noised**: every count, sum, mean, variance and standard deviation of the query in one
  release. Each row contributes one vector: per group cell, its filter weight (the count),
  and per column its value less the middle of the column's bounds over half their width
  (``z`` in ``[-1, 1]``), and for a spread ``2 z^2 - 1`` (also in ``[-1, 1]``; centring
  the square halves the noise on it). The node clips each subject's vector to the norm of
  the mechanism (L1 ``parts`` for Laplace, L2 ``sqrt(parts)`` for Gaussian) and sums them:
  sensitivity twice that, whatever the number of cells. A query of counts alone is also
  written the way an analyst writes it, one-hots (times the filter) summed over the rows;
  the node is asked what it charges for that graph (free), and the cheaper of the two is
  released, so that what the node learns about partitions benefits the builder too.
* **distinct**: per ``count_distinct`` column, the node's ``count_distinct`` prim of the
  column (per cell by a cell index, -1 for a row outside the filter): one subject moves
  each cell's count by at most its rows, all cells' by twice that; noised at what the node
  charges for it.
* **selected**: every quantile (median, min, max) in one release of the node's
  ``quantile`` prim, per group by a cell index (-1 for a row outside the filter): each
  selected by permute-and-flip, the release's epsilon shared equally among them; each
  cell's quantiles of one column are then put in the order of their ``q`` (:func:`rearranged`).

The selected publish goes first: the node checks the others' graphs for free
(``/sensitivity``) before any publish, but not a selection's, so whichever the node refuses,
it refuses before anything is charged.

Without a filter or a group the row count is public: it is returned exactly, not noised.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpnode.core.engine.prims.misc import _MAX_GROUPS as MAX_SELECTED_CELLS
from dpnode.sdk.query.aggregates import Aggregate, distinct_values
from dpnode.sdk.query.errors import TooManyCellsError
from dpnode.sdk.query.expressions import column_info
from dpnode.sdk.query.keys import Key, cell_index, cell_members, check_memory

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle
    from dpnode.sdk._publish import Receipt
    from dpnode.sdk.query.plan import Query

__all__ = ["COUNT", "Compiled", "Release", "compile_query"]

#: the name under which the noised release returns the counts a top-k ranks by
COUNT = "\0count"

Values = dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]
Reader = Callable[[list[torch.Tensor], "Receipt", float], Values]


@dataclass
class Release:
    """One publish of a query: its tensors, its weight in the budget split, and how its
    noised values become statistics (values and noise scales per output name)."""

    role: str
    outputs: tuple[str, ...]
    tensors: list[torch.Tensor]
    weight: int
    gaussian: bool
    read: Reader
    path: str = ""


@dataclass
class Compiled:
    """The releases of a query, its cells' keys, and what is known without a release."""

    cells: int
    releases: list[Release] = field(default_factory=list)
    exact: Values = field(default_factory=dict)


def _noise_sd(receipt: Receipt) -> float:
    """The standard deviation of the noise added to each released value."""
    if receipt.mechanism == "laplace":
        return math.sqrt(2.0) * receipt.noise_scale
    return float(receipt.noise_scale)


def _halves(ds: DatasetHandle, column: str) -> tuple[float, float, float, float]:
    lo, hi = (float(b) for b in column_info(ds, column).bounds)
    return lo, hi, (lo + hi) / 2, max((hi - lo) / 2, 1e-300)


def _rows(ds: DatasetHandle, columns: Sequence[str]) -> int:
    """The rows the query reads (the mock's, inside ``sdk.mock``)."""
    return int(ds[columns[0]].shape[0]) if columns else ds.row_count


def _weight(where: torch.Tensor | None) -> torch.Tensor | None:
    return None if where is None else where.to(torch.float64)


def _noised(
    query: Query,
    keys: Sequence[Key],
    where: torch.Tensor | None,
    rows: int,
    cells: int,
    delta: float | None,
    charged: Callable[[list[torch.Tensor], float | None], float],
) -> tuple[Release | None, Values]:
    ds = query.ds
    aggs = [a for a in query.aggregates if a.family == "noised"]
    ranked = query.top is not None
    if not aggs and not ranked:
        return None, {}
    public = not keys and where is None
    squares: dict[str, bool] = {}
    for a in aggs:
        if a.column is not None:
            squares[a.column] = squares.get(a.column, False) or a.kind in ("var", "std")
    count_names = [a.name for a in aggs if a.kind == "count"] + ([COUNT] if ranked else [])
    if public and not squares:  # the row count alone: public
        n = np.full(1, float(rows))
        return None, {name: (n, np.zeros(1)) for name in count_names}
    w = _weight(where)
    if keys:
        members = cell_members(ds, keys).to(torch.float64)
        m: torch.Tensor | None = members if w is None else members * w.unsqueeze(-1)
    else:
        m = None if w is None else w.unsqueeze(-1)
    parts: list[torch.Tensor] = [] if m is None else [m]
    layout: list[tuple[str, str]] = [] if m is None else [("count", "")]
    for column, square in squares.items():
        _, _, middle, half = _halves(ds, column)
        z = (ds[column].to(torch.float64) - middle) / half
        zs = [(z, "sum")] + ([(2 * z * z - 1, "square")] if square else [])
        for value, what in zs:
            parts.append(value.unsqueeze(-1) if m is None else value.unsqueeze(-1) * m)
            layout.append((what, column))
    check_memory(rows, cells, len(parts), "this query's counts, sums and spreads")
    order = 1 if delta is None else 2
    bound = len(parts) ** (1 / order) * (1 + 1e-9)
    from dpnode.sdk._per_sample import clipped_sum

    subjects = ds.subjects if ds.subject_id else None
    tensors: list[torch.Tensor] = [clipped_sum(parts, max_norm=bound, groups=subjects, ord=order)]
    path = "clipped per-row vector"
    if not squares:  # counts alone: also as an analyst writes them
        plain = _plain_counts(ds, keys, where).sum(0)
        if charged([plain], delta) <= 2 * bound:
            tensors, layout, path = [plain], [("count", "")], "one-hot partition"
    names = tuple(count_names) + tuple(a.name for a in aggs if a.kind != "count")

    def read(released: list[torch.Tensor], receipt: Receipt, epsilon: float) -> Values:
        flat = np.concatenate([t.detach().double().reshape(-1).numpy() for t in released])
        sd = _noise_sd(receipt)
        got = {key: flat[i * cells : (i + 1) * cells] for i, key in enumerate(layout)}
        if public:
            c, c_sd = np.full(cells, float(rows)), 0.0
        else:
            c, c_sd = got[("count", "")], sd
        out: Values = {}
        for name in count_names:
            out[name] = (np.clip(c, 0.0, rows), np.full(cells, c_sd))
        for a in aggs:
            if a.kind == "count" or a.column is None:
                continue
            lo, hi, middle, half = _halves(ds, a.column)
            s1 = got[("sum", a.column)]
            s2 = got.get(("square", a.column))
            out[a.name] = _statistic(a.kind, c, c_sd, s1, s2, sd, lo, hi, middle, half)
        return out

    release = Release("noised", names, tensors, len(layout), delta is not None, read, path)
    return release, {}


def _plain_counts(
    ds: DatasetHandle, keys: Sequence[Key], where: torch.Tensor | None
) -> torch.Tensor:
    """Rows per cell as an analyst writes it: the cells' one-hots (and the filter's mask)."""
    if not keys:
        assert where is not None  # else the count is public
        return where
    members = cell_members(ds, keys)
    return members if where is None else members & where.unsqueeze(-1)


def _statistic(
    kind: str,
    c: np.ndarray[Any, Any],
    c_sd: float,
    s1: np.ndarray[Any, Any],
    s2: np.ndarray[Any, Any] | None,
    sd: float,
    lo: float,
    hi: float,
    middle: float,
    half: float,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A sum, mean, variance or standard deviation from the noised normalised sums ``s1``
    (of ``z``) and ``s2`` (of ``2 z^2 - 1``) and count ``c``, with its noise's standard
    deviation (to first order for the ratios)."""
    if kind == "sum":
        return half * s1 + middle * c, np.full(c.shape, math.hypot(half * sd, middle * c_sd))
    n = np.maximum(c, 1.0)
    e1 = np.clip(s1 / n, -1.0, 1.0)
    mean_sd = half * np.hypot(sd, e1 * c_sd) / n
    if kind == "mean":
        value = np.where(c >= 1, middle + half * e1, middle)
        return np.clip(value, lo, hi), mean_sd
    assert s2 is not None
    e2 = np.clip((s2 / n + 1.0) / 2.0, 0.0, 1.0)  # the mean of z^2
    variance = np.clip(half * half * (e2 - e1 * e1), 0.0, half * half)
    variance = np.where(c >= 1, variance, 0.0)
    # d var / d s2, d s1, d c, times each one's noise
    d2 = half * half / (2 * n) * sd
    d1 = 2 * half * half * e1 / n * sd
    dc = half * half * (-(e2 - 0.5) / n + 2 * e1 * e1 / n) * c_sd
    var_sd = np.sqrt(d2 * d2 + d1 * d1 + dc * dc)
    if kind == "var":
        return variance, var_sd
    spread = np.sqrt(variance)
    with np.errstate(over="ignore"):  # a spread of 0: its error is the most it can be, half
        return spread, np.minimum(var_sd / (2 * np.maximum(spread, 1e-300)), half)


def _distinct(
    query: Query,
    keys: Sequence[Key],
    where: torch.Tensor | None,
    rows: int,
    cells: int,
    delta: float | None,
) -> Release | None:
    from dpnode.core.engine.prims.distinct import MAX_GROUPS
    from dpnode.sdk._remote.dispatch import _wrap, node_of
    from dpnode.sdk._remote.distinct import distinct_node

    ds = query.ds
    aggs = [a for a in query.aggregates if a.family == "distinct"]
    if not aggs:
        return None
    if cells > MAX_GROUPS:
        raise TooManyCellsError(
            f"count_distinct per group: {cells:,} groups is more than the {MAX_GROUPS:,} one "
            "release counts for: group by fewer keys"
        )
    index: torch.Tensor | None = None
    if keys:
        index = cell_index(ds, keys, where)
    elif where is not None:
        index = where.to(torch.int64) - 1  # 0 inside the filter, -1 outside
    tensors: list[torch.Tensor] = []
    sizes: list[float] = []
    for a in aggs:
        assert a.column is not None
        values = distinct_values(column_info(ds, a.column))
        x = ds[a.column]
        if index is None:
            node = distinct_node(node_of(x))
            meta = torch.empty((), dtype=torch.int64, device="meta")
        else:
            node = distinct_node(node_of(x), index=node_of(index), groups=cells)
            meta = torch.empty((cells,), dtype=torch.int64, device="meta")
        tensors.append(_wrap(meta, node, getattr(x, "_source", "")))
        sizes.append(float(rows if values is None else min(rows, values)))

    def read(released: list[torch.Tensor], receipt: Receipt, epsilon: float) -> Values:
        sd = _noise_sd(receipt)
        out: Values = {}
        for a, t, size in zip(aggs, released, sizes, strict=True):
            v = np.clip(t.detach().double().reshape(-1).numpy(), 0.0, size)
            out[a.name] = (np.broadcast_to(v, (cells,)).copy(), np.full(cells, sd))
        return out

    names = tuple(a.name for a in aggs)
    return Release("distinct", names, tensors, len(aggs), delta is not None, read, "count_distinct")


def rearranged(aggs: Sequence[Aggregate], out: Values) -> Values:
    """Each cell's quantiles of one column put in the order of their ``q`` (min first, max
    last), whatever order the noise left them in.

    Free post-processing that is never worse: the true quantiles are ordered, and pairing
    sorted estimates with sorted truths minimises the summed absolute (or any convex) error
    over all pairings (the rearrangement inequality), so the sorted release is at least as
    close to the truth in total, and no longer reads as a 25% above the median.

    >>> from dpnode.sdk.query.aggregates import max, median, min
    >>> aggs = [min("x"), median("x"), max("x")]
    >>> got = rearranged(aggs, {
    ...     "x_min": (np.array([5.0, 1.0]), np.ones(2)),
    ...     "x_median": (np.array([3.0, 2.0]), np.ones(2)),
    ...     "x_max": (np.array([4.0, 9.0]), np.ones(2))})
    >>> [got[a.name][0].tolist() for a in aggs]
    [[3.0, 1.0], [4.0, 2.0], [5.0, 9.0]]
    """
    by_column: dict[str | None, list[Aggregate]] = {}
    for a in aggs:
        by_column.setdefault(a.column, []).append(a)
    sorted_out = dict(out)
    for same in by_column.values():
        if len(same) < 2:
            continue
        same = sorted(same, key=lambda a: float(a.q or 0.0))
        values = np.sort(np.stack([out[a.name][0] for a in same]), axis=0)
        for a, v in zip(same, values, strict=True):
            sorted_out[a.name] = (v, out[a.name][1])
    return sorted_out


def _selected(
    query: Query, keys: Sequence[Key], where: torch.Tensor | None, cells: int
) -> Release | None:
    from dpnode.sdk._remote.dispatch import _wrap, node_of
    from dpnode.sdk._remote.quantiles import selected_quantile

    ds = query.ds
    aggs = [a for a in query.aggregates if a.family == "selected"]
    if not aggs:
        return None
    if cells > MAX_SELECTED_CELLS:
        raise TooManyCellsError(
            f"{', '.join(a.name for a in aggs)}: the node selects a quantile in at most "
            f"{MAX_SELECTED_CELLS:,} groups at once, and this query has {cells:,}: group by "
            "fewer keys, or declare fewer with keys="
        )
    grouped = bool(keys) or where is not None
    index: torch.Tensor | None = None
    if keys:
        index = cell_index(ds, keys, where)
    elif where is not None:
        index = where.to(torch.int64) - 1  # 0 inside the filter, -1 outside
    tensors: list[torch.Tensor] = []
    for a in aggs:
        assert a.column is not None and a.q is not None
        x: torch.Tensor = ds[a.column]
        if x.dtype == torch.bool:  # the node's quantile takes numbers: a boolean's are 0 and 1
            x = x.to(torch.int64)
        # the quantile is always floating point; an integer column keeps its integer
        # candidates (and answer), a float one its grid over the bounds
        q = torch.tensor(a.q, dtype=torch.float64)
        how = "lower" if a.kind != "quantile" or not x.dtype.is_floating_point else "linear"
        if grouped:
            assert index is not None
            node = selected_quantile(
                node_of(x), q, how, False, index=node_of(index), groups=max(cells, 1)
            )
            meta = torch.empty((max(cells, 1),), dtype=x.dtype, device="meta")
        else:
            node = selected_quantile(node_of(x), q, how, False)
            meta = torch.empty((), dtype=x.dtype, device="meta")
        tensors.append(_wrap(meta, node, getattr(x, "_source", "")))

    def read(released: list[torch.Tensor], receipt: Receipt, epsilon: float) -> Values:
        share = epsilon / len(aggs)
        # the receipt states the quantiles' rank sensitivities summed; they share the
        # rows' subjects, so each is the same part of it
        k = max(1.0, float(receipt.sensitivity_l1) / len(aggs))
        out: Values = {}
        for a, t in zip(aggs, released, strict=True):
            q = float(a.q or 0.0)
            spread = 2 * max(q, 1 - q) if grouped and cells > 1 else 1.0
            v = t.detach().double().reshape(-1).numpy()
            scale = 2 * k * spread / share
            out[a.name] = (np.broadcast_to(v, (cells,)).copy(), np.full(cells, scale))
        return rearranged(aggs, out)

    names = tuple(a.name for a in aggs)
    return Release("selected", names, tensors, len(aggs), False, read, "permute-and-flip")


def compile_query(
    query: Query,
    keys: Sequence[Key],
    where: torch.Tensor | None,
    delta: float | None,
    charged: Callable[[list[torch.Tensor], float | None], float],
) -> Compiled:
    """The publishes of ``query`` (already checked, its filter's mask ``where``), for a
    release at ``delta``.

    ``charged(tensors, delta)``: what the node charges for publishing ``tensors`` in the
    mechanism's norm (asked only for a query of counts alone).
    """
    ds = query.ds
    cells = math.prod(len(k.keys) for k in keys) if keys else 1
    columns = [a.column for a in query.aggregates if a.column is not None]
    columns += [k.column for k in keys]
    rows = _rows(ds, columns or sorted(ds.columns)[:1])
    out = Compiled(cells)
    noised, exact = _noised(query, keys, where, rows, cells, delta, charged)
    out.exact.update(exact)
    # the selection first: the node checks the others for free before it (it answers
    # /sensitivity for noised releases only), so a refusal of any comes before a charge
    selected = _selected(query, keys, where, cells)
    for release in (selected, noised, _distinct(query, keys, where, rows, cells, delta)):
        if release is not None:
            out.releases.append(release)
    return out


def aggregate_names(aggregates: Sequence[Aggregate]) -> list[str]:
    """The output names, in order."""
    return [a.name for a in aggregates]

"""``ds.query()``: an immutable query builder, compiled to remote tensors and published.

>>> from dpnode.sdk.query import col, count, mean
>>> q = ds.query().filter(col("age") > 30).group_by("sex")  # doctest: +SKIP
>>> q.agg(count(), mean("income")).publish(epsilon=1.0)  # doctest: +SKIP

Each method returns a new query. ``plan()`` says, without any request, which publishes a
query makes and how its epsilon is split among them; ``sensitivity()`` asks the node what
each would cost (free). See ``docs/statistics.md``.

The split: each publish gets epsilon (and delta, for the Gaussian ones) in proportion to how
many values it releases per group: the noised publish one per part of its per-row vector
(the count, a sum per column, a square per spread), the others one per aggregate. Every
statistic then gets about the same share, which is what a fixed split can promise without
looking at the data (the errors' sizes depend on the data: a quantile's on the density
around it, a mean's on its group's size).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpnode.sdk.query.aggregates import Aggregate
from dpnode.sdk.query.compile import COUNT, Compiled, Release, Values, compile_query
from dpnode.sdk.query.discovery import (
    DiscoveredKeys,
    discover_keys,
    hidden_columns,
    planned_text,
    publish_discovered,
)
from dpnode.sdk.query.errorbars import ErrorBar, candidate_count, error_bar
from dpnode.sdk.query.errors import InvalidBudgetError, QueryError
from dpnode.sdk.query.expressions import Predicate, column_info
from dpnode.sdk.query.keys import Key, labels, resolve_keys
from dpnode.sdk.query.result import QueryReceipt, QueryResult, Spend

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle
    from dpnode.sdk._publish import Sensitivity

__all__ = ["Query", "split_budget"]


def _check_budget(epsilon: Any, delta: Any) -> tuple[float, float | None]:
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        eps = math.nan
    if not (math.isfinite(eps) and eps > 0):
        raise InvalidBudgetError(
            f"epsilon must be a finite number > 0, got {epsilon!r}: e.g. publish(epsilon=1.0)"
        )
    if delta is None:
        return eps, None
    try:
        d = float(delta)
    except (TypeError, ValueError):
        d = math.nan
    if not (math.isfinite(d) and 0 < d < 1):
        raise InvalidBudgetError(
            f"delta must be a number in (0, 1), or None for pure epsilon (Laplace), got {delta!r}"
        )
    return eps, d


def split_budget(total: float, weights: Sequence[float]) -> list[float]:
    """``total`` split in proportion to ``weights``, the shares summing to at most ``total``.

    >>> split_budget(1.0, [3, 1])
    [0.75, 0.25]
    >>> math.fsum(split_budget(0.1, [1, 1, 1])) <= 0.1
    True
    """
    whole = math.fsum(weights)
    shares = [total * w / whole for w in weights]
    while math.fsum(shares) > total:  # rounded up somewhere: take the excess off the largest
        i = int(np.argmax(shares))
        shares[i] = math.nextafter(shares[i], 0.0)
    return shares


@dataclass(frozen=True, eq=False)
class Query:
    """A query on one dataset: a filter, group keys, aggregates, a top-k; see the module
    docstring. Build it with ``ds.query()``."""

    ds: DatasetHandle
    predicate: Predicate | None = None
    by: tuple[str, ...] = ()
    declared: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    aggregates: tuple[Aggregate, ...] = ()
    top: int | None = None
    top_counts: bool = True

    # -- building -----------------------------------------------------------------------

    def filter(self, predicate: Predicate) -> Query:
        """Only the rows where ``predicate`` holds (``col("age") > 30``); several filters
        combine with ``&``."""
        if not isinstance(predicate, Predicate):
            raise QueryError(f"filter takes a predicate such as col('age') > 30, got {predicate!r}")
        both = predicate if self.predicate is None else self.predicate & predicate
        return replace(self, predicate=both)

    where = filter  # as in SQL and Spark: ``ds.query().where(col("age") > 30)``

    def group_by(
        self, *columns: str | Sequence[str], keys: Mapping[str, Sequence[Any]] | None = None
    ) -> Query:
        """One row per combination of the columns' public keys: ``group_by("education",
        "sex")`` (or a list). ``keys={"age": [30, 40]}`` declares a column's keys (rows
        with another value are in no group)."""
        names: list[str] = []
        for c in columns:
            names.extend([c] if isinstance(c, str) else list(c))
        if not names:
            raise QueryError("group_by needs at least one column")
        for name in names:
            if not isinstance(name, str):
                raise QueryError(f"group_by takes column names, got {name!r}")
        if keys is not None and not isinstance(keys, Mapping):
            raise QueryError(f"keys= maps columns to lists of keys, {{'age': [30, 40]}}: {keys!r}")
        for column, values in (keys or {}).items():
            if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
                raise QueryError(
                    f"keys={{{column!r}: {values!r}}}: give a list of keys, "
                    f"keys={{{column!r}: [...]}}"
                )
        declared = tuple((k, tuple(v)) for k, v in (keys or {}).items())
        return replace(self, by=self.by + tuple(names), declared=self.declared + declared)

    def agg(self, *aggregates: Aggregate) -> Query:
        """The statistics to release: ``agg(count(), mean("income"), median("age"))``."""
        for a in aggregates:
            if not isinstance(a, Aggregate):
                raise QueryError(
                    f"agg takes aggregates such as count() or mean('income'), got {a!r}"
                )
        return replace(self, aggregates=self.aggregates + tuple(aggregates))

    def top_k(self, k: int, *, counts: bool = True) -> Query:
        """Only the ``k`` groups with the most rows, by their noised counts (released with
        the query's other noised values; ranking them is post-processing). ``counts``: keep
        those counts in the result."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise QueryError(f"top_k takes a number of groups >= 1, got {k!r}")
        return replace(self, top=k, top_counts=counts)

    def groups(self) -> list[tuple[Any, ...]]:
        """Each group's keys (one tuple per group, in the result's order; ``[()]`` without
        ``group_by``): public, no request.

        Raises:
            QueryError: a group key without public keys, or too many groups.
        """
        keys = self._keys()
        return labels(keys) if keys else [()]

    # -- checking -------------------------------------------------------------------------

    def _keys(self) -> tuple[Key, ...]:
        if self.top is not None and not self.by:
            raise QueryError("top_k ranks groups: group_by(...) first, then top_k(k)")
        return resolve_keys(self.ds, self.by, dict(self.declared)) if self.by else ()

    def _checked(self) -> tuple[tuple[Key, ...], torch.Tensor | None]:
        """The group keys, and the filter's mask (recorded once: its columns and constants
        are checked as it records)."""
        keys = self._keys()
        if not self.aggregates and self.top is None:
            raise QueryError("nothing to release: add aggregates with .agg(count(), ...)")
        names = [a.name for a in self.aggregates] + list(self.by)
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise QueryError(f"two outputs are named {twice}: tell them apart with .alias(name)")
        for a in self.aggregates:
            a.check(self.ds)
        return keys, None if self.predicate is None else self.predicate.mask(self.ds)

    def _compile(self, delta: float | None) -> tuple[tuple[Key, ...], Compiled]:
        keys, where = self._checked()
        return keys, compile_query(self, keys, where, delta, _charged)

    # -- releasing ------------------------------------------------------------------------

    def plan(self, *, epsilon: float | None = None, delta: float | None = None) -> str:
        """What publishing would do, without any request: the publishes, what each
        releases, the path it takes, and its share of ``epsilon`` if given.

        Raises:
            QueryError: the query would be refused (nothing charged, nothing sent).
        """
        hidden = self._hidden(delta)
        if hidden:  # planned on placeholder keys: the publishes do not depend on them
            return planned_text(self, hidden, epsilon, delta)
        _, compiled = self._compile(delta)
        lines = [f"query on {self.ds.name!r}: {compiled.cells} group(s)"]
        if compiled.exact:
            lines.append(f"  exact (public): {', '.join(_shown(compiled.exact))}")
        weights = [r.weight for r in compiled.releases]
        shares = split_budget(epsilon, weights) if epsilon is not None and weights else None
        for i, r in enumerate(compiled.releases):
            share = "" if shares is None else f", epsilon {shares[i]:.6g}"
            lines.append(
                f"  publish {i + 1}: {r.role} via {r.path} ({', '.join(_shown(r.outputs))}), "
                f"weight {r.weight}{share}"
            )
        return "\n".join(lines)

    def sensitivity(self, *, delta: float | None = None) -> dict[str, Sensitivity]:
        """What the node charges for each noised publish of the query, by role
        (``"noised"``, ``"distinct"``): free. A selected publish's rank sensitivity is on
        its receipt (the node answers this question for noised releases only).

        Raises:
            QueryError: the query would be refused.
        """
        from dpnode.sdk._publish import sensitivity

        _, compiled = self._compile(delta)
        return {r.role: sensitivity(r.tensors) for r in compiled.releases if r.role != "selected"}

    def publish(
        self, *, epsilon: float, delta: float | None = None, description: str = ""
    ) -> QueryResult:
        """Release the query: at most one publish per family, ``epsilon`` (and ``delta``)
        split among them (see the module docstring); returns the table. ``description``:
        what it is for, sent with each of its publishes (an admin approving one reads it).

        Raises:
            QueryError (and its subclasses): refused before any request, nothing charged.
            BudgetExceededError, GraphError: as for ``sdk.publish``.
        """
        eps, dlt = _check_budget(epsilon, delta)
        hidden = self._hidden(dlt)
        if hidden:
            return publish_discovered(self, hidden, eps, dlt, description=description)
        return self._publish(eps, dlt, description=description)

    def discover_keys(self, *, epsilon: float, delta: float) -> DiscoveredKeys:
        """Release the keys of the ``group_by`` columns that the data holds: each key
        (combination) present is counted, noised, and released when its noisy count clears
        a threshold set by ``(epsilon, delta)``; ``delta`` is the most probability that a key
        one person alone holds is released. One publish, charged ``(epsilon, delta)``.
        The query's filter does not apply (every row's key is counted).

        Raises:
            NoPublicKeysError: a float column (declare its keys with ``keys=``), or no delta.
            InvalidBudgetError: a bad epsilon or delta.
            BudgetExceededError, GraphError: as for ``sdk.publish``.
        """
        if not self.by:
            raise QueryError(
                "discover_keys finds the keys of group_by columns: group_by(...) first"
            )
        eps, dlt = _check_budget(epsilon, delta)
        return discover_keys(self.ds, self.by, epsilon=eps, delta=dlt)

    def _hidden(self, delta: float | None) -> tuple[str, ...]:
        return hidden_columns(self.ds, self.by, dict(self.declared), delta)

    def _publish(
        self,
        eps: float,
        dlt: float | None,
        *,
        before: tuple[Spend, ...] = (),
        only: tuple[list[int], set[tuple[Any, ...]]] | None = None,
        total: tuple[float, float | None] | None = None,
        description: str = "",
    ) -> QueryResult:
        from dpnode.sdk._publish import publish

        keys, compiled = self._compile(dlt)
        releases = compiled.releases
        eps_shares = split_budget(eps, [r.weight for r in releases]) if releases else []
        gaussian = [r for r in releases if r.gaussian]
        delta_shares = (
            dict(
                zip(map(id, gaussian), split_budget(dlt, [r.weight for r in gaussian]), strict=True)
            )
            if dlt is not None and gaussian
            else {}
        )
        if len(releases) > 1:
            self._fits(eps, releases)
        values: Values = dict(compiled.exact)
        mechanisms: dict[str, str] = {}  # each output's, for its error bar
        spends = []
        for release, share in zip(releases, eps_shares, strict=True):
            d = delta_shares.get(id(release))
            out = publish(release.tensors, epsilon=share, delta=d, description=description)
            receipt = out[0].receipt
            read = release.read(out, receipt, share)
            if receipt.mechanism == "exact":  # a synthetic table's: no noise, no error bar
                read = {k: (v, np.zeros_like(scale)) for k, (v, scale) in read.items()}
            values.update(read)
            mechanisms.update(dict.fromkeys(read, receipt.mechanism))
            spends.append(Spend(release.role, _shown(release.outputs), share, d, receipt))
        whole = (eps, dlt) if total is None else total
        receipt = QueryReceipt((*before, *spends), *whole)
        return self._table(keys, compiled.cells, values, mechanisms, receipt, only)

    def _fits(self, epsilon: float, releases: Sequence[Release]) -> None:
        """Refuse, before the first of several publishes, a query the node would refuse a
        later one of: else the first would be charged and the last refused. The node
        checks each noised graph free, as a publish would (its prims, dtypes, quotas and
        privacy tracking; the selection, which it does not check so, is published first),
        and the query's pure epsilon must fit what is left of the budget (a Gaussian
        publish may take less than it asks, so it is not counted)."""
        from dpnode.sdk._exceptions import BudgetExceededError
        from dpnode.sdk._publish import sensitivity_body
        from dpnode.sdk._remote import active_session

        if active_session() is not None or self._exact(releases):
            return
        for release in releases:
            if release.role != "selected":  # the node checks a selection only as it runs it
                sensitivity_body(release.tensors)  # type: ignore[arg-type]
        pure = math.fsum(
            s
            for s, r in zip(
                split_budget(epsilon, [r.weight for r in releases]), releases, strict=True
            )
            if not r.gaussian
        )
        remaining = self.ds._client.budget().remaining_epsilon
        if pure > remaining:
            raise BudgetExceededError(
                f"this query's {len(releases)} publishes cost epsilon {epsilon:g} together, and "
                f"{remaining:g} of your budget remains: nothing was published or charged; ask "
                "for less epsilon, fewer statistics, or more budget (client.request_budget)"
            )

    def _exact(self, releases: Sequence[Release]) -> bool:
        """Whether these publishes read synthetic tables this session may download only:
        computed here, exact and free (``dpnode.sdk._synthetic_publish``)."""
        from dpnode.sdk._remote import graph_for
        from dpnode.sdk._synthetic_publish import synthetic_tables

        tensors = [t for r in releases for t in r.tensors]
        names = graph_for(tensors).input_names()  # type: ignore[arg-type]
        return synthetic_tables(self.ds._client, names) is not None

    def _table(
        self,
        keys: Sequence[Key],
        cells: int,
        values: Values,
        mechanisms: Mapping[str, str],
        receipt: QueryReceipt,
        only: tuple[list[int], set[tuple[Any, ...]]] | None = None,
    ) -> QueryResult:
        names = [a.name for a in self.aggregates]
        mechanisms = dict(mechanisms)
        order = list(range(cells))
        cell_keys = labels(keys) if keys else [()]
        if only is not None:  # discovered combinations only, not every one of their values
            at, found = only
            order = [i for i in order if tuple(cell_keys[i][j] for j in at) in found]
        if self.top is not None:
            counts = values[COUNT][0]
            # most rows first; ties in the cells' order (stable)
            order = sorted(order, key=lambda i: -float(counts[i]))[: self.top]
            if self.top_counts and "count" not in names:
                values["count"] = values[COUNT]
                mechanisms["count"] = mechanisms.get(COUNT, "")
                names = ["count", *names]
        columns = list(self.by)
        for n in names:
            columns += [n, f"{n}_scale"]
        candidates = {
            a.name: candidate_count(column_info(self.ds, a.column))
            for a in self.aggregates
            if a.family == "selected" and a.column is not None
        }
        rows = []
        bars: dict[str, list[ErrorBar | None]] = {n: [] for n in names}
        for i in order:
            row: list[Any] = list(cell_keys[i])
            for n in names:
                v, s = values[n]
                row += [_python(v[i]), float(s[i])]
                bars[n].append(error_bar(mechanisms.get(n, ""), float(s[i]), candidates.get(n, 1)))
            rows.append(tuple(row))
        return QueryResult(columns, rows, receipt, bars)


def _python(value: Any) -> Any:
    return float(value)


def _shown(names: Sequence[str] | Mapping[str, Any]) -> tuple[str, ...]:
    return tuple("count (for top_k)" if n == COUNT else n for n in names)


def _charged(tensors: list[torch.Tensor], delta: float | None) -> float:
    """What the node charges for publishing ``tensors`` together, in the mechanism's norm:
    asked of the node (free), or of the same tracker on the mock data in mock mode."""
    from dpnode.sdk._remote import active_session

    norm = "l1" if delta is None else "l2"
    session = active_session()
    if session is None:
        from dpnode.sdk._publish import sensitivity_body

        return float(sensitivity_body(tensors)[norm])  # type: ignore[arg-type]
    from dpnode.core import errors as node_errors
    from dpnode.core.engine import plan
    from dpnode.core.privacy.release import plan_release
    from dpnode.sdk._exceptions import error_for
    from dpnode.sdk._mock_publish import mock_inputs
    from dpnode.sdk._remote import graph_for

    graph = graph_for(tensors)  # type: ignore[arg-type]
    specs, _ = mock_inputs(session, tensors, graph.input_names())
    try:
        report = plan_release(plan(graph, accurate=True), specs, epsilon=1.0, delta=delta).report
    except node_errors.DPNodeError as exc:  # the node's own checks, raised as the SDK's
        raise error_for(400, exc.code, exc.detail) from None
    return float(report.l1 if delta is None else report.l2)

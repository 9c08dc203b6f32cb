"""Group keys discovered privately: the keys the data holds, released above a noisy threshold.

A column without public keys (a zip code declared as an integer in ``[0, 99999]``, too many
to enumerate) is grouped by the keys the data holds, discovered by one release: the node's
``key_counts`` of the key columns, each key present counted, noised (discrete Laplace) and
released only when its noisy count clears a threshold derived from ``(epsilon, delta)``
(``dpnode.core.dp.keysets``). Several key columns are combined into one code per row here,
with ordinary tensor arithmetic the node tracks (``(x1 - lo1) * size2 + (x2 - lo2)``), so one
row still holds one key; the released codes are decoded back into tuples of keys.

``ds.query().group_by("zip").discover_keys(epsilon=0.5, delta=1e-6)`` releases the keys
alone; ``publish(epsilon=, delta=)`` on a query grouped by such a column discovers them
first (with :data:`DISCOVERY_SHARE` of epsilon and all of delta) and then releases its
statistics per discovered key as public keys, with the rest of epsilon (pure, Laplace).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpnode.sdk.query.errors import NoPublicKeysError, QueryError, TooManyCellsError
from dpnode.sdk.query.expressions import column_info, is_integral, value_span
from dpnode.sdk.query.keys import resolve_keys

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle
    from dpnode.sdk._publish import Receipt
    from dpnode.sdk.query.plan import Query
    from dpnode.sdk.query.result import QueryResult

__all__ = [
    "DISCOVERY_SHARE",
    "DiscoveredKeys",
    "discover_keys",
    "fitting",
    "hidden_columns",
    "key_code",
    "placeholders",
    "planned_text",
    "publish_discovered",
]

#: The part of a query's epsilon its key discovery takes (the rest pays for its statistics).
DISCOVERY_SHARE = 0.5
#: Combined codes are released as float64: every combination must be exact in one.
_MAX_CODES = 2**53


@dataclass(frozen=True)
class DiscoveredKeys:
    """Keys released above a noisy threshold.

    Attributes:
        columns: the key columns.
        keys: one tuple per released key (categories as their names), sorted by code.
        counts: each key's noisy count (the number of rows holding it, noised).
        threshold: a key was released when its noisy count was at least this.
        receipt: the node's receipt (epsilon, delta, threshold, noise scale).
    """

    columns: tuple[str, ...]
    keys: list[tuple[Any, ...]]
    counts: list[float]
    threshold: float
    receipt: Receipt

    def __len__(self) -> int:
        return len(self.keys)

    def values(self, column: str) -> list[Any]:
        """The distinct released keys of one column, in order (as ``keys={column: ...}``)."""
        i = self.columns.index(column)
        return sorted({k[i] for k in self.keys})


@dataclass(frozen=True)
class _Radix:
    column: str
    lo: int
    size: int
    categories: tuple[Any, ...] | None


def _radix(ds: DatasetHandle, column: str) -> _Radix:
    info = column_info(ds, column)
    if info.categories is not None:
        return _Radix(column, 0, len(info.categories), tuple(info.categories))
    if not is_integral(info):
        raise NoPublicKeysError(
            f"group_by({column!r}): column {column!r} is {info.dtype}: keys are discovered "
            "from integer or categorical columns only; declare the keys to group by, "
            f"group_by({column!r}, keys={{{column!r}: [...]}})"
        )
    lo, hi = value_span(info)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise NoPublicKeysError(
            f"group_by({column!r}): column {column!r} has no finite bounds to discover keys "
            f"within; declare the keys, group_by({column!r}, keys={{{column!r}: [...]}})"
        )
    return _Radix(column, int(lo), int(hi) - int(lo) + 1, None)


def placeholders(ds: DatasetHandle, columns: Sequence[str]) -> tuple[tuple[str, tuple[Any]], ...]:
    """One key each column can hold, to plan a query before its keys are discovered.

    Raises:
        NoPublicKeysError: a column whose keys cannot be discovered (see :func:`key_code`).
    """
    out = []
    for r in (_radix(ds, c) for c in columns):
        out.append((r.column, (r.categories[0] if r.categories is not None else r.lo,)))
    return tuple(out)


def key_code(ds: DatasetHandle, columns: Sequence[str]) -> tuple[torch.Tensor, list[_Radix]]:
    """Each row's combined key code (row-major, the first column varying slowest), a remote
    int64 tensor, and how to decode it.

    Raises:
        NoPublicKeysError: a float column, or one without finite bounds.
        QueryError: more combinations than a float64 holds exactly.
    """
    radices = [_radix(ds, c) for c in columns]
    if math.prod(r.size for r in radices) > _MAX_CODES:
        raise QueryError(
            f"group_by({', '.join(map(repr, columns))}): the columns' bounds make more than "
            "2^53 combinations: discover the keys of fewer columns at once, or declare keys="
        )
    code: torch.Tensor | None = None
    for r in radices:
        x = ds[r.column].to(torch.int64)
        x = x - r.lo if r.lo else x
        code = x if code is None else code * r.size + x
    assert code is not None
    return code, radices


def _decode(codes: np.ndarray[Any, Any], radices: Sequence[_Radix]) -> list[tuple[Any, ...]]:
    out = []
    for code in codes.astype(np.int64).tolist():
        parts: list[Any] = []
        for r in reversed(radices):
            code, digit = divmod(code, r.size)
            parts.append(r.categories[digit] if r.categories is not None else r.lo + digit)
        out.append(tuple(reversed(parts)))
    return out


def discover_keys(
    ds: DatasetHandle,
    columns: Sequence[str],
    *,
    epsilon: float,
    delta: float | None,
    description: str = "",
) -> DiscoveredKeys:
    """Release the keys (combinations of ``columns``' values) the data holds, each kept
    when its noisy count clears the threshold ``(epsilon, delta)`` set: one publish.

    Raises:
        NoPublicKeysError: a float column, or one without finite bounds; or no ``delta``.
        QueryError: too many combinations.
        BudgetExceededError, GraphError: as for ``sdk.publish``.
    """
    from dpnode.sdk._exceptions import DPNodeError
    from dpnode.sdk._publish import Receipt, _client, _frame, _naming_calls, _not_in_mock_mode
    from dpnode.sdk._remote.dispatch import _wrap, node_of
    from dpnode.sdk._remote.graph import prim

    if delta is None:
        raise NoPublicKeysError(
            f"group_by({', '.join(map(repr, columns))}) has no public keys: declare them "
            "with keys={column: [...]}, or discover them privately by passing delta= "
            "(e.g. publish(epsilon=1.0, delta=1e-6)), the chance of releasing a key one "
            "person alone holds"
        )
    _not_in_mock_mode("discovering keys")
    code, radices = key_code(ds, columns)
    node = prim("key_counts", node_of(code))
    rows = int(code.shape[0])
    node.shape, node.dtype = (rows, 2), torch.int64
    meta = torch.empty((rows, 2), dtype=torch.int64, device="meta")
    counts_of = _wrap(meta, node, code._source)  # type: ignore[attr-defined]
    items = [counts_of]
    with _naming_calls(items):
        values, body = _client(None, items).publish_frame(
            _frame(items), epsilon=epsilon, delta=delta, description=description
        )
    answer = np.asarray(values[0], dtype=np.float64).reshape(-1, 2)
    receipt = Receipt.from_json(body)
    if receipt.threshold is None:
        raise DPNodeError("the node answered a key release without its threshold")
    keys = _decode(answer[:, 0], radices)
    return DiscoveredKeys(tuple(columns), keys, answer[:, 1].tolist(), receipt.threshold, receipt)


def hidden_columns(
    ds: DatasetHandle,
    by: Sequence[str],
    declared: Mapping[str, Sequence[Any]],
    delta: float | None,
) -> tuple[str, ...]:
    """The ``group_by`` columns without public or declared keys, to be discovered.

    Raises:
        NoPublicKeysError: there are some and no ``delta`` to discover them with (the
            message names ``keys=`` and ``delta=``).
    """
    hidden = []
    problem = None
    for c in by:
        if c in declared:
            continue
        try:
            resolve_keys(ds, (c,), None)
        except NoPublicKeysError as exc:
            hidden.append(c)
            problem = problem or exc
    if problem is not None and delta is None:
        raise NoPublicKeysError(
            f"{problem.detail}; or discover the keys the data holds privately, above a "
            "noisy threshold: pass delta= too (publish(epsilon=1.0, delta=1e-6))"
        ) from problem
    return tuple(hidden)


def fitting(
    query: Query, hidden: Sequence[str], found: DiscoveredKeys
) -> tuple[Query, set[tuple[Any, ...]]]:
    """``query`` on the discovered keys as declared keys, as many as a query may hold: those
    with the largest noisy counts when there are more (post-processing: nothing more is
    charged, and the discovery, already charged, is not wasted on a refusal); and the
    discovered combinations kept.

    Raises:
        TooManyCellsError: not even one key fits (the public keys of the other columns).
    """
    ranked = [k for _, k in sorted(zip(found.counts, found.keys, strict=True), reverse=True)]
    keep = len(ranked)
    while True:
        kept = ranked[:keep]
        declared = tuple((c, tuple(sorted({k[i] for k in kept}))) for i, c in enumerate(hidden))
        q = replace(query, declared=query.declared + declared)
        try:
            q._compile(None)
        except TooManyCellsError:
            if keep == 1:
                raise
            keep //= 2
            continue
        return q, set(kept)


def planned_text(
    query: Query, hidden: Sequence[str], epsilon: float | None, delta: float | None
) -> str:
    """``query.plan(epsilon=, delta=)`` for a query whose ``hidden`` keys are discovered first:
    the discovery, then the query's publishes planned on placeholder keys (which publishes a
    query makes, and their shares, do not depend on its keys)."""
    from dpnode.sdk.query.plan import split_budget

    first = None
    if epsilon is not None:
        first, epsilon = split_budget(epsilon, [DISCOVERY_SHARE, 1 - DISCOVERY_SHARE])
    q = replace(query, declared=query.declared + placeholders(query.ds, hidden))
    share = "" if first is None else f", epsilon {first:.6g}, delta {delta:g}"
    _, *rest = q.plan(epsilon=epsilon).split("\n")
    names = ", ".join(hidden)
    return "\n".join(
        [
            f"query on {query.ds.name!r}: one group per key of {names} the data holds, "
            "discovered first",
            f"  publish 0: the keys of {names} above a noisy threshold (key_counts){share}",
            *rest,
        ]
    )


def publish_discovered(
    query: Query,
    hidden: tuple[str, ...],
    epsilon: float,
    delta: float | None,
    *,
    description: str = "",
) -> QueryResult:
    """Discover the keys of ``hidden`` (:data:`DISCOVERY_SHARE` of ``epsilon``, all of
    ``delta``), then release ``query``'s statistics per discovered key as public keys (the
    rest of epsilon, pure). Everything that can refuse the query is checked before the
    discovery is charged; no key found: an empty table, nothing more charged."""
    from dpnode.sdk._exceptions import BudgetExceededError
    from dpnode.sdk._remote import active_session
    from dpnode.sdk.query.plan import split_budget
    from dpnode.sdk.query.result import QueryReceipt, QueryResult, Spend

    first, rest = split_budget(epsilon, [DISCOVERY_SHARE, 1 - DISCOVERY_SHARE])
    replace(query, declared=query.declared + placeholders(query.ds, hidden))._checked()
    if active_session() is None:
        remaining = query.ds._client.budget().remaining_epsilon
        if epsilon > remaining:
            raise BudgetExceededError(
                f"this query's key discovery and statistics cost epsilon {epsilon:g} together, "
                f"and {remaining:g} of your budget remains: nothing was published or charged"
            )
    found = discover_keys(query.ds, hidden, epsilon=first, delta=delta, description=description)
    spend = Spend("keys", hidden, first, delta, found.receipt)
    if not found.keys:
        names = [a.name for a in query.aggregates]
        columns = list(query.by) + [c for n in names for c in (n, f"{n}_scale")]
        return QueryResult(columns, [], QueryReceipt((spend,), epsilon, delta), {})
    q, kept = fitting(query, hidden, found)
    at = [query.by.index(c) for c in hidden]
    return q._publish(
        rest,
        None,
        before=(spend,),
        only=(at, kept),
        total=(epsilon, delta),
        description=description,
    )

"""One statistic over same-schema datasets on several nodes: each site releases its part.

``sdk.federated([ds_a, ds_b, ds_c]).publish(lambda ds: ds["age"].double().sum(),
epsilon=0.5)`` records the same computation on every site's dataset handle, and each site
publishes its part through its own session (a thread per site): that node's policy decides,
its ledger is charged, its noise is added, exactly as for a publish on that node alone.
The parts are combined here, in the client, which is post-processing: each site's
guarantee is its own and nothing about it changes. Sums add, and so do their independent
noises' variances, which the :class:`FederatedReceipt` states beside every site's charge.

A site that refuses (its policy, its budget, an approval it waits for, no answer) is never
left out silently: by default :class:`FederatedError` is raised, carrying the parts that
were released (and charged) so that nothing paid for is lost; ``allow_partial=True``
combines the parts that were released and says on the receipt which sites are missing.

The trade-off: sites are independent releases, so a federated sum's noise is ``sqrt(k)``
times one node's (k sites each protecting their own subjects), instead of the noise of one
release over pooled rows, which no single party may compute here.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from dpnode.sdk._exceptions import DPNodeError
from dpnode.sdk._federated_receipts import (
    FederatedError,
    FederatedReceipt,
    FederatedResult,
    SiteRelease,
    refusal_message,
)
from dpnode.sdk._publish import publish
from dpnode.sdk._remote import active_session

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle

__all__ = ["Federated", "federated", "site_name"]

Combine = Callable[[list[Any]], Any]


def site_name(handle: DatasetHandle) -> str:
    """Where ``handle`` lives: its node (a network's name for it, else its session's URL)."""
    node = getattr(handle, "node", None)
    return str(node) if node else str(handle._client.url)


def _schema_difference(first: DatasetHandle, other: DatasetHandle) -> str | None:
    """How ``other``'s public schema differs from ``first``'s, or None when they agree."""
    a, b = first.columns, other.columns
    if list(a) != list(b):
        missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        if not (missing or extra):
            return f"columns in another order ({list(b)} for {list(a)})"
        return f"columns missing: {missing or 'none'}, columns extra: {extra or 'none'}"
    for name, ca in a.items():
        cb = b[name]
        for what in ("dtype", "shape", "bounds", "categories"):
            va, vb = getattr(ca, what), getattr(cb, what)
            if va != vb:
                return f"column {name!r} has {what} {vb!r} where the first dataset has {va!r}"
    return None


class Federated:
    """Same-schema datasets on several nodes, published together (see the module).

    Args:
        handles: dataset handles, each bound to the session it was found with (one login
            per node); their schemas (column names, dtypes, per-row shapes, declared bounds,
            categories) must agree.

    Raises:
        DPNodeError: no handles, something other than a dataset handle, the same dataset
            twice, or schemas that differ (the message names the column and the
            difference); nothing is sent.
    """

    def __init__(self, handles: Sequence[DatasetHandle]) -> None:
        from dpnode.sdk._handles import DatasetHandle

        items = list(handles)
        if not items:
            raise DPNodeError("federated() needs at least one dataset handle")
        for h in items:
            if not isinstance(h, DatasetHandle):
                raise DPNodeError(
                    f"federated() takes dataset handles (client.dataset(...), search results), "
                    f"got {type(h).__name__}"
                )
        seen: set[tuple[str, int]] = set()
        for h in items:
            key = (site_name(h), h.id)
            if key in seen:
                raise DPNodeError(
                    f"dataset {h.name!r} on {key[0]} is given twice: its rows would count "
                    "twice; pass each dataset once"
                )
            seen.add(key)
        first = items[0]
        for h in items[1:]:
            difference = _schema_difference(first, h)
            if difference is not None:
                raise DPNodeError(
                    f"the datasets do not share a schema: {h.name!r} on {site_name(h)} "
                    f"differs from {first.name!r} on {site_name(first)}: {difference}. "
                    "A federated release needs the same columns, dtypes, bounds and "
                    "categories everywhere (ask the sites' owners to align them, or leave "
                    "that dataset out); nothing was sent"
                )
        self.handles: tuple[DatasetHandle, ...] = tuple(items)

    @property
    def row_count(self) -> int:
        """The pooled row count: public, as every site's row count is."""
        return sum(h.row_count for h in self.handles)

    def count(self) -> int:
        """The pooled number of rows: exact and free, since row counts are public (the
        privacy unit replaces a subject's rows, it never adds or removes rows)."""
        return self.row_count

    def publish(
        self,
        fn: Callable[[DatasetHandle], Any],
        *,
        epsilon: float,
        delta: float | None = None,
        combine: Combine | None = None,
        allow_partial: bool = False,
        description: str = "",
    ) -> FederatedResult:
        """Publish ``fn(ds)`` on every site and combine the parts.

        Args:
            fn: records the computation on one site's handle, returning a remote tensor
                or a list of them: ``lambda ds: ds["age"].double().sum()``. It is called
                once per site, before anything is sent.
            epsilon, delta: each site's publish, as for :func:`sdk.publish` (no delta:
                Laplace; a delta: Gaussian). Each site charges its own ledger.
            combine: how to combine the parts, given the list of released parts in site
                order (each a tensor, or a list of tensors); default: add them (with the
                combined noise sd on the receipt). Yours is post-processing: the receipt
                then states each site's noise and no combined sd.
            allow_partial: combine the parts of the sites that released when others
                refuse, saying so on the receipt; default: raise.
            description: kept in each site's ledger row and shown to its approvers.

        Returns:
            A :class:`FederatedResult` (``.value``, ``.receipt``).

        Raises:
            FederatedError: a site refused (its ``sites`` hold every part, released and
                charged or refused with its reason); with ``allow_partial``, only when
                every site refused.
            DPNodeError: ``fn`` failed to record on a site's handle; nothing was sent.
        """
        if active_session() is not None:
            parts = [self._dry_run(h, fn, epsilon=epsilon, delta=delta) for h in self.handles]
            return self._combine(parts, combine, allow_partial)
        recorded = []
        for h in self.handles:
            try:
                recorded.append(fn(h))
            except DPNodeError as exc:
                raise type(exc)(
                    f"recording fn on {h.name!r} at {site_name(h)} failed, nothing was sent: "
                    f"{exc.detail}",
                    status=exc.status,
                    code=exc.code,
                ) from exc
        parts = self._release(recorded, epsilon=epsilon, delta=delta, description=description)
        return self._combine(parts, combine, allow_partial)

    @staticmethod
    def _combine(
        parts: list[SiteRelease], combine: Combine | None, allow_partial: bool
    ) -> FederatedResult:
        """The parts combined (or the refusal raised), with the combined receipt."""
        released = [p for p in parts if not p.refused]
        refused = [p for p in parts if p.refused]
        if refused and (not allow_partial or not released):
            raise FederatedError(refusal_message(parts, allow_partial), parts)
        values = [p.value for p in released]
        if combine is not None:
            value, sd, how = combine(values), None, "combined by your function"
        else:
            value = _add(values)
            sd = math.sqrt(sum((p.noise_sd or 0.0) ** 2 for p in released))
            how = f"sum of {len(released)} sites' releases"
        receipt = FederatedReceipt(tuple(parts), sd, how, partial=bool(refused))
        return FederatedResult(value, receipt)

    def sum(
        self,
        column: str,
        *,
        epsilon: float,
        delta: float | None = None,
        allow_partial: bool = False,
    ) -> FederatedResult:
        """The pooled sum of ``column``: each site's noised sum (float64), added.

        Raises:
            KeyError: no such column. FederatedError: as for :meth:`publish`.
        """
        return self.publish(
            lambda ds: ds[column].double().sum(),
            epsilon=epsilon,
            delta=delta,
            allow_partial=allow_partial,
            description=f"federated sum of {column!r}",
        )

    def mean(
        self,
        column: str,
        *,
        epsilon: float,
        delta: float | None = None,
        allow_partial: bool = False,
    ) -> FederatedResult:
        """The pooled mean of ``column``: the federated sum over the pooled row count.

        The row counts are public (one subject's rows are replaced, never removed), so
        the ratio's only noise is the sum's: the receipt's ``noise_sd`` is the sum's over
        the rows, exact. With ``allow_partial`` the mean is over the sites that released
        (their rows only), as the receipt says.

        Raises:
            KeyError: no such column. FederatedError: as for :meth:`publish`.
        """
        total = self.sum(column, epsilon=epsilon, delta=delta, allow_partial=allow_partial)
        rows = sum(s.rows for s in total.receipt.released)
        sd = total.receipt.noise_sd
        receipt = FederatedReceipt(
            total.receipt.sites,
            None if sd is None else sd / rows,
            f"mean of {column!r}: sum of {len(total.receipt.released)} sites' releases over "
            f"their {rows} rows (public)",
            partial=total.receipt.partial,
        )
        return FederatedResult(total.value / rows, receipt)

    @staticmethod
    def _dry_run(
        h: DatasetHandle, fn: Callable[[DatasetHandle], Any], *, epsilon: float, delta: float | None
    ) -> SiteRelease:
        """Inside ``sdk.mock(...)``: the site's part on its own mock data, charging nothing
        (the session finds each node's mock by node and id, as ids are per node)."""
        value = publish(fn(h), epsilon=epsilon, delta=delta)
        first = value[0] if isinstance(value, list) else value
        return SiteRelease(site_name(h), h.name, _rows(h), value=value, receipt=first.receipt)

    def _release(
        self, recorded: list[Any], *, epsilon: float, delta: float | None, description: str
    ) -> list[SiteRelease]:
        """Each site publishes its recorded part with its own session, concurrently."""
        # one key for the whole federated release, distinct per site: a site that is asked
        # again (its client's retries) answers with its first answer, charged once
        key = uuid.uuid4().hex
        counts = [_rows(h) for h in self.handles]

        def run(i: int) -> SiteRelease:
            h = self.handles[i]
            node, rows = site_name(h), counts[i]
            try:
                value = publish(
                    recorded[i],
                    epsilon=epsilon,
                    delta=delta,
                    client=h._client,
                    idempotency_key=f"{key}-{i}",
                    description=description,
                )
            except DPNodeError as exc:
                return SiteRelease(node, h.name, rows, error=exc)
            first = value[0] if isinstance(value, list) else value
            return SiteRelease(node, h.name, rows, value=value, receipt=first.receipt)

        with ThreadPoolExecutor(max_workers=len(self.handles)) as pool:
            return list(pool.map(run, range(len(self.handles))))


def _rows(handle: DatasetHandle) -> int:
    """The rows a publish on ``handle`` reads: its row count, or its mock data's in a dry
    run inside ``sdk.mock(...)`` (a column's shape there; recording costs no request)."""
    if active_session() is None:
        return handle.row_count
    return int(handle[next(iter(handle.columns))].shape[0])


def _add(values: list[Any]) -> Any:
    """Add the sites' parts, output by output."""
    if isinstance(values[0], list):
        return [_add([v[j] for v in values]) for j in range(len(values[0]))]
    total: torch.Tensor = values[0].clone()
    for v in values[1:]:
        total = total + v
    return total


def federated(handles: Sequence[DatasetHandle]) -> Federated:
    """Same-schema datasets on several nodes, to publish one statistic across them:
    see :class:`Federated`."""
    return Federated(handles)

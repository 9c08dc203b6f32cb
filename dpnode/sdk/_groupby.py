"""Statistics per group of a public key: ``ds.groupby("sex").mean("bmi", epsilon=1.0)``.

The groups are public: a categorical column's categories, or every integer in an integer
column's declared bounds (or the ``categories`` given). Each row belongs to the group its key
names, through a one-hot comparison with the public keys, so that replacing a row moves it
out of one group and into another, whatever the key's value: every statistic of every group
comes back from one publish, charged once.

* ``count``: the rows per group (sensitivity L1 2).
* ``sum(column)``: the column's sum per group, from the sum of each value less the middle
  of its bounds over half their width (in ``[-1, 1]``: half the sensitivity of summing the
  values themselves, and the same size as a count), released with the counts and rescaled.
* ``mean(column)``: the ratio of the noised sum to the noised count per group, done the
  standard way: numerator and denominator are released, noised together, and divided here
  (post-processing). A mean is clipped to the column's bounds, and a group whose noised count
  is below 1 gets the middle of the bounds.
* ``agg(bmi="mean", age="sum", ...)``: several columns' statistics and the counts in one
  publish, each normalised so that they carry the same share of the noise.
* ``median(column)`` and ``quantile(column, q)``: per group, selected by the exponential
  mechanism over the column's public range (dpnode.core.dp.selection), in one publish: a replaced
  row leaves one group and enters another, which moves two groups' scores by ``alpha`` or
  ``1 - alpha`` each, and every group's selection is calibrated to that sum (for the median,
  to one row's move).

A row's contribution to all the sums and counts lies in one group, each part at most 1 in
size: one vector of L1 norm at most ``parts`` (the columns and the count), or L2 norm at
most ``sqrt(parts)``, clipped per subject by the node's ``clip_by_subject_norm`` in the norm
of the mechanism (L1 for Laplace, L2 for Gaussian with ``delta``), so the sensitivity is
twice that whatever the number of groups: a mean per group at L1 4, as one mean.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from dpnode.sdk._exceptions import DPNodeError
from dpnode.sdk._remote.handles import column_info

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle
    from dpnode.sdk._publish import Receipt

__all__ = ["GroupStatistics", "Grouped"]

#: more groups than this is a histogram of a continuous column, not a group-by
_MAX_GROUPS = 10_000


class GroupStatistics(dict[Any, float]):
    """One statistic per group (key -> value), with the publish's ``receipt``."""

    receipt: Receipt


class Grouped:
    """The rows of a dataset grouped by a public key; see the module docstring."""

    def __init__(self, ds: DatasetHandle, by: str, categories: Any = None) -> None:
        info = column_info(ds, by)
        if info.shape:
            raise DPNodeError(
                f"groupby needs a column with one key per row; {by!r} is {info.shape}"
            )
        if categories is not None:
            keys = list(categories)
            codes = keys if info.categories is None else [info.categories.index(k) for k in keys]
        elif info.categories is not None:
            keys, codes = list(info.categories), list(range(len(info.categories)))
        elif info.dtype.startswith(("int", "uint", "bool")):
            lo, hi = info.bounds
            if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo + 1 > _MAX_GROUPS:
                raise DPNodeError(
                    f"column {by!r} has bounds [{lo:g}, {hi:g}]: pass categories= (the keys to "
                    f"group by), at most {_MAX_GROUPS:,}"
                )
            keys = list(range(math.ceil(lo), math.floor(hi) + 1))
            codes = keys
        else:
            raise DPNodeError(
                f"column {by!r} is {info.dtype}: group by a categorical or integer column, or "
                "pass categories= (the values to group by)"
            )
        if not keys or len(keys) > _MAX_GROUPS:
            raise DPNodeError(f"groupby needs 1 to {_MAX_GROUPS:,} groups, got {len(keys)}")
        self.ds, self.by, self.keys = ds, by, keys
        self._codes = torch.tensor(codes)

    def _members(self) -> torch.Tensor:
        """(rows, groups): 1.0 where the row's key is the group's."""
        key = self.ds[self.by]
        return (key.unsqueeze(-1) == self._codes.to(key.dtype)).to(torch.float64)

    def _scale(self, column: str) -> tuple[float, float, float, float]:
        """The column's bounds, their middle and half their width: ``(lo, hi, middle, half)``.

        Raises:
            KeyError: no such column.
            DPNodeError: not a numeric column with finite bounds.
        """
        info = column_info(self.ds, column)
        lo, hi = info.bounds
        if (
            info.shape
            or info.categories is not None
            or not (math.isfinite(lo) and math.isfinite(hi))
        ):
            raise DPNodeError(f"column {column!r} is not a numeric column with finite bounds")
        return float(lo), float(hi), (lo + hi) / 2, max((hi - lo) / 2, 1e-12)

    def _result(self, values: torch.Tensor, receipt: Receipt) -> GroupStatistics:
        out = GroupStatistics(zip(self.keys, (float(v) for v in values), strict=True))
        out.receipt = receipt
        return out

    def _release(
        self, columns: list[str], epsilon: float, delta: float | None
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor, Receipt]:
        """Per group, each column's sum of its values less the middle of its bounds, over half
        the bounds' width (in [-1, 1] per row), and the count: noised together, one publish.
        Returns the noised normalised sums by column, the noised counts and the receipt."""
        from dpnode.sdk._per_sample import clipped_sum
        from dpnode.sdk._publish import publish

        members = self._members()
        parts = []
        for column in columns:
            _, _, middle, half = self._scale(column)
            value = (self.ds[column].to(torch.float64) - middle) / half
            parts.append(value.unsqueeze(-1) * members)
        parts.append(members)
        # A row's contribution to every part lies in one group, each part at most 1 in
        # size: one vector of L1 norm at most ``parts`` (Laplace) or L2 norm at most
        # ``sqrt(parts)`` (Gaussian); a subject's rows are summed before that bound is
        # applied (a no-op for one row per subject), so the node's sensitivity is twice it
        order = 1 if delta is None else 2
        bound = len(parts) ** (1 / order) * (1 + 1e-9)
        both = clipped_sum(parts, max_norm=bound, groups=self.ds.subjects, ord=order)
        flat = publish(both, epsilon=epsilon, delta=delta)
        k = len(self.keys)
        released = [flat[i * k : (i + 1) * k] for i in range(len(parts))]
        receipt = flat.receipt
        return dict(zip(columns, released[:-1], strict=True)), released[-1], receipt

    def _statistic(
        self, how: str, column: str, sums: dict[str, torch.Tensor], counts: torch.Tensor
    ) -> torch.Tensor:
        lo, hi, middle, half = self._scale(column)
        if how == "sum":
            return half * sums[column] + middle * counts
        mean = middle + half * sums[column] / counts.clamp(min=1)
        return torch.where(counts >= 1, mean, torch.full_like(counts, middle)).clamp(lo, hi)

    def count(self, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """Rows per group, noised (Laplace; Gaussian with ``delta``)."""
        _, counts, receipt = self._release([], epsilon, delta)
        return self._result(counts, receipt)

    def sum(self, column: str, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """The column's sum per group, noised."""
        sums, counts, receipt = self._release([column], epsilon, delta)
        return self._result(self._statistic("sum", column, sums, counts), receipt)

    def mean(self, column: str, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """The column's mean per group: noised sum over noised count, within the bounds."""
        sums, counts, receipt = self._release([column], epsilon, delta)
        return self._result(self._statistic("mean", column, sums, counts), receipt)

    def quantile(self, column: str, q: Any, *, epsilon: float) -> GroupStatistics:
        """The column's ``q`` quantile per group (a number, or several: a list per group),
        selected by permute-and-flip over the column's public range (pure epsilon).

        A replaced row leaves one group and enters another, so two groups' selections move
        and each is calibrated to that; several quantiles share ``epsilon`` equally. An empty
        group's answer is a candidate chosen uniformly from the range.
        """
        return self._selected(column, q, "linear", epsilon)

    def median(self, column: str, *, epsilon: float) -> GroupStatistics:
        """The column's (lower) median per group, as :meth:`quantile` with ``q = 0.5``."""
        return self._selected(column, 0.5, "lower", epsilon)

    def _selected(self, column: str, q: Any, interpolation: str, epsilon: float) -> GroupStatistics:
        from dpnode.sdk._publish import publish
        from dpnode.sdk._remote.dispatch import _wrap, node_of
        from dpnode.sdk._remote.quantiles import selected_quantile

        self._scale(column)  # a numeric column with finite bounds
        x: torch.Tensor = self.ds[column]
        qs = torch.as_tensor(q, dtype=torch.float64)
        if qs.ndim > 1 or not bool(((qs >= 0) & (qs <= 1)).all()):
            raise DPNodeError(f"q must be a number or a list of numbers in [0, 1], got {q!r}")
        if interpolation == "linear" and not x.dtype.is_floating_point:
            x = x.to(torch.float64)
        numbers = torch.arange(1, len(self.keys) + 1, dtype=torch.float64)
        index = ((self._members() @ numbers) - 1).to(torch.int64)  # -1: in no group
        node = selected_quantile(
            node_of(x),
            qs.to(x.dtype),
            interpolation,
            False,
            index=node_of(index),
            groups=len(self.keys),
        )
        meta = torch.empty((len(self.keys), *qs.shape), dtype=x.dtype, device="meta")
        released = publish(_wrap(meta, node, getattr(x, "_source", "")), epsilon=epsilon)
        values = released.tolist()
        out = GroupStatistics(zip(self.keys, values, strict=True))
        out.receipt = released.receipt
        return out

    def agg(
        self, *, epsilon: float, delta: float | None = None, **statistics: str
    ) -> dict[str, GroupStatistics]:
        """Several statistics per group in one publish, charged once:
        ``agg(bmi="mean", age="sum", epsilon=1.0)``; the result also has ``"count"``.

        Each column's part of the release is normalised by its bounds, so every statistic
        and the counts carry the same share of the noise.

        Raises:
            DPNodeError: a statistic other than ``"mean"`` or ``"sum"``, or none asked.
        """
        if not statistics:
            raise DPNodeError('agg needs at least one column="mean" or column="sum"')
        for column, how in statistics.items():
            if how not in ("mean", "sum"):
                raise DPNodeError(
                    f'{column}={how!r}: a statistic is "mean" or "sum" (medians and quantiles '
                    "per group are selected, not noised: .median(column) or .quantile(column, q))"
                )
        sums, counts, receipt = self._release(list(statistics), epsilon, delta)
        out = {
            column: self._result(self._statistic(how, column, sums, counts), receipt)
            for column, how in statistics.items()
        }
        out["count"] = self._result(counts, receipt)
        return out

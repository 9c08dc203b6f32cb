"""Statistics per group of a public key: ``ds.groupby("sex").mean("bmi", epsilon=1.0)``.

The groups are public: a categorical column's categories, or every integer in an integer
column's declared bounds (or the ``categories`` given). Each row belongs to the group its key
names, through a one-hot comparison with the public keys, so that replacing a row moves it
out of one group and into another, whatever the key's value: every statistic of every group
comes back from one publish, charged once.

* ``count``: the rows per group (sensitivity L1 2).
* ``sum(column)``: the column's sum per group, from the sum of each value less the middle
  of its bounds (half the sensitivity of summing the values themselves), plus the middle
  times the count, released together.
* ``mean(column)``: the ratio of the noised sum to the noised count per group, done the
  standard way: numerator and denominator are released, noised together, and divided here
  (post-processing). The counts are released scaled by half the bounds' width, so that both
  carry the same share of the noise; a mean is clipped to the column's bounds, and a group
  whose noised count is below 1 gets the middle of the bounds.

With ``delta`` (Gaussian), a row's contribution to all the sums and counts is one vector of
L2 norm at most ``sqrt(2)`` times half the bounds' width (it lies in one group), clipped per
subject by the node's ``clip_by_subject_norm``: the sensitivity is twice that, whatever the
number of groups. With Laplace the node bounds each group's change on its own, which grows
with the number of groups (for the sums; the counts are a partition, L1 2): prefer a
``delta`` for many groups.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from sdk._exceptions import DPNodeError

if TYPE_CHECKING:
    from sdk._handles import DatasetHandle
    from sdk._publish import Receipt

__all__ = ["GroupStatistics", "Grouped"]

#: more groups than this is a histogram of a continuous column, not a group-by
_MAX_GROUPS = 10_000


class GroupStatistics(dict[Any, float]):
    """One statistic per group (key -> value), with the publish's ``receipt``."""

    receipt: Receipt


class Grouped:
    """The rows of a dataset grouped by a public key; see the module docstring."""

    def __init__(self, ds: DatasetHandle, by: str, categories: Any = None) -> None:
        if by not in ds.columns:
            raise KeyError(f"no column {by!r}; the columns are {sorted(ds.columns)}")
        info = ds.columns[by]
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
                    "group by), at most 10,000"
                )
            keys = list(range(math.ceil(lo), math.floor(hi) + 1))
            codes = keys
        else:
            raise DPNodeError(
                f"column {by!r} is {info.dtype}: group by a categorical or integer column, or "
                "pass categories= (the values to group by)"
            )
        if not keys or len(keys) > _MAX_GROUPS:
            raise DPNodeError(f"groupby needs 1 to 10,000 groups, got {len(keys)}")
        self.ds, self.by, self.keys = ds, by, keys
        self._codes = torch.tensor(codes)

    def _members(self) -> torch.Tensor:
        """(rows, groups): 1.0 where the row's key is the group's."""
        key = self.ds[self.by]
        return (key.unsqueeze(-1) == self._codes.to(key.dtype)).to(torch.float64)

    def _bounds(self, column: str) -> tuple[float, float]:
        if column not in self.ds.columns:
            raise KeyError(f"no column {column!r}; the columns are {sorted(self.ds.columns)}")
        info = self.ds.columns[column]
        lo, hi = info.bounds
        if (
            info.shape
            or info.categories is not None
            or not (math.isfinite(lo) and math.isfinite(hi))
        ):
            raise DPNodeError(f"column {column!r} is not a numeric column with finite bounds")
        return float(lo), float(hi)

    def _publish(self, parts: list[torch.Tensor], epsilon: float, delta: float | None) -> Any:
        from sdk._publish import publish

        return publish(parts, epsilon=epsilon, delta=delta)

    def _result(self, values: torch.Tensor, receipt: Receipt) -> GroupStatistics:
        out = GroupStatistics(zip(self.keys, (float(v) for v in values), strict=True))
        out.receipt = receipt
        return out

    def count(self, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """Rows per group, noised (Laplace; Gaussian with ``delta``)."""
        (counts,) = self._publish([self._members().sum(0)], epsilon, delta)
        return self._result(counts, counts.receipt)

    def _sums_and_counts(
        self, column: str, epsilon: float, delta: float | None
    ) -> tuple[torch.Tensor, torch.Tensor, float, float, Receipt]:
        """Centred sums and scaled counts per group, noised together: ``(s, c, middle,
        scale, receipt)`` with ``c / scale`` the counts."""
        lo, hi = self._bounds(column)
        middle, scale = (lo + hi) / 2, max((hi - lo) / 2, 1e-12)
        members = self._members()
        value = self.ds[column].to(torch.float64)
        # each row's contribution: its centred value in its group's sum, and the scale
        # (half the bounds' width: the same size) in its group's count
        sums = (value - middle).unsqueeze(-1) * members
        counts = members * scale
        if delta is None:  # Laplace: the node bounds each group's change separately
            s, c = self._publish([sums.sum(0), counts.sum(0)], epsilon, delta)
            return s, c, middle, scale, s.receipt
        # Gaussian: a row's contribution is a vector of L2 norm at most scale * sqrt(2),
        # whatever the number of groups, and a subject's rows are summed before that bound
        # is applied (a no-op for one row per subject): the sum moves by twice it
        from sdk._per_sample import clipped_sum
        from sdk._publish import publish

        bound = scale * math.sqrt(2) * (1 + 1e-9)
        both = clipped_sum([sums, counts], max_norm=bound, groups=self.ds.subjects)
        released = publish(both, epsilon=epsilon, delta=delta)
        k = len(self.keys)
        return released[:k], released[k:], middle, scale, released.receipt

    def sum(self, column: str, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """The column's sum per group, noised."""
        s, c, middle, scale, receipt = self._sums_and_counts(column, epsilon, delta)
        return self._result(s + middle * c / scale, receipt)

    def mean(self, column: str, *, epsilon: float, delta: float | None = None) -> GroupStatistics:
        """The column's mean per group: noised sum over noised count, within the bounds."""
        lo, hi = self._bounds(column)
        s, c, middle, scale, receipt = self._sums_and_counts(column, epsilon, delta)
        n = c / scale
        mean = torch.where(n >= 1, middle + s / n.clamp(min=1), torch.full_like(n, middle))
        return self._result(mean.clamp(lo, hi), receipt)

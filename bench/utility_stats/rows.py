"""The bench's rows: each statistic's true value, dpnode's release, OpenDP's, and its error.

A statistic is a small frozen dataclass naming its columns; :data:`ROWS` lists the rows
(table, statistic) in the table's order. The error of one release is the mean absolute error
over its elements, except where a statistic says otherwise (top-k, correlation, describe).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any, ClassVar

import numpy as np

from bench.utility_stats import dpnode_side as ours
from bench.utility_stats import opendp_side as theirs
from bench.utility_stats.dpnode_side import Predicate, Release
from bench.utility_stats.opendp_side import OpenDPRelease
from bench.utility_stats.tables import Table

#: dpnode's regression is Gaussian at this delta (OpenDP's side is pure DP)
REGRESSION_DELTA = 1e-6
#: keys discovered above a threshold: both sides at this delta
KEYS_DELTA = 1e-6
#: a key with at least this many rows should be found
FREQUENT = 50


def integral(t: Table, column: str) -> bool:
    return t.columns[column].dtype.kind in "iu"


def mask(t: Table, predicate: Predicate) -> np.ndarray:
    """Which rows satisfy a filter, on the table's own values.

    >>> from bench.utility_stats.tables import census
    >>> int(mask(census(), ("education", "isin", ["doctorate"])).sum()) > 0
    True
    """
    column, op, value = predicate
    if op == "isin":
        names = t.keys(column)
        return np.isin(t.codes(column), [names.index(v) for v in value])
    compare = {">": np.greater, ">=": np.greater_equal, "<": np.less, "<=": np.less_equal}
    compare["=="] = np.equal
    return np.asarray(compare[op](t.columns[column], value))


def _show(predicate: Predicate) -> str:
    column, op, value = predicate
    shown = "{" + ", ".join(value) + "}" if op == "isin" else f"{value:g}"
    return f"{column} {'in' if op == 'isin' else op} {shown}"


class Statistic:
    """One statistic: its row name, its true value on a table, each side's release and the
    error of a release."""

    kind: ClassVar[str]
    delta: ClassVar[float | None] = None

    @property
    def name(self) -> str:
        raise NotImplementedError

    def truth(self, t: Table) -> np.ndarray:
        raise NotImplementedError

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        raise NotImplementedError

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        raise NotImplementedError

    def error(self, t: Table, value: np.ndarray, truth: np.ndarray) -> float:
        return float(np.mean(np.abs(np.asarray(value, dtype=float) - truth)))


@dataclass(frozen=True)
class CountAbove(Statistic):
    column: str
    threshold: float
    kind = "count"

    @property
    def name(self) -> str:
        return f"count ({self.column} > {self.threshold:g})"

    def truth(self, t: Table) -> np.ndarray:
        return np.array(float(np.sum(t.columns[self.column] > self.threshold)))

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        return ours.torch_release(ds, lambda d: (d[self.column] > self.threshold).sum(), epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        return theirs.indicator_sum(t.columns[self.column] > self.threshold, epsilon)


@dataclass(frozen=True)
class OneColumn(Statistic):
    """Sum, mean or variance of one column: ``column.sum()``, ``.mean()``, ``.var()``."""

    column: str
    statistic: str  # "sum", "mean" or "variance"
    kind = "one column"

    @property
    def name(self) -> str:
        return f"{self.statistic} ({self.column})"

    def truth(self, t: Table) -> np.ndarray:
        x = t.columns[self.column].astype(np.float64)
        values = {"sum": x.sum(), "mean": x.mean(), "variance": x.var(ddof=1)}
        return np.array(values[self.statistic])

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        method = {"sum": "sum", "mean": "mean", "variance": "var"}[self.statistic]
        return ours.torch_release(ds, lambda d: getattr(d[self.column].double(), method)(), epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        make = {
            "sum": theirs.bounded_sum,
            "mean": theirs.bounded_mean,
            "variance": theirs.bounded_variance,
        }[self.statistic]
        return make(t.columns[self.column], t.bounds[self.column], epsilon)


@dataclass(frozen=True)
class Histogram(Statistic):
    column: str
    bins: int
    kind = "histogram"

    @property
    def name(self) -> str:
        return f"histogram ({self.column}, {self.bins} bins)"

    def truth(self, t: Table) -> np.ndarray:
        lo, hi = t.bounds[self.column]
        return np.histogram(t.columns[self.column], self.bins, (lo, hi))[0].astype(float)

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        import torch

        lo, hi = t.bounds[self.column]
        return ours.torch_release(
            ds, lambda d: torch.histc(d[self.column], bins=self.bins, min=lo, max=hi), epsilon
        )

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        return theirs.histogram(t.columns[self.column], self.bins, t.bounds[self.column], epsilon)


QUANTILE_LABELS = {0.5: "median", 0.25: "25% quantile", 0.75: "75% quantile"}


@dataclass(frozen=True)
class Quantile(Statistic):
    """``torch.quantile(column, alpha)``: both sides select over dpnode's public candidates."""

    column: str
    alpha: float
    #: dpnode's side through the query builder (``agg(quantile(column, alpha))``) instead
    builder: bool = False
    kind = "quantile"

    @property
    def name(self) -> str:
        label = QUANTILE_LABELS.get(self.alpha, f"{self.alpha:g} quantile")
        return f"{label} ({self.column}{', query builder' if self.builder else ''})"

    def truth(self, t: Table) -> np.ndarray:
        return np.array(np.quantile(t.columns[self.column], self.alpha))

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        import torch

        from dpnode.sdk.query import quantile

        if self.builder:
            return ours.aggregate(ds, lambda: quantile(self.column, self.alpha), epsilon)
        # torch.quantile takes floats only: an integer column is cast
        return ours.torch_release(
            ds, lambda d: torch.quantile(d[self.column].double(), self.alpha), epsilon
        )

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        c = self.column
        return theirs.quantile(t.columns[c], t.bounds[c], integral(t, c), self.alpha, epsilon)


def _per_group(t: Table, key: str, column: str, f: Any) -> np.ndarray:
    codes, values = t.codes(key), t.columns[column].astype(np.float64)
    return np.array([f(values[codes == g]) for g in range(len(t.keys(key)))])


@dataclass(frozen=True)
class GroupMean(Statistic):
    """``ds.groupby(key).mean(column, epsilon=)``."""

    key: str
    column: str
    groups: int  # the key's number of public values, for the row's name
    kind = "group mean"

    @property
    def name(self) -> str:
        return f"mean {self.column} per {self.key} ({self.groups} groups)"

    def truth(self, t: Table) -> np.ndarray:
        return _per_group(t, self.key, self.column, np.mean)

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        return ours.group_means(ds, self.key, self.column, t.keys(self.key), epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        k = len(t.keys(self.key))
        b = t.bounds[self.column]
        return theirs.group_means(t.columns[self.column], t.codes(self.key), k, b, epsilon)


@dataclass(frozen=True)
class Regression(Statistic):
    """``sdk.linear_regression`` of the target on two features, all scaled into [0, 1] by
    their upper bounds; the error against least squares on the data."""

    features: tuple[str, str]
    target: str
    kind = "regression"
    delta = REGRESSION_DELTA

    @property
    def name(self) -> str:
        return "regression coefficients (2 + intercept, Gaussian)"

    def _scaled(self, t: Table) -> tuple[np.ndarray, np.ndarray]:
        x = np.c_[tuple(t.columns[c] / t.bounds[c][1] for c in self.features)]
        return x, t.columns[self.target] / t.bounds[self.target][1]

    def truth(self, t: Table) -> np.ndarray:
        x, y = self._scaled(t)
        return np.linalg.lstsq(np.c_[x, np.ones(len(y))], y, rcond=None)[0]

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        assert self.delta is not None
        return ours.regression(ds, self.features, self.target, t.bounds, epsilon, self.delta)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        return theirs.regression(*self._scaled(t), epsilon)


@dataclass(frozen=True)
class TwoKeyCounts(Statistic):
    """``group_by(a, b).agg(count())``: every pair of public keys."""

    a: str
    b: str
    kind = "two-key counts"

    @property
    def name(self) -> str:
        return f"count per {self.a} x {self.b}"

    def _codes(self, t: Table) -> tuple[np.ndarray, int]:
        kb = len(t.keys(self.b))
        return t.codes(self.a) * kb + t.codes(self.b), len(t.keys(self.a)) * kb

    def truth(self, t: Table) -> np.ndarray:
        codes, cells = self._codes(t)
        return np.bincount(codes, minlength=cells).astype(float)

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        from dpnode.sdk.query import count

        keys = list(product(t.keys(self.a), t.keys(self.b)))
        return ours.grouped(ds, (self.a, self.b), lambda: [count()], ["count"], keys, epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        codes, cells = self._codes(t)
        return theirs.category_counts(codes, cells, epsilon)


@dataclass(frozen=True)
class FilteredMean(Statistic):
    """``query().filter(...).agg(mean(column))``; OpenDP: the mean of a group of one (the rows
    that pass the filter; its size is private)."""

    predicate: Predicate
    column: str
    kind = "filtered mean"

    @property
    def name(self) -> str:
        return f"mean {self.column} where {_show(self.predicate)}"

    def truth(self, t: Table) -> np.ndarray:
        return np.array(t.columns[self.column][mask(t, self.predicate)].mean())

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        from dpnode.sdk.query import mean

        return ours.aggregate(ds, lambda: mean(self.column), epsilon, where=self.predicate)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        inside = mask(t, self.predicate).astype(np.int64)
        release = theirs.group_means(
            t.columns[self.column], 1 - inside, 2, t.bounds[self.column], epsilon
        )
        return OpenDPRelease(release.measurement, release.prepare, lambda s: release.post(s)[0])


@dataclass(frozen=True)
class Share(Statistic):
    """The share of rows passing a filter: its noised count over the public row count."""

    predicate: Predicate
    kind = "share"

    @property
    def name(self) -> str:
        return f"share where {_show(self.predicate)}"

    def truth(self, t: Table) -> np.ndarray:
        return np.array(mask(t, self.predicate).mean())

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        return ours.share(ds, self.predicate, epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        n = t.rows
        release = theirs.indicator_sum(mask(t, self.predicate), epsilon)
        return OpenDPRelease(release.measurement, release.prepare, lambda c: np.asarray(c) / n)


@dataclass(frozen=True)
class CountDistinct(Statistic):
    column: str
    kind = "count distinct"

    @property
    def name(self) -> str:
        return f"count distinct ({self.column})"

    def truth(self, t: Table) -> np.ndarray:
        return np.array(float(len(np.unique(t.columns[self.column]))))

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        from dpnode.sdk.query import count_distinct

        return ours.aggregate(ds, lambda: count_distinct(self.column), epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        # whole numbers in both tables (diabetes' ages are whole years held as floats)
        return theirs.count_distinct(np.rint(t.columns[self.column]), epsilon)


@dataclass(frozen=True)
class TopK(Statistic):
    """``group_by(key).top_k(k)``. The truth is every group's count; a release's error is, rank
    by rank, how far the true count of the group it names is from the true k-th-largest
    count at that rank (0 when it names the true top k in order), averaged over the ranks."""

    key: str
    k: int
    kind = "top-k"

    @property
    def name(self) -> str:
        return f"top {self.k} {self.key} (rank-by-rank count error)"

    def truth(self, t: Table) -> np.ndarray:
        return np.bincount(t.codes(self.key), minlength=len(t.keys(self.key))).astype(float)

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        return ours.top_k(ds, self.key, self.k, t.keys(self.key), epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        return theirs.top_k(t.codes(self.key), len(t.keys(self.key)), self.k, epsilon)

    def error(self, t: Table, value: np.ndarray, truth: np.ndarray) -> float:
        picked = np.asarray(value, dtype=np.int64)
        if picked.shape != (self.k,):
            raise ValueError(f"top {self.k} gave {picked.shape[0]} groups")
        return float(np.mean(np.abs(np.sort(truth)[::-1][: self.k] - truth[picked])))


@dataclass(frozen=True)
class GroupVariance(Statistic):
    """``group_by(key).agg(var(column))`` (sample variance)."""

    key: str
    column: str
    kind = "group variance"

    @property
    def name(self) -> str:
        return f"variance {self.column} per {self.key}"

    def truth(self, t: Table) -> np.ndarray:
        return _per_group(t, self.key, self.column, lambda v: v.var(ddof=1))

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        from dpnode.sdk.query import var

        keys = [(k,) for k in t.keys(self.key)]
        names = [f"{self.column}_var"]
        return ours.grouped(ds, (self.key,), lambda: [var(self.column)], names, keys, epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        k = len(t.keys(self.key))
        b = t.bounds[self.column]
        return theirs.group_variances(t.columns[self.column], t.codes(self.key), k, b, epsilon)


@dataclass(frozen=True)
class GroupMinMax(Statistic):
    """``group_by(key).agg(min(column), max(column))``: ``[minima, maxima]``."""

    key: str
    column: str
    kind = "group min/max"

    @property
    def name(self) -> str:
        return f"min and max {self.column} per {self.key}"

    def truth(self, t: Table) -> np.ndarray:
        return np.r_[
            _per_group(t, self.key, self.column, np.min),
            _per_group(t, self.key, self.column, np.max),
        ]

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        from dpnode.sdk.query import max as max_
        from dpnode.sdk.query import min as min_

        c = self.column
        keys = [(k,) for k in t.keys(self.key)]
        return ours.grouped(
            ds, (self.key,), lambda: [min_(c), max_(c)], [f"{c}_min", f"{c}_max"], keys, epsilon
        )

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        c, k = self.column, len(t.keys(self.key))
        return theirs.group_extremes(
            t.columns[c], t.codes(self.key), k, t.bounds[c], integral(t, c), epsilon
        )


@dataclass(frozen=True)
class Covariance(Statistic):
    """``torch.cov`` of the columns stacked as rows; the error over the upper triangle."""

    columns: tuple[str, ...]
    kind = "covariance"
    #: the upper triangle's offset: 0 with the diagonal (variances), 1 without it
    offset: ClassVar[int] = 0

    @property
    def name(self) -> str:
        return f"{self.kind} ({', '.join(self.columns)})"

    def _data(self, t: Table) -> tuple[list[np.ndarray], list[tuple[float, float]]]:
        return [t.columns[c] for c in self.columns], [t.bounds[c] for c in self.columns]

    def truth(self, t: Table) -> np.ndarray:
        return np.cov(np.stack(self._data(t)[0]).astype(np.float64))

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        import torch

        return ours.torch_release(ds, lambda d: torch.cov(ours.stacked(d, self.columns)), epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        return theirs.covariance(*self._data(t), epsilon)

    def error(self, t: Table, value: np.ndarray, truth: np.ndarray) -> float:
        upper = np.triu_indices(len(self.columns), self.offset)
        return float(np.mean(np.abs(np.asarray(value, dtype=float)[upper] - truth[upper])))


@dataclass(frozen=True)
class Correlation(Covariance):
    """``torch.corrcoef``; the error over the correlations off the diagonal."""

    kind = "correlation"
    offset = 1

    def truth(self, t: Table) -> np.ndarray:
        return np.corrcoef(np.stack(self._data(t)[0]).astype(np.float64))

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        import torch

        return ours.torch_release(
            ds, lambda d: torch.corrcoef(ours.stacked(d, self.columns)), epsilon
        )

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        return theirs.correlation(*self._data(t), epsilon)


@dataclass(frozen=True)
class Describe(Statistic):
    """``ds.describe(epsilon=)`` over every numeric column: mean, std, min, quartiles, max
    (the count is public). A release's error is each entry's over its column's public width,
    averaged: a fraction of the range."""

    kind = "describe"

    @property
    def name(self) -> str:
        return "describe (error / column width)"

    def truth(self, t: Table) -> np.ndarray:
        x = np.stack([t.columns[c].astype(np.float64) for c in t.numeric()], axis=1)
        quartiles = np.quantile(x, [0.0, 0.25, 0.5, 0.75, 1.0], axis=0)
        return np.vstack([x.mean(axis=0), x.std(axis=0, ddof=1), quartiles])

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        return ours.describe(ds, t.numeric(), epsilon)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        columns = t.numeric()
        return theirs.describe(
            [t.columns[c] for c in columns],
            [t.bounds[c] for c in columns],
            [integral(t, c) for c in columns],
            epsilon,
        )

    def error(self, t: Table, value: np.ndarray, truth: np.ndarray) -> float:
        widths = np.array([t.bounds[c][1] - t.bounds[c][0] for c in t.numeric()], dtype=float)
        return float(np.mean(np.abs(np.asarray(value, dtype=float) - truth) / widths))


@dataclass(frozen=True)
class Row:
    table: str
    statistic: Statistic

    @property
    def label(self) -> str:
        return f"{self.table}: {self.statistic.name}"


@dataclass(frozen=True)
class DiscoveredKeys(Statistic):
    """The keys of a column without public keys, released above a noisy threshold with their
    noisy counts (``discover_keys``; OpenDP's ``count_by`` + Laplace threshold), at
    :data:`KEYS_DELTA`. ``measure``: ``"error"``, the mean absolute error of the released
    counts (over the keys released); ``"missed"``, the share of the keys with at least
    :data:`FREQUENT` rows not released (1 - recall); ``"unreleased"``, how many of the keys
    present were not released (lower is better, as for every row: the table's keys less
    the number kept)."""

    column: str
    measure: str
    kind = "discovered keys"
    delta = KEYS_DELTA

    @property
    def name(self) -> str:
        what = {
            "error": "count error on kept keys",
            "missed": f"share of keys of >= {FREQUENT} rows missed",
            "unreleased": "keys present not released",
        }[self.measure]
        return f"keys of {self.column} above a threshold: {what}"

    def truth(self, t: Table) -> np.ndarray:
        keys, counts = np.unique(t.columns[self.column], return_counts=True)
        return np.stack([keys.astype(np.float64), counts.astype(np.float64)], axis=1)

    def ours(self, ds: Any, t: Table, epsilon: float) -> Release:
        return ours.discovered_keys(ds, self.column, epsilon, KEYS_DELTA)

    def theirs(self, t: Table, epsilon: float) -> OpenDPRelease:
        return theirs.keys_above_threshold(t.columns[self.column], epsilon, KEYS_DELTA)

    def error(self, t: Table, value: np.ndarray, truth: np.ndarray) -> float:
        released = np.asarray(value, dtype=np.float64).reshape(-1, 2)
        true = dict(zip(truth[:, 0].tolist(), truth[:, 1].tolist(), strict=True))
        if self.measure == "unreleased":
            return float(len(true) - len(released))
        if self.measure == "missed":
            frequent = {k for k, c in true.items() if c >= FREQUENT}
            found = set(released[:, 0].tolist())
            return len(frequent - found) / max(len(frequent), 1)
        if not len(released):
            return 0.0
        return float(np.mean([abs(c - true[k]) for k, c in released.tolist()]))


def _rows(table: str, statistics: Sequence[Statistic]) -> list[Row]:
    return [Row(table, s) for s in statistics]


HIGHER_EDUCATION = ("bachelors", "masters", "doctorate")
ROWS = [
    *_rows(
        "diabetes",
        [
            CountAbove("age", 50),
            OneColumn("bmi", "sum"),
            OneColumn("bmi", "mean"),
            OneColumn("bmi", "variance"),
            Histogram("age", 10),
            *(Quantile(c, a) for c in ("age", "bmi") for a in (0.5, 0.25, 0.75)),
            GroupMean("sex", "bmi", 2),
            GroupMean("age_group", "bmi", 10),
            Regression(("age", "bmi"), "target"),
            TwoKeyCounts("sex", "age_group"),
            FilteredMean(("age", ">", 50), "bmi"),
            Share(("bmi", ">", 30)),
            CountDistinct("age"),
            TopK("age_group", 5),
            GroupVariance("sex", "bmi"),
            GroupMinMax("sex", "bmi"),
            Covariance(("age", "bmi", "target")),
            Correlation(("age", "bmi", "target")),
            Describe(),
        ],
    ),
    *_rows(
        "census",
        [
            OneColumn("income", "mean"),
            Quantile("income", 0.5),
            Quantile("hours", 0.5),
            Quantile("hours", 0.5, builder=True),
            TwoKeyCounts("education", "sex"),
            FilteredMean(("age", ">", 30), "income"),
            Share(("education", "isin", HIGHER_EDUCATION)),
            CountDistinct("hours"),
            TopK("occupation", 5),
            GroupVariance("education", "income"),
            GroupMinMax("sex", "income"),
            Covariance(("age", "hours", "income")),
            Correlation(("age", "hours", "income")),
            Describe(),
            *(DiscoveredKeys("zip", m) for m in ("error", "missed", "unreleased")),
        ],
    ),
    *_rows(
        "chemistry",
        [
            OneColumn("alcohol", "mean"),
            OneColumn("proline", "variance"),
            Quantile("proline", 0.5),
            GroupMean("cultivar", "alcohol", 3),
            FilteredMean(("alcohol", ">", 13), "flavanoids"),
            GroupVariance("cultivar", "proline"),
            GroupMinMax("cultivar", "alcohol"),
            Covariance(("alcohol", "flavanoids", "proline")),
            Correlation(("alcohol", "malic_acid", "flavanoids", "color_intensity", "proline")),
            Describe(),
        ],
    ),
]

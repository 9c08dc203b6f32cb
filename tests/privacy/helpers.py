"""Helpers of the privacy tests: neighbouring datasets and the soundness check."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.engine import Graph, plan, run
from dpnode.core.privacy import InputSpec, PrivacyReport

Array = npt.NDArray[Any]

MODES = ("low", "high", "corners", "uniform")


@dataclass(frozen=True)
class Column:
    """A private test input: dtype, shape, bounds, and subject per row."""

    dtype: str
    shape: tuple[int, ...]
    lower: Any
    upper: Any
    subjects: Array | None = None

    def spec(self) -> InputSpec:
        return InputSpec.private(self.lower, self.upper, self.subjects)

    def draw(self, rng: np.random.Generator, mode: str) -> Array:
        lo = np.broadcast_to(np.asarray(self.lower, dtype=np.float64), self.shape[1:])
        hi = np.broadcast_to(np.asarray(self.upper, dtype=np.float64), self.shape[1:])
        lo = np.broadcast_to(lo, self.shape)
        hi = np.broadcast_to(hi, self.shape)
        if mode == "low":
            v = lo.copy()
        elif mode == "high":
            v = hi.copy()
        elif mode == "corners":
            v = np.where(rng.random(self.shape) < 0.5, lo, hi)
        else:  # lo + (hi - lo) r overflows for bounds near the largest float
            r = rng.random(self.shape)
            v = np.clip(lo * (1 - r) + hi * r, lo, hi)
        if self.dtype in ("int64", "int32", "bool"):
            v = np.clip(np.round(v), np.ceil(lo), np.floor(hi))
        return v.astype(self.dtype)

    def rows_of(self, subject: int) -> Array:
        subj = np.arange(self.shape[0]) if self.subjects is None else self.subjects
        return np.flatnonzero(subj == subject)


def neighbours(
    cols: Mapping[str, Column], rng: np.random.Generator
) -> tuple[dict[str, Array], dict[str, Array]]:
    """Two datasets that differ only in one subject's rows (replaced adversarially)."""
    first = next(iter(cols.values()))
    subj = np.arange(first.shape[0]) if first.subjects is None else first.subjects
    s = int(rng.choice(np.unique(subj)))
    d1: dict[str, Array] = {}
    d2: dict[str, Array] = {}
    for name, col in cols.items():
        a = col.draw(rng, str(rng.choice(MODES)))
        b = a.copy()
        other = col.draw(rng, str(rng.choice(MODES)))
        rows = col.rows_of(s)
        b[rows] = other[rows]
        d1[name], d2[name] = a, b
    return d1, d2


def assert_sound(
    graph: Graph,
    report: PrivacyReport,
    d1: Mapping[str, Array],
    d2: Mapping[str, Array],
    public: Mapping[str, Array] | None = None,
) -> None:
    """|f(D) - f(D')| within the tracked L1/L2 sensitivity, and values within bounds."""
    inputs1 = {**d1, **(public or {})}
    inputs2 = {**d2, **(public or {})}
    p = plan(graph, accurate=True)  # as a publish evaluates
    out1 = run(p, inputs1).outputs
    out2 = run(p, inputs2).outputs
    for k, (a, b, o) in enumerate(zip(out1, out2, report.outputs, strict=True)):
        fa, fb = a.astype(np.float64), b.astype(np.float64)
        assert np.all(np.isfinite(fa)) and np.all(np.isfinite(fb)), f"output {k} not finite"
        assert np.all(fa >= o.lower) and np.all(fa <= o.upper), f"output {k} bounds"
        diff = np.abs(fa - fb)
        # no tolerance: the tracked bounds cover the engine's rounding; the norms of the
        # difference are computed accurately (correctly rounded sums) for an exact check
        l1 = math.fsum(diff.ravel().tolist())
        assert l1 <= o.l1, f"output {k}: L1 {l1!r} > {o.l1!r}"
        l2 = _upper_l2(diff)
        assert l2 <= o.l2, f"output {k}: L2 {l2!r} > {o.l2!r}"


def _upper_l2(diff: Array) -> float:
    """The L2 norm, accurately (no overflow, under an ulp of error)."""
    return math.hypot(*diff.ravel().tolist())

"""Alias tables reproduce their fixed-point weights exactly; the weights are the ideal pmf."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.dp.tables import (
    AliasTable,
    build_alias_table,
    discrete_gaussian_table,
    laplace_top_table,
    truncated_geometric_table,
)

ONE = 1 << 128


def implied_weights(table: AliasTable) -> list[int]:
    """Each outcome's exact probability (units of 2^-128) under the sampling rule."""
    bins = 1 << table.bits
    capacity = ONE >> table.bits
    weights = [0] * bins
    for b in range(bins):
        threshold = (int(table.th[b]) << 64) + int(table.tl[b])
        alias = int(table.alias[b])
        if alias == b:
            weights[b] += capacity
        else:
            weights[b] += threshold
            weights[alias] += capacity - threshold
    return weights


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1 << 64), min_size=1, max_size=70))
def test_alias_table_is_exact(raw: list[int]) -> None:
    if sum(raw) == 0:
        raw = [*raw[:-1], 1]
    total = sum(raw)
    weights = [w * ONE // total for w in raw]
    weights[0] += ONE - sum(weights)
    table = build_alias_table(weights, offset=-3, tv_bound=0.0)
    implied = implied_weights(table)
    assert implied[: len(weights)] == weights
    assert sum(implied[len(weights) :]) == 0  # padding bins never yield padding outcomes


def test_alias_table_refuses_bad_weights() -> None:
    with pytest.raises(ValueError, match="sum to 2"):
        build_alias_table([1, 2], offset=0, tv_bound=0.0)


def _pmf(table: AliasTable) -> tuple[np.ndarray, np.ndarray]:
    w = implied_weights(table)[: table.size]
    support = np.arange(table.size) + table.offset
    return support, np.array([x / ONE for x in w])


@pytest.mark.parametrize("t", [0.3, 5.0, 77.7])
def test_laplace_top_table_is_the_discrete_laplace(t: float) -> None:
    # With no digits (shift 0) the top table is the whole discrete Laplace: v is Z itself.
    table = laplace_top_table(Decimal(t), 0)
    z, pmf = _pmf(table)
    p = math.exp(-1 / t)
    ideal = (1 - p) / (1 + p) * p ** np.abs(z)
    assert np.abs(pmf - ideal).sum() < 1e-14
    assert 0 < table.tv_bound < 2.0**-110
    assert pmf[z == 0][0] == pytest.approx((1 - p) / (1 + p), rel=1e-15)


@pytest.mark.parametrize("s", [0.5, 3.0, 250.0])
def test_gaussian_table_is_the_discrete_gaussian(s: float) -> None:
    table = discrete_gaussian_table(Decimal(s) ** 2)
    z, pmf = _pmf(table)
    wide = np.arange(-int(20 * s) - 5, int(20 * s) + 6)
    norm = np.exp(-(wide.astype(float) ** 2) / (2 * s * s)).sum()
    ideal = np.exp(-(z.astype(float) ** 2) / (2 * s * s)) / norm
    assert np.abs(pmf - ideal).sum() < 1e-14
    assert np.array_equal(pmf, pmf[::-1])  # symmetric to the last unit
    assert 0 < table.tv_bound < 2.0**-110


def test_truncated_geometric_table() -> None:
    ratio = Decimal("0.9")
    table = truncated_geometric_table(ratio, 6)
    r, pmf = _pmf(table)
    ideal = 0.9**r / sum(0.9**i for i in range(64))
    assert np.abs(pmf - ideal).sum() < 1e-14
    assert table.size == 64 and table.offset == 0

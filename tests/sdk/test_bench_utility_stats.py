"""The statistics benchmark runs both sides on the same data and prints every row.

No ratio is asserted (that is the benchmark's to print); what is checked is that each
statistic is released by OpenDP, and by dpnode where it has the row, with errors of the size
the noise at epsilon 1 gives, so a broken query (a wrong column, a refused publish) shows;
and that each OpenDP release is a measurement whose privacy loss for a replaced row is the
row's epsilon, with values in the statistic's range.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.utility_stats import (
    BMI,
    GRID,
    REGRESSION,
    REPLACE_ONE,
    OpenDPRelease,
    load,
    opendp_releases,
    quantile_rows,
)

REPO = Path(__file__).resolve().parents[2]
QUANTILE_ROWS = [name for name, *_ in quantile_rows()]
GROUP_ROWS = [
    "mean BMI per sex (2 groups)",
    "mean BMI per age_group (10 groups)",
]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_utility_stats_bench_releases_every_row_on_both_sides() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.utility_stats", "--repeat", "8"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    names = [_cells(r)[0] for r in rows[1:]]
    assert names == [
        "count (age > 50)",
        "sum (BMI)",
        "mean (BMI)",
        "variance (BMI)",
        "histogram (age, 10 bins)",
        "median (age)",
        "25% quantile (age)",
        "75% quantile (age)",
        "median (BMI)",
        "25% quantile (BMI)",
        "75% quantile (BMI)",
        *GROUP_ROWS,
        REGRESSION,
    ], out
    table = {cells[0]: cells[1:] for cells in map(_cells, rows[1:])}
    for i, (name, (ours, theirs, ratio)) in enumerate(table.items()):
        # past the first five rows, an error is within a column's bounds' width (at most 120)
        limit = 1000 if i < 5 else 120
        assert 0 < float(theirs) < limit, (name, theirs)
        value, _, error = ratio.partition(" ± ")
        assert 0 < float(ours) < limit and math.isfinite(float(value)), (name, ours, ratio)
        assert float(error) >= 0, (name, ratio)
    # the count's noise has scale 1 on both sides: an error far from 1 is a wrong query
    count = table["count (age > 50)"]
    assert 0.2 < float(count[0]) < 3 and 0.2 < float(count[1]) < 3, count


@pytest.fixture(scope="module")
def releases() -> dict[str, OpenDPRelease]:
    return opendp_releases(load(), epsilon=1.0)


@pytest.mark.parametrize("name", [*QUANTILE_ROWS, *GROUP_ROWS, REGRESSION])
def test_opendp_release_loses_the_rows_epsilon_for_a_replaced_row(
    releases: dict[str, OpenDPRelease], name: str
) -> None:
    measurement = releases[name].measurement
    # pure DP: its epsilon is the row's (and it is then (epsilon, delta)-DP for any delta)
    assert measurement.map(REPLACE_ONE) == pytest.approx(1.0, rel=1e-6)
    assert measurement.map(REPLACE_ONE) <= 1.0


@pytest.mark.parametrize(("name", "column", "bounds", "alpha"), quantile_rows())
def test_opendp_quantile_is_a_grid_point_within_the_bounds(
    releases: dict[str, OpenDPRelease],
    name: str,
    column: str,
    bounds: tuple[float, float],
    alpha: float,
) -> None:
    grid = np.linspace(*bounds, GRID)
    values = [float(releases[name]()) for _ in range(20)]
    assert all(np.isclose(grid, v).any() for v in values), values
    truth = np.quantile(load()[column], alpha)
    # at epsilon 1, 442 rows, the noisy max lands within a few ranks: a few units of the data
    assert abs(np.median(values) - truth) < 5, (values, truth)


@pytest.mark.parametrize(("name", "groups"), list(zip(GROUP_ROWS, (2, 10), strict=True)))
def test_opendp_group_means_are_within_the_bmi_bounds(
    releases: dict[str, OpenDPRelease], name: str, groups: int
) -> None:
    means = releases[name]()
    assert means.shape == (groups,)
    assert np.all((means >= BMI[0]) & (means <= BMI[1])), means


def test_opendp_regression_gives_two_coefficients_and_an_intercept(
    releases: dict[str, OpenDPRelease],
) -> None:
    coefs = [releases[REGRESSION]() for _ in range(9)]
    assert all(c.shape == (3,) and np.all(np.isfinite(c)) for c in coefs), coefs
    # the features and the target are scaled into [0, 1]: at the features' centre the
    # prediction is about the mean target (noised by a few units over 442 rows). One release
    # falls outside [0, 1] about once in 400 (a noised Gram matrix near singular: over 5000,
    # from -0.92 to 1.37): the median of nine does not.
    centre = [c[0] / 2 + c[1] / 2 + c[2] for c in coefs]
    assert 0 <= float(np.median(centre)) <= 1, coefs

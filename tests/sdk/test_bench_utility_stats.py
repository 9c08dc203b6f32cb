"""The statistics benchmark runs both sides on the same tables and prints every row.

No ratio is asserted (that is the benchmark's to print); what is checked is that a run of one
row of each kind prints every row, released by OpenDP and answered or refused by dpnode by
name (never a crash), with errors of the size the noise at epsilon 1 gives, so a broken
query shows; that each OpenDP release is a measurement whose privacy loss for a replaced row
is the row's epsilon, with values in the statistic's range; and that the generated tables
hold what their docstring promises.
"""

from __future__ import annotations

import doctest
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from bench.utility_stats import dpnode_side, opendp_side, report, rows, tables
from bench.utility_stats.opendp_side import REPLACE_ONE, OpenDPRelease
from bench.utility_stats.rows import ROWS, Row
from bench.utility_stats.tables import TABLES
from dpnode.core.dp.selection import candidates

REPO = Path(__file__).resolve().parents[2]
#: the last row of each kind (on a generated table where the kind has one)
ONE_OF_EACH = list({r.statistic.kind: r for r in ROWS}.values())
#: what the smoke run releases: the existing kinds on diabetes, each new kind on a table that
#: keeps the run short, and one row of the generated census
SMOKE = [
    "diabetes: count (age",
    "diabetes: sum (bmi)",
    "diabetes: histogram",
    "diabetes: median (bmi)",
    "diabetes: mean bmi per sex",
    "diabetes: regression",
    "diabetes: count per sex x age_group",
    "chemistry: mean flavanoids where",
    "diabetes: share",
    "census: count distinct",
    "census: top 5 occupation",
    "chemistry: variance proline per",
    "chemistry: min and max",
    "chemistry: covariance",
    "diabetes: correlation",
    "chemistry: describe",
    "census: keys of zip above a threshold: share",
]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_smoke_run_releases_one_row_of_each_kind_on_both_sides() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.utility_stats", "--repeat", "3", "--rows", *SMOKE],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    lines = [x for x in out.splitlines() if x.startswith("| ") and "---" not in x]
    table = {f"{c[0]}: {c[1]}": c[2:] for c in map(_cells, lines[1:])}
    chosen = [r for r in ROWS if any(p in r.label for p in SMOKE)]
    assert list(table) == [r.label for r in chosen], out
    assert {r.statistic.kind for r in chosen} == {r.statistic.kind for r in ROWS}
    for row in chosen:
        ours, theirs, ratio, ours_ms, theirs_ms, _, verdict = table[row.label]
        assert math.isfinite(float(theirs)) and float(theirs_ms) > 0, (row.label, theirs)
        # dpnode answers, or refuses by name: never a failure of the bench's own code
        assert not ours.startswith("failed"), (row.label, ours)
        if ours.startswith("refused"):
            assert verdict == "**refused**", (row.label, verdict)
            continue
        assert float(ours_ms) > 0, (row.label, ours_ms)
        value, _, error = ratio.partition(" ± ")
        assert float(value) >= 0 and float(error) >= 0, (row.label, ratio)
        # a wrong query (another column, groups out of order) is off by the statistic's own
        # size, far beyond the noise at epsilon 1 on either side (describe's error is
        # already a fraction of the columns' widths)
        truth = row.statistic.truth(TABLES[row.table]())
        size = 1.0 if row.statistic.kind == "describe" else float(np.mean(np.abs(truth)))
        assert float(ours) <= 10 * float(theirs) + 0.1 * size, (row.label, ours, theirs)
    # the count's noise has scale 1 on both sides: an error far from 1 is a wrong query
    count = table["diabetes: count (age > 50)"]
    assert 0.1 < float(count[0]) < 4 and 0.1 < float(count[1]) < 4, count


def _release(row: Row) -> OpenDPRelease:
    return row.statistic.theirs(TABLES[row.table](), epsilon=1.0)


@pytest.mark.parametrize("row", ONE_OF_EACH, ids=lambda r: r.label)
def test_opendp_release_loses_the_rows_epsilon_for_a_replaced_row(row: Row) -> None:
    release = _release(row)
    value = release()
    truth = row.statistic.truth(TABLES[row.table]())
    if row.statistic.kind == "discovered keys":  # (epsilon, delta): the row's delta
        epsilon, delta = release.measurement.map(REPLACE_ONE)
        assert epsilon == pytest.approx(1.0, rel=1e-6) and epsilon <= 1.0
        assert 0 < delta <= rows.KEYS_DELTA
        # (key, noisy count) rows, keys the table holds, sorted
        assert value.ndim == 2 and value.shape[1] == 2 and 0 < len(value) < len(truth)
        assert set(value[:, 0].tolist()) <= set(truth[:, 0].tolist())
        assert value[:, 0].tolist() == sorted(value[:, 0].tolist())
        return
    # pure DP: its epsilon is the row's (and it is then (epsilon, delta)-DP for any delta)
    assert release.measurement.map(REPLACE_ONE) == pytest.approx(1.0, rel=1e-6)
    assert release.measurement.map(REPLACE_ONE) <= 1.0
    assert np.all(np.isfinite(value)) and np.shape(value) == (
        (5,) if row.statistic.kind == "top-k" else np.shape(truth)
    ), (value, truth)


@pytest.mark.parametrize("row", [r for r in ROWS if r.statistic.kind == "quantile"][:3])
def test_opendp_quantile_is_a_public_candidate_near_the_truth(row: Row) -> None:
    stat = row.statistic
    assert isinstance(stat, rows.Quantile)
    table = TABLES[row.table]()
    lo, hi = table.bounds[stat.column]
    grid = candidates(lo, hi, rows.integral(table, stat.column))
    values = [float(_release(row)()) for _ in range(20)]
    assert all(np.isclose(grid, v).any() for v in values), values
    # at epsilon 1, 442 rows, the noisy max lands within a few ranks: a few units of the data
    assert abs(np.median(values) - stat.truth(table)) < 5, values


def test_opendp_group_statistics_stay_in_their_ranges() -> None:
    chemistry = TABLES["chemistry"]()
    lo, hi = chemistry.bounds["alcohol"]
    for _ in range(5):
        means = _release(Row("chemistry", rows.GroupMean("cultivar", "alcohol", 3)))()
        extremes = _release(Row("chemistry", rows.GroupMinMax("cultivar", "alcohol")))()
        assert means.shape == (3,) and np.all((means >= lo) & (means <= hi)), means
        assert extremes.shape == (6,) and np.all((extremes >= lo) & (extremes <= hi)), extremes
        variances = _release(Row("chemistry", rows.GroupVariance("cultivar", "proline")))()
        assert np.all((variances >= 0) & (variances <= 800.0**2)), variances
        r = _release(Row("chemistry", rows.Correlation(("alcohol", "proline"))))()
        assert np.all(np.abs(r) <= 1) and np.allclose(np.diag(r), 1), r


def test_opendp_top_k_names_distinct_groups_and_finds_the_census_leaders() -> None:
    row = Row("census", rows.TopK("occupation", 5))
    census = TABLES["census"]()
    truth = row.statistic.truth(census)
    picks = [_release(row)() for _ in range(5)]
    assert all(len(set(p.tolist())) == 5 for p in picks), picks
    # the 5th and 6th commonest occupations are ~200 apart: noise of scale 2 never swaps them
    assert all(row.statistic.error(census, p, truth) < 20 for p in picks), picks


def test_opendp_regression_gives_two_coefficients_and_an_intercept() -> None:
    row = next(r for r in ROWS if r.statistic.kind == "regression")
    coefs = [_release(row)() for _ in range(9)]
    assert all(c.shape == (3,) and np.all(np.isfinite(c)) for c in coefs), coefs
    # the features and the target are scaled into [0, 1]: at the features' centre the
    # prediction is about the mean target (noised by a few units over 442 rows)
    centre = [c[0] / 2 + c[1] / 2 + c[2] for c in coefs]
    assert 0 <= float(np.median(centre)) <= 1, coefs


@pytest.mark.parametrize("name", list(TABLES))
def test_tables_hold_their_declared_bounds_and_categories(name: str) -> None:
    table = TABLES[name]()
    for column, values in table.columns.items():
        if column in table.categories:
            assert set(np.unique(values)) <= set(range(len(table.categories[column]))), column
        else:
            lo, hi = table.bounds[column]
            assert lo <= values.min() and values.max() <= hi, column
    assert table.rows == {"diabetes": 442, "census": 20_000, "chemistry": 178}[name]


def test_generated_tables_have_their_documented_shape() -> None:
    census, chemistry = TABLES["census"](), TABLES["chemistry"]()
    income, education = census.columns["income"], census.columns["education"]
    medians = [np.median(income[education == e]) for e in range(len(tables.EDUCATION))]
    assert medians == sorted(medians), medians  # income grows with education
    occupations = np.bincount(census.columns["occupation"])
    assert occupations.max() > 10 * np.median(occupations[-5:])  # skewed
    assert np.corrcoef(census.columns["age"], income)[0, 1] > 0.1
    assert np.bincount(chemistry.columns["cultivar"]).tolist() == tables.CULTIVAR_SIZES
    alcohol, proline = chemistry.columns["alcohol"], chemistry.columns["proline"]
    assert np.corrcoef(alcohol, proline)[0, 1] > 0.4


@pytest.mark.parametrize("module", [dpnode_side, opendp_side, report, rows, tables])
def test_bench_doctests(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 or module is opendp_side
    assert result.failed == 0


def test_report_marks_a_row_behind_on_error_and_time() -> None:
    slow, fast = [0.030] * 4, [0.010] * 4
    line = report.line("t", "x", report.Side([2.0] * 4, slow), report.Side([1.0] * 4, fast))
    assert _cells(line)[-1] == "**behind: error, time**"
    r, two_se = report.ratio([1.0, 1.2, 0.8], [1.0, 1.0, 1.0])
    assert r == pytest.approx(1.0) and math.isclose(two_se, 2 * 0.2 / math.sqrt(3))

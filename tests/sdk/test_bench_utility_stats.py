"""The statistics benchmark runs both sides on the same data and prints every row.

No ratio is asserted (that is the benchmark's to print); what is checked is that each
statistic is released by both dpnode and OpenDP with errors of the size Laplace noise at
epsilon 1 gives, so a broken query (a wrong column, a refused publish) shows.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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
    names = [r.split("|")[1].strip() for r in rows[1:]]
    assert names == [
        "count (age > 50)",
        "sum (BMI)",
        "mean (BMI)",
        "variance (BMI)",
        "histogram (age, 10 bins)",
        "mean BMI per sex (2 groups, Gaussian)",
        "mean BMI per age_group (10 groups, Gaussian)",
        "regression coefficients (2 + intercept, Gaussian)",
    ], out
    for line in rows[1:6]:
        ours, theirs, ratio = (float(c) for c in line.strip().strip("|").split("|")[1:])
        assert 0 < ours < 1000 and 0 < theirs < 1000 and math.isfinite(ratio), line
    for line in rows[6:]:  # dpnode only: a mean's error is within the bounds' width, 60
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert 0 < float(cells[1]) < 60 and cells[2:] == ["-", "-"], line
    # the count's noise has scale 1 on both sides: an error far from 1 is a wrong query
    count = rows[1].strip().strip("|").split("|")
    assert 0.2 < float(count[1]) < 3 and 0.2 < float(count[2]) < 3, rows[1]

"""The private-training benchmark runs both sides and keeps within the target epsilon.

No time or accuracy ratio is asserted (those are the benchmark's to print); what is checked
is that the run completes, that the epsilon the node's ledger reports and the one Opacus's
accountant reports are within the row's target, and that the models learned something.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_utility_bench_trains_both_sides_within_the_target() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.utility", "--quick", "--rows", "logistic"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| breast_cancer")]
    assert len(rows) == 4, out  # two rows, each on two splits
    assert {line.split("|")[2].strip() for line in rows} == {"seed", "fixed"}, out
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        target = float(cells[0].rsplit("epsilon ", 1)[1])
        ledger, opacus = float(cells[5]), float(cells[6])
        assert 0.9 * target <= ledger <= target and opacus <= target, line
        # one quick run of dpnode at epsilon 1 spreads widely with its noise (0.61 to 0.92
        # over 15 runs, once 0.588 in CI): only the epsilon 4 row (0.89 to 0.90) must show
        # learning, the epsilon 1 row that its model is not broken (a flipped sign: ~0.37)
        floor = 0.6 if target >= 4 else 0.45
        assert floor < float(cells[2].split(" ")[0]) <= 1.0, line
        for acc in (cells[3], cells[7]):  # Opacus, seeded: the same every run
            assert 0.6 < float(acc.split(" ")[0]) <= 1.0, line

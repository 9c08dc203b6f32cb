"""bench/dpsgd.py keeps running and agreeing with NumPy (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dpsgd.py"


def test_bench_quick_run_agrees_with_numpy() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--repeat", "1"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "x |" in line]
    assert len(rows) == 3, out

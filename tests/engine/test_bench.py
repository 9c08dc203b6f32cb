"""The engine and DP-SGD benchmarks keep running and agreeing with NumPy (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(("script", "cases"), [("engine.py", 4), ("dpsgd.py", 3)])
def test_bench_quick_run_agrees_with_numpy(script: str, cases: int) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--repeat", "1"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "x |" in line]
    assert len(rows) == cases, out

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


QUICK_SIDE_CHANNELS = ("--rows", "20000", "--chain", "4", "--repeat", "1")


def test_side_channels_bench_runs_both_attacks_before_and_after() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH / "side_channels.py"), *QUICK_SIDE_CHANNELS],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "x |" in line]
    assert len(rows) == 4, out
    assert [r.split(" | ")[0] for r in rows] == [
        "| subnormals: the engine",
        "| subnormals: the engine before",
        "| a choice: the engine",
        "| a choice: the engine before",
    ]

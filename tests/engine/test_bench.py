"""The engine and DP-SGD benchmarks keep running and agreeing with NumPy (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _ratio_rows(script: str, *args: str) -> tuple[list[str], str]:
    """The table rows (those ending in a ratio) a quick run of ``script`` prints."""
    out = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return [line for line in out.splitlines() if line.startswith("| ") and "x |" in line], out


@pytest.mark.parametrize(("script", "cases"), [("engine.py", 4), ("dpsgd.py", 3)])
def test_bench_quick_run_agrees_with_numpy(script: str, cases: int) -> None:
    rows, out = _ratio_rows(script, "--quick", "--repeat", "1")
    assert len(rows) == cases, out


def test_side_channels_bench_runs_both_attacks_before_and_after() -> None:
    quick = ("--rows", "20000", "--chain", "4", "--repeat", "1")
    rows, out = _ratio_rows("side_channels.py", *quick)
    assert len(rows) == 4, out
    assert [r.split(" | ")[0] for r in rows] == [
        "| subnormals: the engine",
        "| subnormals: the engine before",
        "| a choice: the engine",
        "| a choice: the engine before",
    ]

"""Fixtures of the engine tests, and the conformance summary printed at the end."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    mods = __import__("sys").modules
    mod = mods.get("tests.engine.test_conformance") or mods.get("test_conformance")
    pm = mods.get("tests.engine.test_promotion_matrix") or mods.get("test_promotion_matrix")
    if pm is not None and pm.RESULTS:
        terminalreporter.write_sep("-", "type-promotion matrix vs torch (cells per binary prim)")
        terminalreporter.write_line(pm.matrix_summary())
    if mod is None or not mod.COUNTS:
        return
    table = mod.summary_table()
    terminalreporter.write_sep("-", "engine conformance vs torch OpInfo (samples per op)")
    terminalreporter.write_line(table)
    path = os.environ.get("DPNODE_CONFORMANCE_TABLE")
    if path:
        with open(path, "w") as f:
            f.write(table + "\n")

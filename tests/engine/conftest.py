"""Fixtures of the engine tests, and the conformance summary printed at the end."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from tests.engine import tallies


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # A pytest-xdist worker prints nothing: it hands its tallies to the controller.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["engine_tallies"] = tallies.as_wire(tallies.COUNTS, tallies.RESULTS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller: add up what each worker tallied (none if it crashed)."""
    wire = getattr(node, "workeroutput", {}).get("engine_tallies")
    if wire is not None:
        tallies.merge(wire, tallies.COUNTS, tallies.RESULTS)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if tallies.RESULTS:
        terminalreporter.write_sep("-", "type-promotion matrix vs torch (cells per binary prim)")
        terminalreporter.write_line(tallies.matrix_summary())
    if not tallies.COUNTS:
        return
    table = tallies.summary_table()
    terminalreporter.write_sep("-", "engine conformance vs torch OpInfo (samples per op)")
    terminalreporter.write_line(table)
    path = os.environ.get("DPNODE_CONFORMANCE_TABLE")
    if path:
        with open(path, "w") as f:
            f.write(table + "\n")

"""The doctests on the engine's small helpers run with the suite."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "node.engine.dtypes",
    "node.engine.promotion",
    "node.engine.graph",
    "node.engine.evaluator",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

"""The doctests on the policy helpers (units, periods, conversion, documents) run with the suite."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "policies._units",
    "policies._periods",
    "policies._conversion",
    "policies._document",
    "policies._budget",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

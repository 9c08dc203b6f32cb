"""The examples in node.dp's docstrings run and give what they say."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["accounting", "grid", "mechanisms", "samplers", "tables"]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    module = importlib.import_module(f"node.dp.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0

"""Fixtures of the engine tests (their conformance summary is printed by the root conftest)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)

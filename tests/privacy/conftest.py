"""Fixtures of the privacy tests (helpers live in ``tests/privacy/helpers.py``)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)

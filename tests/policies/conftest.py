"""Helpers for the policy tests: a clock, the node's default budget and record builders."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

import pytest

from dpnode.policies import Allowance, PublishRequest, User, epsilon_units

T0 = datetime(2026, 1, 1, tzinfo=UTC)
#: The node's settings defaults (``default_epsilon_budget``, ``default_delta_budget``).
DEFAULTS = Allowance.of(10.0, 1e-6)
ALICE = User(1, "alice@example.org", "data_scientist")
BOB = User(2, "bob@example.org", "data_scientist")


def at(seconds: float = 0, *, days: float = 0) -> datetime:
    """``T0`` plus an offset."""
    return T0 + timedelta(seconds=seconds, days=days)


def publish(
    epsilon: float = 0.0,
    *,
    when: datetime = T0,
    datasets: Mapping[str, int] | None = None,
    delta_units: int = 0,
    rho_units: int = 0,
) -> PublishRequest:
    """A publish request asking for ``epsilon`` on ``datasets`` (default: diabetes, id 1)."""
    return PublishRequest(
        at=when,
        datasets={"diabetes": 1} if datasets is None else datasets,
        epsilon_units=epsilon_units(epsilon),
        delta_units=delta_units,
        rho_units=rho_units,
    )


@pytest.fixture
def defaults() -> Allowance:
    return DEFAULTS

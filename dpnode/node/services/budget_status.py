"""A user's budget at one instant, as the privacy filter counts it, and a receipt's terms.

The budget after a charge is derived from the sums the charge read plus its new row
(:func:`_after`), not read again (tests/node/test_budget_after.py checks they agree); read
on its own, it is :func:`budget_of`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection
from sqlalchemy.orm import Session

from dpnode import policies
from dpnode.core.errors import NotFoundError
from dpnode.node.db.base import utcnow
from dpnode.node.db.models import User
from dpnode.node.services import policy as policy_service
from dpnode.node.services.costs import (
    _TV_PER_DELTA,
    DELTA_UNIT,
    EPSILON_UNIT,
    RHO_UNIT,
    quantize_epsilon,
)
from dpnode.node.services.ledger_sums import _Ledger, _load, policy_user
from dpnode.node.services.policy import InForce
from dpnode.node.settings import Settings
from dpnode.policies import in_float

if TYPE_CHECKING:
    from dpnode.node.services.charge_rows import Charged

__all__ = ["Status", "budget_of", "receipt_terms"]


@dataclass(frozen=True)
class RunSoFar:
    """A training run as the ledger holds it after one of its steps: ``steps`` of the
    ``planned`` ones taken, and what they added to the budget together, in ledger units (as
    ``dpnode.node.services.ledger`` counts each row; epsilon ``None``: no delta to convert
    their rho at)."""

    run_id: int
    steps: int
    planned: int
    epsilon_units: int | None
    delta_units: int


@dataclass(frozen=True)
class Status:
    """A user's budget under the policy in force, at one instant (after a charge, or now).

    ``spent()`` is the epsilon used (pure plus converted zCDP) and the delta used of the
    current window, as the privacy filter counts them: the deltas charged directly (the
    samplers') and, once any rho was charged, the share ``delta_z`` the rho total is
    converted at. ``remaining_epsilon`` and ``remaining_delta`` are what is left of the
    allocation after exactly that, so spent and remaining add up to the allocation.
    ``spent_tv_units`` is the samplers' delta in :data:`TV_UNIT` (the API's ``sampler_tv``).
    """

    in_force: InForce
    status: policies.BudgetStatus
    conversion_delta_units: int
    spent_tv_units: int
    #: after a step of a training run: the run so far (see :class:`RunSoFar`)
    run: RunSoFar | None = None

    @property
    def epsilon(self) -> float:
        return in_float(self.status.allocation.epsilon_units, EPSILON_UNIT)

    @property
    def delta(self) -> float:
        return in_float(self.status.allocation.delta_units, DELTA_UNIT)

    def used_units(self, used: policies.Spent | None = None) -> tuple[int | None, int]:
        """(epsilon, delta) units ``used`` (default: this window's) counts for, as the filter
        counts them; epsilon ``None`` where a rho cannot be converted at all."""
        used = self.status.spent if used is None else used
        a = self.status.allocation
        limit = policies.Limit.for_policy(self.in_force.policy, None, a.delta_units)
        reserved = self.conversion_delta_units if used.rho_units else 0
        return limit.epsilon_used(used, policies.filter_epsilon), used.delta_units + reserved

    @cached_property
    def _used(self) -> tuple[int | None, int]:
        """:meth:`used_units` of this window, worked out once (a receipt reads it thrice)."""
        return self.used_units()

    def spent(self) -> tuple[float, float]:
        """(epsilon, delta) used in the current window, as the privacy filter counts them."""
        epsilon, delta = self._used
        return math.inf if epsilon is None else in_float(epsilon, EPSILON_UNIT), in_float(
            delta, DELTA_UNIT
        )

    @property
    def remaining_epsilon(self) -> float:
        return in_float(self.status.remaining.epsilon_units, EPSILON_UNIT)

    @property
    def remaining_delta(self) -> float:
        """The allocation's delta less what :meth:`spent` counts (never negative)."""
        _, delta = self._used
        return in_float(max(0, self.status.allocation.delta_units - delta), DELTA_UNIT)

    @property
    def sampler_delta(self) -> float:
        """The samplers' deltas in the current window (part of :meth:`spent`'s delta)."""
        return in_float(self.status.spent.delta_units, DELTA_UNIT)

    def describe(self) -> str:
        return self.status.remaining.describe()


def receipt_terms(
    entry: Charged, after: Status, *, asked_epsilon: float, asked_delta: float | None
) -> dict[str, Any]:
    """The budget fields of a publish's receipt, from what :func:`charge` returned.

    ``epsilon`` and ``delta`` are what this release took from the user's budget, in the
    user's own terms: how much the spent epsilon and delta of :meth:`Status.spent` grew with
    this row, under the filter's own conversion (so the remaining epsilon fell by exactly
    ``epsilon``). For a Laplace release that is the epsilon asked and its sampler's delta;
    for a Gaussian one the growth of the converted rho total (the first one also commits the
    delta ``delta_z`` the rho total is converted at). ``asked_epsilon`` / ``asked_delta`` are
    what the publish asked for (epsilon as the mechanism used it, rounded down to the
    ledger's unit), ``rho`` the zCDP charged, ``sampler_delta`` and ``sampler_epsilon`` what
    the sampler's deviation cost (part of ``delta`` and ``epsilon``); ``spent_*`` and
    ``remaining_*`` are the budget after the release, as ``client.budget()`` reads it. A step
    of a training run adds ``run_id``, ``run_steps`` (so far, of ``run_planned_steps``) and
    ``run_epsilon`` / ``run_delta``: its steps' epsilon and delta used so far, together.
    """
    used = after.status.spent
    before = policies.Spent(
        used.epsilon_units - entry.epsilon_units,
        used.delta_units - entry.tv_units,
        used.rho_units - entry.rho_units,
    )
    eps_before, delta_before = after.used_units(before)
    eps_after, delta_after = after._used
    charged = None if eps_after is None or eps_before is None else eps_after - eps_before
    spent_epsilon, spent_delta = after.spent()
    sampler_epsilon = entry.epsilon_units if entry.rho_units else 0
    return {
        "epsilon": math.inf if charged is None else in_float(charged, EPSILON_UNIT),
        "delta": in_float(delta_after - delta_before, DELTA_UNIT),
        "asked_epsilon": float(quantize_epsilon(asked_epsilon)),
        "asked_delta": asked_delta,
        "rho": in_float(entry.rho_units, RHO_UNIT),
        "sampler_epsilon": in_float(sampler_epsilon, EPSILON_UNIT),
        "sampler_delta": in_float(entry.tv_units, DELTA_UNIT),
        "spent_epsilon": spent_epsilon,
        "spent_delta": spent_delta,
        "remaining_epsilon": after.remaining_epsilon,
        "remaining_delta": after.remaining_delta,
        **_run_terms(after.run),
    }


def _run_terms(run: RunSoFar | None) -> dict[str, Any]:
    """A run step's receipt: the run, its steps so far, and their epsilon and delta used
    together (what the ledger's line for the run sums)."""
    if run is None:
        return {}
    epsilon = run.epsilon_units
    return {
        "run_id": run.run_id,
        "run_steps": run.steps,
        "run_planned_steps": run.planned,
        "run_epsilon": math.inf if epsilon is None else in_float(epsilon, EPSILON_UNIT),
        "run_delta": in_float(run.delta_units, DELTA_UNIT),
    }


def _defaults(settings: Settings) -> policies.Allowance:
    return _allowance(settings.default_epsilon_budget, settings.default_delta_budget)


@lru_cache(maxsize=16)  # the node's defaults: the same two numbers on every publish
def _allowance(epsilon: float, delta: float) -> policies.Allowance:
    return policies.Allowance.of(epsilon, delta)


def _status(
    on: Session | Connection,
    settings: Settings,
    in_force: InForce,
    user: policies.User,
    at: datetime,
) -> Status:
    defaults = _defaults(settings)
    ledger = _load(on, in_force.policy, policies.PublishRequest(at), user)
    return _status_of(in_force, user, ledger.charges, at, defaults)


def _status_of(
    in_force: InForce,
    user: policies.User,
    charges: list[policies.Charge],
    at: datetime,
    defaults: policies.Allowance,
) -> Status:
    status = policies.budget_status(in_force.policy, user, charges, at=at, defaults=defaults)
    limit = policies.Limit.for_policy(in_force.policy, None, status.allocation.delta_units)
    # The user's rows of the window carry the samplers' deltas (and nothing else of delta).
    samplers = status.spent.delta_units * _TV_PER_DELTA
    return Status(in_force, status, limit.conversion_delta_units, samplers)


def _after(
    in_force: InForce,
    defaults: policies.Allowance,
    user: policies.User,
    ledger: _Ledger,
    row: policies.Charge,
) -> Status | None:
    """The budget once ``row`` is in the ledger, exactly as :func:`_status` would read it,
    from the sums read for the decision; ``None`` where :func:`_status` passes rows one by
    one (a rate limit reached), which must read them."""
    limit = in_force.policy.rate_limit
    if ledger.listed or (limit is not None and ledger.in_rate_window + 1 >= limit.max_publishes):
        return None
    at = row.at
    epsilon, rho, delta, newest = ledger.mine
    summed = policies.Charge(
        at if newest is None else max(newest, at),
        user.id,
        (),
        epsilon + row.epsilon_units,
        delta + row.delta_units,
        rho + row.rho_units,
    )
    return _status_of(in_force, user, [summed], at, defaults)


def budget_of(session: Session, settings: Settings, user_id: int) -> Status:
    """The user's budget under the policy in force, as the ledger stands in this transaction.

    Raises:
        NotFoundError: no such user.
    """
    user = session.get(User, user_id)
    if user is None:
        raise NotFoundError(f"no user with id {user_id}")
    in_force = policy_service.current(session)
    return _status(session, settings, in_force, policy_user(session, user), utcnow())

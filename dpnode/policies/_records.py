"""The plain records that evaluation reads and returns.

The node builds these from its tables (users, ledger rows, budget grants, the publish being
asked for) and hands them to :func:`policies.decide`; nothing here touches a database. All
amounts are whole ledger units (see :mod:`policies._units`) and all instants are aware
datetimes, normalised to UTC.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from policies._document import ROLES
from policies._periods import as_utc
from policies._units import delta_units, epsilon_units, format_delta, format_epsilon

__all__ = [
    "Allowance",
    "Approval",
    "Charge",
    "Decision",
    "Grant",
    "Outcome",
    "PublishRequest",
    "Remaining",
    "RunRequest",
    "User",
]


def _check_units(record: object, *names: str) -> None:
    for name in names:
        value = getattr(record, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a whole number of units >= 0, got {value!r}")


def _utc(record: object, name: str) -> None:
    object.__setattr__(record, name, as_utc(getattr(record, name)))


@dataclass(frozen=True)
class Allowance:
    """An amount of epsilon and delta in ledger units (the node's default budget, a grant...)."""

    epsilon_units: int
    delta_units: int

    def __post_init__(self) -> None:
        _check_units(self, "epsilon_units", "delta_units")

    @classmethod
    def of(cls, epsilon: float, delta: float) -> Allowance:
        """From configured floats, rounded down (``Allowance.of(10.0, 1e-6)`` for the node's
        ``default_epsilon_budget`` and ``default_delta_budget``)."""
        return cls(epsilon_units(epsilon), delta_units(delta))


@dataclass(frozen=True)
class Grant:
    """An approved budget request: adds to the user's allocation from ``at`` on."""

    at: datetime
    epsilon_units: int
    delta_units: int = 0
    by: str = ""
    reason: str = ""

    def __post_init__(self) -> None:
        _check_units(self, "epsilon_units", "delta_units")
        _utc(self, "at")


@dataclass(frozen=True)
class User:
    """Who is publishing: the node's user id, email (lower case), role, and their grants."""

    id: int
    email: str
    role: str
    grants: tuple[Grant, ...] = ()

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; roles are {', '.join(ROLES)}")
        object.__setattr__(self, "role", str(self.role))
        object.__setattr__(self, "grants", tuple(self.grants))


@dataclass(frozen=True)
class Charge:
    """One ledger row: what a release cost, when, for whom and on which datasets."""

    at: datetime
    user_id: int
    dataset_ids: tuple[int, ...] = ()
    epsilon_units: int = 0
    delta_units: int = 0
    rho_units: int = 0

    def __post_init__(self) -> None:
        _check_units(self, "epsilon_units", "delta_units", "rho_units")
        _utc(self, "at")
        object.__setattr__(self, "dataset_ids", tuple(self.dataset_ids))


@dataclass(frozen=True)
class PublishRequest:
    """A publish asked for.

    Attributes:
        at: when it would run (for an approved request: when it is executed, not queued).
        datasets: name -> id of every dataset the release reads.
        epsilon_units: the release's own epsilon, as asked (per-publish caps and approval
            thresholds compare against it; a pure release is charged exactly this).
        delta_units: the release's own delta, as asked (0 for a pure-epsilon release).
        rho_units: zCDP rho charged *instead of* epsilon and delta (a Gaussian release
            calibrated to the asked (epsilon, delta)); 0 for a pure release.
        extra_delta_units: delta charged on top: what the samplers' deviation costs, at the
            release's own parameters.
        extra_epsilon_units: epsilon charged on top (a Gaussian sampler's precision term).
    """

    at: datetime
    datasets: Mapping[str, int] = field(default_factory=dict, hash=False)
    epsilon_units: int = 0
    delta_units: int = 0
    rho_units: int = 0
    extra_delta_units: int = 0
    extra_epsilon_units: int = 0

    def __post_init__(self) -> None:
        _check_units(
            self,
            "epsilon_units",
            "delta_units",
            "rho_units",
            "extra_delta_units",
            "extra_epsilon_units",
        )
        _utc(self, "at")
        object.__setattr__(self, "datasets", dict(self.datasets))

    def charge(self, user_id: int) -> Charge:
        """The ledger row this publish writes when it runs."""
        ids = tuple(sorted(set(self.datasets.values())))
        extra = self.extra_epsilon_units
        if self.rho_units:
            return Charge(self.at, user_id, ids, extra, self.extra_delta_units, self.rho_units)
        delta = self.delta_units + self.extra_delta_units
        return Charge(self.at, user_id, ids, self.epsilon_units + extra, delta, 0)


@dataclass(frozen=True)
class RunRequest:
    """A training run planned as a whole, before its first step: ``steps`` publishes, each
    asking for exactly ``step`` (a Gaussian release: its asked epsilon and delta, the rho it
    is charged, its samplers' terms). ``step.at`` is the planning time and ``step.datasets``
    every dataset the run reads.

    The run is judged by :func:`policies.decide_run`: per-publish caps on one step, the
    budget, dataset caps and approval thresholds on the run's total.
    """

    steps: int
    step: PublishRequest

    def __post_init__(self) -> None:
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise ValueError(f"steps must be a whole number >= 1, got {self.steps!r}")
        if self.step.rho_units <= 0:  # its total is then the zCDP sum, converted once
            raise ValueError("a run's steps are Gaussian releases: step.rho_units must be > 0")

    def total(self, epsilon_units: int, delta_units: int) -> PublishRequest:
        """The whole run as one request: every step's charges summed, asking for
        ``(epsilon_units, delta_units)``, the run's total as the privacy filter counts it."""
        s, n = self.step, self.steps
        return PublishRequest(
            at=s.at,
            datasets=s.datasets,
            epsilon_units=epsilon_units,
            delta_units=delta_units,
            rho_units=s.rho_units * n,
            extra_delta_units=s.extra_delta_units * n,
            extra_epsilon_units=s.extra_epsilon_units * n,
        )


@dataclass(frozen=True)
class Approval:
    """An admin's answer to a publish that waited for approval.

    Attributes:
        approved: yes or no.
        by: the admin (email), for the reason text and the audit log.
        at: when the admin answered.
        reason: the admin's words, quoted in a denial.
        epsilon_units, delta_units: the most the approval covers (``None``: what was asked);
            a request asking for more waits for a new approval.
    """

    approved: bool
    by: str
    at: datetime
    reason: str = ""
    epsilon_units: int | None = None
    delta_units: int | None = None

    def __post_init__(self) -> None:
        _utc(self, "at")

    def covers(self, request: PublishRequest) -> bool:
        """Whether this is an approval of at least what ``request`` asks for."""
        eps_ok = self.epsilon_units is None or request.epsilon_units <= self.epsilon_units
        delta_ok = self.delta_units is None or request.delta_units <= self.delta_units
        return self.approved and eps_ok and delta_ok


class Outcome(enum.StrEnum):
    """What happens to a publish."""

    ALLOW = "allow"
    REFUSE = "refuse"
    NEEDS_APPROVAL = "needs_approval"


@dataclass(frozen=True)
class Remaining:
    """What is left of a budget: epsilon (after converting the rho spent), the delta left for
    direct charges, and when the period renews (``None``: never)."""

    epsilon_units: int
    delta_units: int
    renews_at: datetime | None = None

    def describe(self) -> str:
        """``"remaining budget: epsilon 1.5, direct delta 1e-09"`` (and when it renews).

        The delta is what is left for deltas charged directly: the part of the delta budget
        reserved for converting zCDP charges is not spent by them, it is in the epsilon.
        """
        text = (
            f"remaining budget: epsilon {format_epsilon(self.epsilon_units)}, "
            f"direct delta {format_delta(self.delta_units)}"
        )
        if self.renews_at is not None:
            text += f" (renews at {self.renews_at.isoformat().replace('+00:00', 'Z')})"
        return text


@dataclass(frozen=True)
class Decision:
    """The verdict on a publish.

    Attributes:
        outcome: allow, refuse or needs_approval.
        rule: the policy rule that decided, e.g. ``"publish.max_epsilon"``,
            ``"datasets.diabetes.max_epsilon"``, ``"roles.data_scientist.epsilon"``;
            ``"allow"`` when no rule objected.
        reason: a sentence a person can read.
        granted: the ledger row to write, when allowed (never a reduced amount); else ``None``
            (and ``None`` for a run's plan, which writes no ledger row).
        remaining: the user's budget in the current period: after ``granted`` when allowed,
            as it stands when refused or waiting.
    """

    outcome: Outcome
    rule: str
    reason: str
    granted: Charge | None
    remaining: Remaining

    @property
    def allowed(self) -> bool:
        """Whether the publish may run now."""
        return self.outcome is Outcome.ALLOW

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for the audit log and API errors (amounts in ledger units)."""
        granted = None
        if self.granted is not None:
            g = self.granted
            granted = {
                "epsilon_units": g.epsilon_units,
                "delta_units": g.delta_units,
                "rho_units": g.rho_units,
                "dataset_ids": list(g.dataset_ids),
            }
        renews = self.remaining.renews_at
        return {
            "outcome": self.outcome.value,
            "rule": self.rule,
            "reason": self.reason,
            "granted": granted,
            "remaining": {
                "epsilon_units": self.remaining.epsilon_units,
                "delta_units": self.remaining.delta_units,
                "renews_at": None if renews is None else renews.isoformat(),
            },
        }

"""Your privacy budget, the ledger of what was spent, and the admin records around them:
budget requests and grants, publishes waiting for approval, policy revisions."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any


def _at(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@dataclass(frozen=True)
class BudgetStatus:
    """Your allowance under the policy in force and what the privacy filter counts as spent.

    ``spent_epsilon`` adds pure (Laplace) charges and converted zCDP (Gaussian) ones;
    ``spent_delta`` adds the deltas the samplers' deviations cost and, once any Gaussian release
    was made, the share of ``delta`` the zCDP total is converted at. ``remaining_epsilon`` and
    ``remaining_delta`` are what is left of ``epsilon`` and ``delta`` after exactly those, so
    spent and remaining add up to the allowance. ``pure_epsilon`` and ``rho`` are the raw sums
    of the ledger and ``sampler_tv`` the samplers' deltas, in the current renewal window
    (``period_start`` .. ``renews_at``; both ``None`` when budgets never renew).
    ``epsilon_rule`` says where the allocation comes from (``roles.data_scientist.epsilon``,
    ``users.EMAIL.epsilon``, ``defaults.epsilon``); ``granted_epsilon`` is the part of it
    granted on request.
    """

    epsilon: float
    delta: float
    spent_epsilon: float
    spent_delta: float
    remaining_epsilon: float
    pure_epsilon: float
    rho: float
    sampler_tv: float
    remaining_delta: float = 0.0
    epsilon_rule: str = ""
    delta_rule: str = ""
    granted_epsilon: float = 0.0
    granted_delta: float = 0.0
    period_start: datetime | None = None
    renews_at: datetime | None = None
    policy: str = ""
    policy_revision: int | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BudgetStatus:
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in body:
                continue
            value = body[f.name]
            if f.name in ("period_start", "renews_at"):
                value = _at(value)
            elif f.name in ("epsilon_rule", "delta_rule", "policy", "policy_revision"):
                pass
            else:
                value = float(value)
            values[f.name] = value
        return cls(**values)

    def __str__(self) -> str:
        text = (
            f"epsilon: {self.spent_epsilon:g} of {self.epsilon:g} spent, "
            f"{self.remaining_epsilon:g} remaining; delta: {self.spent_delta:.3g} of "
            f"{self.delta:.3g} used, {self.remaining_delta:.3g} remaining"
        )
        if self.renews_at is not None:
            text += f"; renews at {self.renews_at.isoformat()}"
        return text


@dataclass(frozen=True)
class LedgerEntry:
    """One charge to a budget, and the policy revision that allowed it."""

    id: int
    at: datetime
    mechanism: str
    epsilon: float
    rho: float
    sampler_tv: float
    dataset_ids: tuple[int, ...]
    graph_hash: str | None
    detail: dict[str, Any]
    user_id: int | None = None
    user_email: str | None = None
    policy_revision: int | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> LedgerEntry:
        return cls(
            id=body["id"],
            at=datetime.fromisoformat(body["at"]),
            mechanism=body["mechanism"],
            epsilon=body["epsilon"],
            rho=body["rho"],
            sampler_tv=body["sampler_tv"],
            dataset_ids=tuple(body["dataset_ids"]),
            graph_hash=body["graph_hash"],
            detail=body["detail"],
            user_id=body.get("user_id"),
            user_email=body.get("user_email"),
            policy_revision=body.get("policy_revision"),
        )


@dataclass(frozen=True)
class BudgetRequest:
    """A request for more budget and, once answered, the decision.

    ``status`` is ``"pending"``, ``"approved"`` (``granted_epsilon``/``granted_delta`` say how
    much) or ``"denied"`` (``decision_reason`` says why).
    """

    id: int
    user_id: int
    user_email: str
    created_at: datetime
    epsilon: float
    delta: float
    reason: str
    status: str
    decided_at: datetime | None
    decided_by: str | None
    decision_reason: str
    granted_epsilon: float | None
    granted_delta: float | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BudgetRequest:
        return cls(
            **{
                **body,
                "created_at": datetime.fromisoformat(body["created_at"]),
                "decided_at": _at(body["decided_at"]),
            }
        )


@dataclass(frozen=True)
class BudgetGrant:
    """Budget added to a user's allocation, from ``at`` on (by an admin, maybe on request)."""

    id: int
    at: datetime
    user_id: int
    epsilon: float
    delta: float
    granted_by: str
    reason: str
    request_id: int | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BudgetGrant:
        return cls(**{**body, "at": datetime.fromisoformat(body["at"])})


@dataclass(frozen=True)
class PublishApproval:
    """A publish that waited for an admin: ``pending``, ``approved``, ``denied``, or ``used``
    (an approved publish ran, ``ledger_id`` is its charge; a denial was reported).

    ``kind`` ``"run"``: a whole training run (``description``), ``epsilon`` and ``delta``
    its total; once approved its ``steps`` publishes of ``step_epsilon`` / ``step_delta``
    each run under it (``steps_used`` so far), and the last one uses it up.
    """

    id: int
    user_id: int
    user_email: str
    created_at: datetime
    mechanism: str
    epsilon: float
    delta: float
    dataset_ids: tuple[int, ...]
    graph_hash: str | None
    rule: str
    reason: str
    policy_revision: int | None
    status: str
    decided_at: datetime | None
    decided_by: str | None
    decision_reason: str
    ledger_id: int | None
    kind: str = "publish"
    description: str = ""
    steps: int | None = None
    steps_used: int = 0
    step_epsilon: float | None = None
    step_delta: float | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> PublishApproval:
        return cls(
            **{
                **body,
                "created_at": datetime.fromisoformat(body["created_at"]),
                "decided_at": _at(body["decided_at"]),
                "dataset_ids": tuple(body["dataset_ids"]),
            }
        )


@dataclass(frozen=True)
class TrainingRunPlan:
    """A training run the node's policy lets start (``client.plan_run``).

    ``run_id`` names the admin's approval each step's publish carries (``None``: the run
    needed none, its steps are ordinary publishes); ``epsilon`` and ``delta`` are the run's
    total as the ledger will count it; ``remaining_epsilon`` what your budget keeps once
    every step has run; ``steps_used`` the steps already published under the approval.
    """

    run_id: int | None
    steps: int
    steps_used: int
    epsilon: float
    delta: float
    step_epsilon: float
    step_delta: float
    remaining_epsilon: float
    policy: str
    policy_revision: int | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> TrainingRunPlan:
        return cls(**body)


@dataclass(frozen=True)
class PolicyRevision:
    """A revision of the node's budget policy (``revision`` None: the built-in default).

    ``document`` is the canonical form; ``source`` the text as it was sent. ``changed`` is
    false when applying it stored nothing (it equals the policy in force); ``warnings`` note
    what did not stop it, e.g. a cap on a dataset not uploaded yet.
    """

    revision: int | None
    at: datetime | None
    created_by: str
    reason: str
    name: str
    content_hash: str
    document: dict[str, Any]
    source: str
    changed: bool = True
    warnings: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> PolicyRevision:
        return cls(
            **{
                **body,
                "at": _at(body["at"]),
                "warnings": tuple(body.get("warnings", ())),
            }
        )

"""A dataset's cap as the node reports it: used / cap (``client.dataset(...).budget()``), and
the datasets a waiting publish reads (``client.publish_approvals()``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["DatasetBudget", "DatasetRead"]


def _number(value: float | None) -> str:
    return "unbounded" if value is None else f"{value:.10g}"


@dataclass(frozen=True)
class DatasetBudget:
    """How much of a dataset's cap all users together have spent, under the policy in force.

    ``epsilon`` / ``delta``: the cap (``None``: not capped on that side; both ``None``: not
    capped, ``capped`` false). ``epsilon_used`` is ``None`` only for a zCDP charge that no
    delta converts. ``renews_at``: when the cap's window renews (``None``: a lifetime cap).
    Only the dataset's owner and admins may read it.
    """

    dataset_id: int
    name: str
    capped: bool
    epsilon: float | None
    delta: float | None
    epsilon_used: float | None
    delta_used: float
    epsilon_remaining: float | None
    delta_remaining: float | None
    renews_at: datetime | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> DatasetBudget:
        at = body["renews_at"]
        return cls(**{**body, "renews_at": None if at is None else datetime.fromisoformat(at)})

    def __str__(self) -> str:
        """``diabetes: epsilon 1.5 / 30 used, 28.5 left``."""
        if not self.capped:
            return f"{self.name}: not capped"
        parts = []
        if self.epsilon is not None:
            parts.append(
                f"epsilon {_number(self.epsilon_used)} / {self.epsilon:g} used, "
                f"{_number(self.epsilon_remaining)} left"
            )
        if self.delta is not None:
            parts.append(f"delta {self.delta_used:.3g} / {self.delta:.3g} used")
        renews = "" if self.renews_at is None else f" (renews {self.renews_at.isoformat()})"
        return f"{self.name}: " + "; ".join(parts) + renews


@dataclass(frozen=True)
class DatasetRead:
    """A dataset a publish reads: its name (``None``: deleted since) and its cap (``None``:
    not yours to see)."""

    dataset_id: int
    name: str | None
    budget: DatasetBudget | None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> DatasetRead:
        b = body["budget"]
        return cls(
            body["dataset_id"], body["name"], None if b is None else DatasetBudget.from_json(b)
        )

    def __str__(self) -> str:
        if self.budget is not None:
            return str(self.budget)
        return self.name or f"dataset {self.dataset_id} (deleted)"

"""What an admin reads before answering a request: the computation, its noise, the
requester's budget and the caps of the datasets it reads.

The computation (a bounded listing of its graph, its sensitivity, mechanism and noise scale)
was kept with the request when it was queued (``PublishApproval.detail``); the budget and the
caps are read now, when the admin looks, since that is what the approved publish will meet.
Caps are shown to admins, and to a requester only for the datasets they own
(:func:`dpnode.node.services.dataset_budgets.may_see`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dpnode.node.db.models import Dataset, PublishApproval, User
from dpnode.node.services.budget_status import budget_of
from dpnode.node.services.dataset_budgets import DatasetBudget, visible_budgets
from dpnode.node.settings import Settings

__all__ = ["DatasetRead", "Review", "audit_terms", "reviews"]


@dataclass(frozen=True)
class DatasetRead:
    """A dataset a request reads: its name (``None``: deleted since) and, for who may see
    it, its cap and use."""

    dataset_id: int
    name: str | None
    budget: DatasetBudget | None


@dataclass(frozen=True)
class Review:
    """One request as its reviewer reads it (see the module docstring)."""

    computation: list[str]
    sensitivity: float | None
    noise_scale: float | None
    outputs: list[list[int]]
    remaining_epsilon: float
    remaining_delta: float
    datasets: list[DatasetRead]


def reviews(
    session: Session, settings: Settings, viewer: User | None, rows: Sequence[PublishApproval]
) -> dict[int, Review]:
    """A :class:`Review` of each row, by id: each requester's budget and each dataset's cap
    read once."""
    ids = sorted({d for row in rows for d in row.dataset_ids})
    named = select(Dataset.id, Dataset.name).where(Dataset.id.in_(ids))
    names: dict[int, str] = {i: name for i, name in session.execute(named)}
    caps = visible_budgets(session, settings, viewer, ids)
    budgets = {u: budget_of(session, settings, u) for u in {row.user_id for row in rows}}
    out = {}
    for row in rows:
        detail: dict[str, Any] = row.detail or {}
        status = budgets[row.user_id]
        out[row.id] = Review(
            computation=list(detail.get("computation", [])),
            sensitivity=detail.get("sensitivity"),
            noise_scale=detail.get("scale"),
            outputs=list(detail.get("outputs", [])),
            remaining_epsilon=status.remaining_epsilon,
            remaining_delta=status.remaining_delta,
            datasets=[DatasetRead(d, names.get(d), caps.get(d)) for d in row.dataset_ids],
        )
    return out


def audit_terms(review: Review, row: PublishApproval) -> dict[str, Any]:
    """What an answer's audit line records of what was approved (or denied)."""
    return {
        "description": row.description,
        "mechanism": row.mechanism,
        "sensitivity": review.sensitivity,
        "noise_scale": review.noise_scale,
        "computation": review.computation,
        "remaining_epsilon": review.remaining_epsilon,
        "dataset_caps": {
            (d.name or str(d.dataset_id)): d.budget.describe()
            for d in review.datasets
            if d.budget is not None
        },
    }

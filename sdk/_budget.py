"""Your privacy budget and the ledger of what you have spent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class BudgetStatus:
    """Your allowance and what the node's privacy filter counts as spent.

    ``spent_epsilon`` adds pure (Laplace) charges and converted zCDP (Gaussian) ones;
    ``pure_epsilon``, ``rho`` and ``sampler_tv`` are the raw sums of the ledger.
    """

    epsilon: float
    delta: float
    spent_epsilon: float
    spent_delta: float
    remaining_epsilon: float
    pure_epsilon: float
    rho: float
    sampler_tv: float

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BudgetStatus:
        return cls(**{k: float(body[k]) for k in cls.__dataclass_fields__})

    def __str__(self) -> str:
        return (
            f"epsilon: {self.spent_epsilon:g} of {self.epsilon:g} spent, "
            f"{self.remaining_epsilon:g} remaining; delta: {self.spent_delta:.3g} of "
            f"{self.delta:.3g} used"
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One charge to a budget."""

    id: int
    at: datetime
    mechanism: str
    epsilon: float
    rho: float
    sampler_tv: float
    dataset_ids: tuple[int, ...]
    graph_hash: str | None
    detail: dict[str, Any]

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
        )

"""Your privacy budget and the ledger of what you have spent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class BudgetStatus:
    """Totals, spent and remaining, as the node's ledger stands."""

    epsilon: float
    delta: float
    spent_epsilon: float
    spent_delta: float
    spent_rho: float
    remaining_epsilon: float
    remaining_delta: float

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> BudgetStatus:
        return cls(**{k: float(body[k]) for k in cls.__dataclass_fields__})

    def __str__(self) -> str:
        return (
            f"epsilon: {self.spent_epsilon:g} of {self.epsilon:g} spent, "
            f"{self.remaining_epsilon:g} remaining; delta: {self.spent_delta:g} of "
            f"{self.delta:g} spent"
        )


@dataclass(frozen=True)
class LedgerEntry:
    """One charge to a budget."""

    id: int
    at: datetime
    mechanism: str
    epsilon: float
    delta: float
    rho: float
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
            delta=body["delta"],
            rho=body["rho"],
            dataset_ids=tuple(body["dataset_ids"]),
            graph_hash=body["graph_hash"],
            detail=body["detail"],
        )

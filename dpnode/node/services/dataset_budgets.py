"""How much of each dataset's cap all users together have spent: used / cap, as decided.

A dataset's cap (``[datasets.NAME] max_epsilon`` in the policy) is a promise to its subjects,
and what is left of it says how much others have queried the dataset. So the figure is shown
to the dataset's owner and to admins only; anyone else asking is refused
(``PermissionDeniedError``). The arithmetic is the ``datasets`` rule's own
(:func:`dpnode.policies.cap_status`) on the rows the publish transaction reads for it
(:func:`dpnode.node.services.ledger_sums._load`), so the figure shown is the one that decides.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction

from sqlalchemy import select
from sqlalchemy.orm import Session

from dpnode import policies
from dpnode.core.errors import PermissionDeniedError
from dpnode.node.db.base import utcnow
from dpnode.node.db.models import Dataset, Role, User
from dpnode.node.services import policy as policy_service
from dpnode.node.services.budget_status import _defaults
from dpnode.node.services.costs import DELTA_UNIT, EPSILON_UNIT
from dpnode.node.services.ledger_sums import _load
from dpnode.node.settings import Settings
from dpnode.policies import in_float

__all__ = ["DatasetBudget", "budgets_of", "dataset_budget", "may_see", "visible_budgets"]

#: Whose rows :func:`budgets_of` reads as "the user's": nobody's (ids start at 1).
_NOBODY = policies.User(0, "", "admin")


@dataclass(frozen=True)
class DatasetBudget:
    """A dataset's cap under the policy in force and what all users spent of it.

    ``epsilon`` / ``delta``: the cap (``None``: that side is not capped; both ``None``: the
    policy caps the dataset not, and the ``used`` figures are 0). ``epsilon_used`` is
    ``None`` when a zCDP (Gaussian) charge has no delta to convert at (a cap of delta 0,
    which admits none: only rows charged before such a cap was set).
    """

    dataset_id: int
    name: str
    epsilon: float | None
    delta: float | None
    epsilon_used: float | None
    delta_used: float
    epsilon_remaining: float | None
    delta_remaining: float | None
    renews_at: datetime | None

    @property
    def capped(self) -> bool:
        return self.epsilon is not None or self.delta is not None

    def describe(self) -> str:
        """``"epsilon 1.5 of 30 used"`` (or ``"not capped"``).

        >>> DatasetBudget(1, "d", 30.0, None, 1.5, 0.0, 28.5, None, None).describe()
        'epsilon 1.5 of 30 used'
        """
        if not self.capped:
            return "not capped"
        parts = []
        if self.epsilon is not None:
            used = "unbounded" if self.epsilon_used is None else f"{self.epsilon_used:.10g}"
            parts.append(f"epsilon {used} of {self.epsilon:.10g}")
        if self.delta is not None:
            parts.append(f"delta {self.delta_used:.3g} of {self.delta:.3g}")
        renews = "" if self.renews_at is None else f" (renews at {self.renews_at.isoformat()})"
        return ", ".join(parts) + " used" + renews


def may_see(actor: User | None, dataset: Dataset) -> bool:
    """Whether ``actor`` may see the dataset's cap: its owner, an admin, or the operator's
    command line (``None``)."""
    return actor is None or actor.role is Role.ADMIN or actor.id == dataset.owner_id


def _of(dataset_id: int, name: str, cap: policies.CapStatus | None) -> DatasetBudget:
    if cap is None:
        return DatasetBudget(dataset_id, name, None, None, 0.0, 0.0, None, None, None)

    def amount(units: int | None, unit: Fraction) -> float | None:
        return None if units is None else in_float(units, unit)

    used = cap.used_epsilon_units
    return DatasetBudget(
        dataset_id,
        name,
        epsilon=amount(cap.epsilon_units, EPSILON_UNIT),
        delta=amount(cap.delta_units, DELTA_UNIT),
        epsilon_used=None if used is None else in_float(used, EPSILON_UNIT),
        delta_used=in_float(cap.used_delta_units, DELTA_UNIT),
        epsilon_remaining=None
        if cap.epsilon_units is None
        else in_float(cap.remaining_epsilon_units, EPSILON_UNIT),
        delta_remaining=None
        if cap.delta_units is None
        else in_float(cap.remaining_delta_units, DELTA_UNIT),
        renews_at=cap.renews_at,
    )


def budgets_of(
    session: Session, settings: Settings, named: Mapping[int, str]
) -> dict[int, DatasetBudget]:
    """Each dataset's cap and use (``named``: id -> name), under the policy in force now.

    No visibility check: the caller decides who sees it (:func:`may_see`).
    """
    if not named:
        return {}
    in_force = policy_service.current(session)
    at = utcnow()
    request = policies.PublishRequest(at, datasets={name: i for i, name in named.items()})
    charges = _load(session, in_force.policy, request, _NOBODY).charges
    defaults = _defaults(settings)
    return {
        i: _of(
            i,
            name,
            policies.cap_status(in_force.policy, name, i, charges, at=at, defaults=defaults),
        )
        for i, name in named.items()
    }


def visible_budgets(
    session: Session, settings: Settings, viewer: User | None, ids: Iterable[int]
) -> dict[int, DatasetBudget]:
    """The caps of the datasets ``ids`` that ``viewer`` may see (:func:`may_see`), by id."""
    rows = session.scalars(select(Dataset).where(Dataset.id.in_(sorted(set(ids))))).all()
    return budgets_of(session, settings, {d.id: d.name for d in rows if may_see(viewer, d)})


def dataset_budget(
    session: Session, settings: Settings, actor: User | None, dataset: Dataset
) -> DatasetBudget:
    """The cap of ``dataset`` and its use, for its owner or an admin.

    Raises:
        PermissionDeniedError: ``actor`` is neither (the figure tells how much others
            queried the dataset).
    """
    if not may_see(actor, dataset):
        raise PermissionDeniedError(
            f"only the owner of dataset {dataset.name!r} and admins may see how much of its "
            "cap is used; your own spending is in client.budget()"
        )
    return budgets_of(session, settings, {dataset.id: dataset.name})[dataset.id]

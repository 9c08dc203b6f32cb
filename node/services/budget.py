"""The privacy budget: an append-only ledger and a check that cannot be raced.

Amounts are kept as whole numbers of small units — epsilon and rho in 1e-9, a
sampler's total-variation deviation in 1e-30 (about 1e-29 per value noised) — so that sums are exact
and a budget of 1.0 pays for exactly ten charges of 0.1. A requested amount is
rounded *down* to the unit grid before the mechanism is calibrated to it
(``quantize_epsilon``), and amounts the node derives (rho, a sampler's deviation)
are rounded *up*: the charge is never less than the privacy actually spent.
Pure epsilons are checked exactly in units; releases with a rho or a sampler
deviation go through the privacy filter of ``node.dp.accounting`` as well.

The check, the ledger row and the decision to release happen in one transaction
that is serialised per user: ``BEGIN IMMEDIATE`` on SQLite, a row lock on the
user on PostgreSQL. A result may leave the node only after that commit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from node.db.models import LedgerEntry, User
from node.dp import accounting
from node.dp.accounting import Charge
from node.errors import BudgetExceededError, InvalidRequestError, NotFoundError
from node.services import audit
from node.settings import Settings

EPSILON_UNIT = Fraction(1, 10**9)
RHO_UNIT = Fraction(1, 10**9)
TV_UNIT = Fraction(1, 10**30)
DELTA_UNIT = Fraction(1, 10**18)


def units_down(value: float, unit: Fraction, what: str) -> int:
    """``value`` in whole units, rounded down (for amounts a person asks for or configures).

    A person's ``0.1`` means the decimal 0.1, so the shortest decimal that round-trips
    the float is used; the mechanism is then calibrated to exactly the charged amount.

    >>> units_down(0.1, EPSILON_UNIT, "epsilon"), units_down(1e-6, DELTA_UNIT, "delta")
    (100000000, 1000000000000)
    """
    _check_amount(value, what)
    return math.floor(Fraction(Decimal(repr(float(value)))) / unit)


def units_up(value: float, unit: Fraction, what: str) -> int:
    """``value`` in whole units, rounded up (for amounts the node derives).

    >>> units_up(1e-35, TV_UNIT, "sampler deviation")
    1
    """
    _check_amount(value, what)
    return math.ceil(Fraction(value) / unit)


def _check_amount(value: float, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidRequestError(f"{what} must be a finite number >= 0, got {value!r}")


def quantize_epsilon(epsilon: float) -> Fraction:
    """The epsilon a mechanism is calibrated to and charged: ``epsilon`` rounded down to
    the ledger's unit, refused when nothing is left.

    >>> quantize_epsilon(0.5)
    Fraction(1, 2)
    """
    units = units_down(epsilon, EPSILON_UNIT, "epsilon")
    if units == 0:
        raise InvalidRequestError(f"epsilon must be at least 1e-9, got {epsilon!r}")
    return units * EPSILON_UNIT


@dataclass(frozen=True)
class Cost:
    """What one release costs, in ledger units."""

    mechanism: str
    epsilon_units: int = 0
    rho_units: int = 0
    tv_units: int = 0
    dataset_ids: Sequence[int] = ()
    graph_hash: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Budget:
    """A user's allowance and what is spent of it, in ledger units."""

    epsilon_units: int
    delta_units: int
    spent_epsilon_units: int
    spent_rho_units: int
    spent_tv_units: int

    @property
    def epsilon(self) -> float:
        return float(self.epsilon_units * EPSILON_UNIT)

    @property
    def delta(self) -> float:
        return float(self.delta_units * DELTA_UNIT)

    def _charge(self) -> Charge:
        return Charge(
            epsilon=float(self.spent_epsilon_units * EPSILON_UNIT),
            rho=float(self.spent_rho_units * RHO_UNIT),
            tv=float(self.spent_tv_units * TV_UNIT),
        )

    def spent(self) -> tuple[float, float]:
        """(epsilon, delta) used so far, as the privacy filter counts them."""
        return accounting.spent([self._charge()], epsilon=self.epsilon, delta=self.delta)

    def fits(self, cost: Cost) -> bool:
        """Whether ``cost`` keeps the user within the budget (fully adaptive filter)."""
        if self.spent_epsilon_units + cost.epsilon_units > self.epsilon_units:
            return False  # pure epsilons are compared exactly, in units
        if self.spent_rho_units + cost.rho_units + self.spent_tv_units + cost.tv_units == 0:
            return True
        new = Charge(
            epsilon=float(cost.epsilon_units * EPSILON_UNIT),
            rho=float(cost.rho_units * RHO_UNIT),
            tv=float(cost.tv_units * TV_UNIT),
        )
        return accounting.fits([self._charge()], new, epsilon=self.epsilon, delta=self.delta)

    @property
    def remaining_epsilon(self) -> float:
        return max(0.0, self.epsilon - self.spent()[0])

    def describe(self) -> str:
        return f"remaining budget: epsilon {self.remaining_epsilon:.9g} (delta {self.delta:.3g})"


def _allowance(settings: Settings) -> tuple[int, int]:
    return (
        units_down(settings.default_epsilon_budget, EPSILON_UNIT, "epsilon budget"),
        units_down(settings.default_delta_budget, DELTA_UNIT, "delta budget"),
    )


def budget_of(session: Session, settings: Settings, user_id: int) -> Budget:
    """The user's budget as the ledger stands in this transaction."""
    spent = session.execute(
        select(
            func.coalesce(func.sum(LedgerEntry.epsilon_units), 0),
            func.coalesce(func.sum(LedgerEntry.rho_units), 0),
            func.coalesce(func.sum(LedgerEntry.tv_units), 0),
        ).where(LedgerEntry.user_id == user_id)
    ).one()
    epsilon_units, delta_units = _allowance(settings)
    return Budget(epsilon_units, delta_units, int(spent[0]), int(spent[1]), int(spent[2]))


def charge(
    serial_sessions: sessionmaker[Session], settings: Settings, user_id: int, cost: Cost
) -> tuple[LedgerEntry, Budget]:
    """Check the cost against the user's budget and record it, atomically.

    ``serial_sessions`` must be bound to ``node.db.session.serial_engine``. Returns the
    committed ledger row and the budget after it.

    Raises:
        BudgetExceededError: the cost does not fit; nothing is recorded.
        NotFoundError: no such user.
    """
    with serial_sessions() as session:
        lock = select(User).where(User.id == user_id)
        if session.get_bind().dialect.name != "sqlite":
            lock = lock.with_for_update()
        user = session.scalar(lock)
        if user is None:
            raise NotFoundError(f"no user with id {user_id}")
        before = budget_of(session, settings, user_id)
        if not before.fits(cost):
            session.rollback()
            asked = float(cost.epsilon_units * EPSILON_UNIT)
            raise BudgetExceededError(
                f"this release costs epsilon {asked:.9g} and does not fit: {before.describe()}"
            )
        entry = LedgerEntry(
            user_id=user_id,
            mechanism=cost.mechanism,
            epsilon_units=cost.epsilon_units,
            rho_units=cost.rho_units,
            tv_units=cost.tv_units,
            dataset_ids=list(cost.dataset_ids),
            graph_hash=cost.graph_hash,
            detail=cost.detail,
        )
        session.add(entry)
        session.flush()
        audit.record(
            session,
            user,
            "privacy.charge",
            target_type="ledger",
            target_id=entry.id,
            mechanism=cost.mechanism,
            epsilon_units=cost.epsilon_units,
            rho_units=cost.rho_units,
            tv_units=cost.tv_units,
            datasets=list(cost.dataset_ids),
        )
        session.commit()
        after = Budget(
            before.epsilon_units,
            before.delta_units,
            before.spent_epsilon_units + cost.epsilon_units,
            before.spent_rho_units + cost.rho_units,
            before.spent_tv_units + cost.tv_units,
        )
        return entry, after


def ledger_of(session: Session, user_id: int, *, limit: int = 100) -> list[LedgerEntry]:
    """The user's charges, newest first."""
    query = (
        select(LedgerEntry)
        .where(LedgerEntry.user_id == user_id)
        .order_by(LedgerEntry.id.desc())
        .limit(limit)
    )
    return list(session.scalars(query))

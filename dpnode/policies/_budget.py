"""Allocations and the budget arithmetic: what a user (or a dataset) may spend, and what fits.

A limit is ``(epsilon, delta)`` in ledger units. Its delta is split once, in advance, by the
policy's ``zcdp_delta_share``: ``delta_z = floor(delta * share)`` converts the zCDP total and
the rest pays for deltas charged directly. With ``E``, ``D``, ``R`` the pure epsilon, direct delta
and rho spent (in the period, plus the request), a charge fits when

* ``E + rho_to_epsilon(R, delta_z) <= epsilon`` (converted rounded up; no rho without a delta),
* ``D <= delta - delta_z``.

Fixing the split in advance keeps the combination sound under adaptive requests: which releases
are pure and which Gaussian may depend on earlier results, but the delta each part may use does
not (see :mod:`dpnode.policies._conversion` for the epsilon side).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from fractions import Fraction
from functools import cached_property

from dpnode.policies._conversion import RhoToEpsilon, converted_units
from dpnode.policies._document import ROLES, Amounts, Policy
from dpnode.policies._periods import as_utc
from dpnode.policies._records import Allowance, Charge, Grant, User
from dpnode.policies._units import decimal, delta_units, epsilon_units

__all__ = ["Allocation", "Limit", "Spent", "allocation_for", "apply_grant"]


@dataclass(frozen=True)
class Spent:
    """Sums of charges, in ledger units."""

    epsilon_units: int = 0
    delta_units: int = 0
    rho_units: int = 0

    @classmethod
    def of(cls, charges: Iterable[Charge]) -> Spent:
        """The sums over ``charges``.

        >>> from datetime import UTC, datetime
        >>> at = datetime(2026, 1, 1, tzinfo=UTC)
        >>> Spent.of([Charge(at, 1, (), 5, 1, 0), Charge(at, 1, (), 0, 0, 7)])
        Spent(epsilon_units=5, delta_units=1, rho_units=7)
        """
        e = d = r = 0
        for c in charges:
            e, d, r = e + c.epsilon_units, d + c.delta_units, r + c.rho_units
        return cls(e, d, r)

    def __add__(self, other: Spent) -> Spent:
        return Spent(
            self.epsilon_units + other.epsilon_units,
            self.delta_units + other.delta_units,
            self.rho_units + other.rho_units,
        )


@dataclass(frozen=True)
class Limit:
    """An epsilon and delta ceiling; ``None`` leaves that side unlimited.

    ``share`` is the policy's ``zcdp_delta_share`` as the exact decimal it was written as.
    """

    epsilon_units: int | None
    delta_units: int | None
    share: Fraction

    @classmethod
    def for_policy(cls, policy: Policy, epsilon: int | None, delta: int | None) -> Limit:
        """A limit under ``policy``'s delta split."""
        return cls(epsilon, delta, decimal(policy.zcdp_delta_share))

    @cached_property
    def conversion_delta_units(self) -> int:
        """``delta_z``: the delta reserved for converting rho."""
        if self.delta_units is None:
            return 0
        share = self.share  # floor(delta * share) in integers: exact, and no Fraction built
        return self.delta_units * share.numerator // share.denominator

    def epsilon_used(self, spent: Spent, convert: RhoToEpsilon) -> int | None:
        """Pure epsilon plus converted rho; ``None`` when rho cannot be converted at all."""
        converted = converted_units(spent.rho_units, self.conversion_delta_units, convert)
        return None if converted is None else spent.epsilon_units + converted

    def epsilon_fits(self, spent: Spent, convert: RhoToEpsilon) -> bool:
        """Whether ``spent`` is within the epsilon side."""
        if self.epsilon_units is None:
            return True
        used = self.epsilon_used(spent, convert)
        return used is not None and used <= self.epsilon_units

    def delta_fits(self, spent: Spent) -> bool:
        """Whether ``spent``'s direct delta is within the delta side."""
        if self.delta_units is None:
            return True
        return spent.delta_units <= self.delta_units - self.conversion_delta_units

    def remaining(self, spent: Spent, convert: RhoToEpsilon) -> tuple[int, int]:
        """What is left after ``spent``: (epsilon units, direct delta units), never negative.

        An unlimited side reports ``-1``.
        """
        epsilon = -1
        if self.epsilon_units is not None:
            used = self.epsilon_used(spent, convert)
            epsilon = 0 if used is None else max(0, self.epsilon_units - used)
        delta = -1
        if self.delta_units is not None:
            direct = self.delta_units - self.conversion_delta_units
            delta = max(0, direct - spent.delta_units)
        return epsilon, delta


@dataclass(frozen=True)
class Allocation:
    """A user's budget per period, with the rule each side comes from and the grants on top."""

    epsilon_units: int
    delta_units: int
    epsilon_rule: str
    delta_rule: str
    grants: tuple[Grant, ...] = ()


def apply_grant(allocation: Allocation, grant: Grant) -> Allocation:
    """Add an approved budget request to an allocation, keeping it in the grant history.

    >>> from datetime import UTC, datetime
    >>> base = Allocation(10, 5, "roles.data_scientist.epsilon", "defaults.delta")
    >>> after = apply_grant(base, Grant(datetime(2026, 1, 1, tzinfo=UTC), 3, 1, by="admin@x"))
    >>> after.epsilon_units, after.delta_units, len(after.grants)
    (13, 6, 1)
    """
    return replace(
        allocation,
        epsilon_units=allocation.epsilon_units + grant.epsilon_units,
        delta_units=allocation.delta_units + grant.delta_units,
        grants=(*allocation.grants, grant),
    )


def allocation_for(
    policy: Policy, user: User, *, defaults: Allowance, at: datetime | None = None
) -> Allocation:
    """The user's allocation per period: the user's override, else the role's, else the node's
    default, side by side for epsilon and delta; plus every grant made at or before ``at``
    (all of them when ``at`` is None), in time order.

    >>> from dpnode.policies._document import load_policy
    >>> p = load_policy('[roles.data_scientist]\\nepsilon = 2.0')
    >>> a = allocation_for(p, User(1, "a@x", "data_scientist"), defaults=Allowance(10, 7))
    >>> a.epsilon_units, a.epsilon_rule, a.delta_units, a.delta_rule
    (2000000000, 'roles.data_scientist.epsilon', 7, 'defaults.delta')
    """
    email = user.email.strip().lower()
    override = policy.users.get(email)
    role: Amounts | None = getattr(policy.roles, user.role) if user.role in ROLES else None
    epsilon, epsilon_rule = defaults.epsilon_units, "defaults.epsilon"
    delta, delta_rule = defaults.delta_units, "defaults.delta"
    for source, amounts in ((f"roles.{user.role}", role), (f"users.{email}", override)):
        if amounts is None:
            continue
        if amounts.epsilon is not None:
            epsilon, epsilon_rule = epsilon_units(amounts.epsilon), f"{source}.epsilon"
        if amounts.delta is not None:
            delta, delta_rule = delta_units(amounts.delta), f"{source}.delta"
    allocation = Allocation(epsilon, delta, epsilon_rule, delta_rule)
    cutoff = None if at is None else as_utc(at)
    for grant in sorted(user.grants, key=lambda g: g.at):
        if cutoff is None or grant.at <= cutoff:
            allocation = apply_grant(allocation, grant)
    return allocation

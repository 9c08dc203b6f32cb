"""A dataset's lifetime (or renewing) cap: its limit, and what all users together spent of it.

The ``datasets`` rule (:mod:`dpnode.policies._rules`) decides with these; the node shows them
to a dataset's owner and to admins (``client.dataset(...).budget()``, the console's catalog,
``dpnode dataset show``), so the figure shown is the figure that decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from dpnode.policies._budget import Limit, Spent
from dpnode.policies._conversion import RhoToEpsilon, filter_epsilon
from dpnode.policies._document import DatasetCap, Policy
from dpnode.policies._records import Allowance, Charge
from dpnode.policies._units import delta_units, epsilon_units

__all__ = ["CapStatus", "cap_limit", "cap_spent", "cap_status"]


def cap_limit(policy: Policy, cap: DatasetCap, defaults: Allowance) -> tuple[Limit, bool]:
    """The cap's limit, and whether its delta is the node's default (a cap on epsilon alone
    promises ``(max_epsilon, the node's default delta)``)."""
    epsilon = None if cap.max_epsilon is None else epsilon_units(cap.max_epsilon)
    delta = None if cap.max_delta is None else delta_units(cap.max_delta)
    implicit = delta is None and epsilon is not None
    if implicit:
        delta = defaults.delta_units
    return Limit.for_policy(policy, epsilon, delta), implicit


def cap_spent(cap: DatasetCap, dataset_id: int, charges: Iterable[Charge], at: datetime) -> Spent:
    """What ``charges`` spent on the dataset in the cap's window at ``at`` (ever, if it
    never renews)."""
    period = None if cap.renewal is None else cap.renewal.period()
    return Spent.of(
        c
        for c in charges
        if dataset_id in c.dataset_ids and (period is None or period.counts_at(at, c.at))
    )


@dataclass(frozen=True)
class CapStatus:
    """A dataset's cap and its use, in ledger units (``None``: that side is not capped;
    ``used_epsilon_units`` ``None``: a rho that no delta converts, so the cap admits none)."""

    epsilon_units: int | None
    delta_units: int | None
    used_epsilon_units: int | None
    used_delta_units: int
    remaining_epsilon_units: int
    remaining_delta_units: int
    #: when the window renews (``None``: never, the cap is for the dataset's lifetime)
    renews_at: datetime | None


def cap_status(
    policy: Policy,
    name: str,
    dataset_id: int,
    charges: Iterable[Charge],
    *,
    at: datetime,
    defaults: Allowance,
    convert: RhoToEpsilon = filter_epsilon,
) -> CapStatus | None:
    """The cap ``policy`` puts on the dataset called ``name`` and what ``charges`` (everyone's
    rows that read it) spent of it at ``at``; ``None`` when the policy caps it not.

    The delta used counts the share reserved for converting rho once any rho was spent, as a
    user's budget does (``remaining`` and ``used`` add up to the cap).
    """
    cap = policy.datasets.get(name)
    if cap is None or (cap.max_epsilon is None and cap.max_delta is None):
        return None
    limit, _ = cap_limit(policy, cap, defaults)
    spent = cap_spent(cap, dataset_id, charges, at)
    left_epsilon, left_delta = limit.remaining(spent, convert)
    reserved = limit.conversion_delta_units if spent.rho_units else 0
    renews = None if cap.renewal is None else cap.renewal.period().window(at)[1]
    return CapStatus(
        epsilon_units=limit.epsilon_units,
        delta_units=limit.delta_units,
        used_epsilon_units=limit.epsilon_used(spent, convert),
        used_delta_units=spent.delta_units + reserved,
        remaining_epsilon_units=left_epsilon,
        remaining_delta_units=left_delta,
        renews_at=renews,
    )

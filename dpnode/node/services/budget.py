"""The privacy budget: an append-only ledger and a check that cannot be raced.

Amounts are kept as whole numbers of small units — epsilon and rho in 1e-9, delta in
1e-18 — so that sums are exact and a budget of 1.0 pays for exactly ten charges of 0.1. A
requested amount is rounded *down* to the unit grid before the mechanism is calibrated to
it (``quantize_epsilon``), and amounts the node derives (rho, what a sampler's deviation
costs) are rounded *up*: the charge is never less than the privacy actually spent.

Whether a release may run is the budget policy's decision (:func:`policies.decide`, pure):
the node builds the user (with their grants), the request and the relevant ledger rows,
and writes the ledger row the decision grants. A sampler's deviation is costed once, at the
release's own parameters (:func:`sampler_units`, the terms of ``dpnode.core.dp.accounting``):
never at the user's allocation or a dataset's cap, so that any allocation works alike. A
Laplace release pays ``(1 + e^epsilon) tv`` as delta; a Gaussian one a delta and a small
epsilon. The ledger's ``tv_units`` column holds that delta, in delta units (rows written
before it did held the raw deviation in units of 1e-30, which reading them as delta units
over-counts a trillion-fold: the safe direction).

The decision, the ledger row and the decision to release happen in one transaction that is
serialised: ``BEGIN IMMEDIATE`` on SQLite; on PostgreSQL row locks on the user and then on
every dataset the release reads, in id order, so that a dataset's cap across all users
holds under concurrency. A result may leave the node only after that commit.

That transaction is on every publish's path, so it reads the ledger as a few sums with
statements built once (all of a user's rows, under a policy without renewal, as the one-row
total the database keeps: ``dpnode.node.db.models.LedgerTotal``), writes its three rows (ledger,
datasets read, audit) as plain INSERTs, and derives the budget after the charge from the
sums it read plus the new row instead of reading them again (tests/node/test_budget_after.py
checks they agree). It runs on a bare connection: an ORM session, whose work around a
transaction costs more than the charge's statements, joins it only on the rare paths that
need one (:class:`_Transaction`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, and_, bindparam, func, insert, or_, select
from sqlalchemy.orm import Session, sessionmaker

from dpnode import policies
from dpnode.core.dp import accounting
from dpnode.core.dp.mechanisms import float_at_least
from dpnode.core.errors import (
    AuthenticationError,
    BudgetExceededError,
    InvalidRequestError,
    NotFoundError,
    PolicyRefusedError,
)
from dpnode.node.db.base import table_of, utcnow
from dpnode.node.db.direct import Direct, connection_of
from dpnode.node.db.models import (
    BudgetGrant,
    Dataset,
    LedgerEntry,
    LedgerEntryDataset,
    LedgerTotal,
    Role,
    User,
)
from dpnode.node.services import approvals, audit, idempotency, users
from dpnode.node.services import policy as policy_service
from dpnode.node.services.policy import InForce
from dpnode.node.settings import Settings
from dpnode.policies import in_float

EPSILON_UNIT = Fraction(1, 10**9)
RHO_UNIT = Fraction(1, 10**9)
#: Unit of the raw deviation a release reports (``Cost.tv_units``): fine enough that a release
#: of a single value at a large epsilon is not charged for rounding.
TV_UNIT = Fraction(1, 10**40)
DELTA_UNIT = Fraction(1, 10**18)


def units_down(value: float, unit: Fraction, what: str) -> int:
    """``value`` in whole units, rounded down (for amounts a person asks for or configures).

    A person's ``0.1`` means the decimal 0.1, so the shortest decimal that round-trips
    the float is used; the mechanism is then calibrated to exactly the charged amount.

    >>> units_down(0.1, EPSILON_UNIT, "epsilon"), units_down(1e-6, DELTA_UNIT, "delta")
    (100000000, 1000000000000)
    """
    return math.floor(_decimal(value, what) / unit)


def delta_asked_units(delta: float) -> int:
    """The delta a release promises, in whole units rounded up: what per-publish caps and
    approval thresholds compare (a Gaussian is calibrated to the delta asked, so one below
    the unit promises more than nothing). The decimal the person wrote, as in
    :func:`units_down`.

    >>> delta_asked_units(9e-19), delta_asked_units(3e-6)
    (1, 3000000000000)
    """
    return math.ceil(_decimal(delta, "delta") / DELTA_UNIT)


def _decimal(value: float, what: str) -> Fraction:
    _check_amount(value, what)
    return policies.decimal(value)


def units_up(value: float, unit: Fraction, what: str) -> int:
    """``value`` in whole units, rounded up (for amounts the node derives).

    >>> units_up(1e-45, TV_UNIT, "sampler deviation")
    1
    """
    _check_amount(value, what)
    return math.ceil(Fraction(value) / unit)


def _check_amount(value: float, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise InvalidRequestError(f"{what} must be a finite number >= 0, got {value!r}")


@lru_cache(maxsize=256, typed=True)  # a publish reads it thrice; typed: True is no epsilon
def quantize_epsilon(epsilon: float) -> Fraction:
    """The epsilon a mechanism is calibrated to and charged: ``epsilon`` rounded down to
    the ledger's unit, refused when nothing is left.

    >>> quantize_epsilon(0.5)
    Fraction(1, 2)
    """
    units = units_down(epsilon, EPSILON_UNIT, "epsilon")
    if units == 0:
        raise InvalidRequestError(f"epsilon must be at least 1e-9, got {epsilon!r}")
    check_epsilon_size(epsilon)
    return units * EPSILON_UNIT


#: The largest epsilon a publish, a request or a grant may name: far beyond any meaningful
#: guarantee, and small enough that ledger sums stay within a 64-bit column.
MAX_EPSILON = 1e6


def check_epsilon_size(epsilon: float, what: str = "epsilon") -> None:
    """Refuse an epsilon above :data:`MAX_EPSILON`.

    >>> check_epsilon_size(1e7)
    Traceback (most recent call last):
    ...
    dpnode.core.errors.InvalidRequestError: epsilon must be at most 1e+06, got 10000000.0
    """
    if epsilon > MAX_EPSILON:
        raise InvalidRequestError(f"{what} must be at most {MAX_EPSILON:g}, got {epsilon!r}")


@dataclass(frozen=True)
class Cost:
    """What one release costs, in ledger units, and what it asked for.

    ``asked_epsilon_units`` / ``asked_delta_units`` are the release's own guarantee, which
    per-publish caps and approval thresholds compare against (for a Laplace release the
    epsilon charged; for a Gaussian one the (epsilon, delta) it was calibrated to, while
    ``rho_units`` is what is charged). ``tv_units`` is the noise's raw deviation
    (``Release.sampler_tv`` in :data:`TV_UNIT`, rounded up), which :func:`sampler_units`
    turns into what the release is charged for it. ``frame_hash`` identifies the exact
    computation, so that an approval covers that computation and no other.
    """

    mechanism: str
    epsilon_units: int = 0
    rho_units: int = 0
    tv_units: int = 0
    dataset_ids: Sequence[int] = ()
    graph_hash: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    asked_epsilon_units: int | None = None
    asked_delta_units: int = 0
    #: The hash, or a function computing it: only a policy with approval thresholds asks.
    frame_hash: str | Callable[[], str] | None = None
    #: The approved training run this publish says it is a step of (``dpnode.node.services.runs``).
    run_id: int | None = None

    @property
    def asked_epsilon(self) -> int:
        if self.asked_epsilon_units is not None:
            return self.asked_epsilon_units
        return self.epsilon_units


@dataclass(frozen=True)
class Status:
    """A user's budget under the policy in force, at one instant (after a charge, or now).

    ``spent()`` is the epsilon used (pure plus converted zCDP) and the delta used of the
    current window, as the privacy filter counts them: the deltas charged directly (the
    samplers') and, once any rho was charged, the share ``delta_z`` the rho total is
    converted at. ``remaining_epsilon`` and ``remaining_delta`` are what is left of the
    allocation after exactly that, so spent and remaining add up to the allocation.
    ``spent_tv_units`` is the samplers' delta in :data:`TV_UNIT` (the API's ``sampler_tv``).
    """

    in_force: InForce
    status: policies.BudgetStatus
    conversion_delta_units: int
    spent_tv_units: int

    @property
    def epsilon(self) -> float:
        return in_float(self.status.allocation.epsilon_units, EPSILON_UNIT)

    @property
    def delta(self) -> float:
        return in_float(self.status.allocation.delta_units, DELTA_UNIT)

    def used_units(self, used: policies.Spent | None = None) -> tuple[int | None, int]:
        """(epsilon, delta) units ``used`` (default: this window's) counts for, as the filter
        counts them; epsilon ``None`` where a rho cannot be converted at all."""
        used = self.status.spent if used is None else used
        a = self.status.allocation
        limit = policies.Limit.for_policy(self.in_force.policy, None, a.delta_units)
        reserved = self.conversion_delta_units if used.rho_units else 0
        return limit.epsilon_used(used, policies.filter_epsilon), used.delta_units + reserved

    @cached_property
    def _used(self) -> tuple[int | None, int]:
        """:meth:`used_units` of this window, worked out once (a receipt reads it thrice)."""
        return self.used_units()

    def spent(self) -> tuple[float, float]:
        """(epsilon, delta) used in the current window, as the privacy filter counts them."""
        epsilon, delta = self._used
        return math.inf if epsilon is None else in_float(epsilon, EPSILON_UNIT), in_float(
            delta, DELTA_UNIT
        )

    @property
    def remaining_epsilon(self) -> float:
        return in_float(self.status.remaining.epsilon_units, EPSILON_UNIT)

    @property
    def remaining_delta(self) -> float:
        """The allocation's delta less what :meth:`spent` counts (never negative)."""
        _, delta = self._used
        return in_float(max(0, self.status.allocation.delta_units - delta), DELTA_UNIT)

    @property
    def sampler_delta(self) -> float:
        """The samplers' deltas in the current window (part of :meth:`spent`'s delta)."""
        return in_float(self.status.spent.delta_units, DELTA_UNIT)

    def describe(self) -> str:
        return self.status.remaining.describe()


#: Raw-deviation units in one delta unit.
_TV_PER_DELTA = int(DELTA_UNIT / TV_UNIT)
#: A delta of 1 in units: more than any budget has, so a charge this large never fits.
_WHOLE_DELTA = int(1 / DELTA_UNIT)


def _tv_delta_units(tv_units: int, epsilon_units: int) -> int:
    """A Laplace release's deviation as delta, ``(1 + e^epsilon) tv`` rounded up to a delta
    unit, at the release's own ``epsilon``; at most a whole delta (which no budget has).

    A mechanism within total variation ``tv`` of an epsilon-DP one is
    (epsilon, (1 + e^epsilon) tv)-DP.

    >>> _tv_delta_units(10**10, 10**9), _tv_delta_units(10**25, 10**9)  # 1e-30, 1e-15 at 1
    (1, 3719)
    """
    if tv_units == 0:
        return 0
    epsilon = in_float(epsilon_units, EPSILON_UNIT)
    if epsilon > 700:  # e^epsilon overflows: far beyond any budget's delta
        return _WHOLE_DELTA
    factor = math.nextafter(math.exp(math.nextafter(epsilon, math.inf)), math.inf)
    # ceil((1 + p/q) tv TV_UNIT / DELTA_UNIT) in integers: exact, and a tenth of the time of
    # Fractions on every publish (tests/node/test_budget_units.py compares the two).
    p, q = factor.as_integer_ratio()
    return min(_WHOLE_DELTA, -(-(q + p) * tv_units // (q * _TV_PER_DELTA)))


def gaussian_count(tv_units: int) -> int:
    """How many values a Gaussian release noised, from its deviation: every Gaussian plan
    reports :data:`dpnode.core.dp.accounting.GAUSSIAN_TV` per value (at least 1 if ``tv_units``).

    >>> gaussian_count(units_up(21 * accounting.GAUSSIAN_TV, TV_UNIT, "tv")), gaussian_count(0)
    (21, 0)
    """
    if tv_units == 0:
        return 0
    per_value = Fraction(accounting.GAUSSIAN_TV) / TV_UNIT
    return max(1, math.floor(tv_units / per_value))


def _units_capped(value: float, unit: Fraction) -> int:
    if not value < float(_WHOLE_DELTA * DELTA_UNIT):  # inf, or a delta of 1 or more
        return math.ceil(Fraction(1) / unit)
    return units_up(value, unit, "sampler cost")


def sampler_units(cost: Cost) -> tuple[int, int]:
    """(epsilon, delta) units a release's sampler deviation costs, at its own parameters.

    A Laplace release (no rho): delta ``(1 + e^epsilon) tv`` (:func:`_tv_delta_units`). A
    Gaussian release: ``dpnode.core.dp.accounting.gaussian_sampler_terms`` for its rho and the
    number
    of values its ``tv`` says, ``ξ`` as epsilon and ``δ`` as delta. Each rounded up; a cost no
    budget could cover comes out as a whole delta (1), which no allocation holds.

    >>> sampler_units(Cost("laplace", 10**9, tv_units=10**10))
    (0, 1)
    >>> rho_half = Cost("gaussian", rho_units=5 * 10**8, tv_units=units_up(2.0**-96, TV_UNIT, "tv"))
    >>> sampler_units(rho_half)
    (3, 1)
    """
    if cost.tv_units == 0:
        return 0, 0
    if cost.rho_units == 0:
        return 0, _tv_delta_units(cost.tv_units, cost.epsilon_units)
    rho = float_at_least(cost.rho_units * RHO_UNIT)
    xi, delta = accounting.gaussian_sampler_terms(rho, gaussian_count(cost.tv_units))
    return _units_capped(xi, EPSILON_UNIT), _units_capped(delta, DELTA_UNIT)


def receipt_terms(
    entry: Charged, after: Status, *, asked_epsilon: float, asked_delta: float | None
) -> dict[str, Any]:
    """The budget fields of a publish's receipt, from what :func:`charge` returned.

    ``epsilon`` and ``delta`` are what this release took from the user's budget, in the
    user's own terms: how much the spent epsilon and delta of :meth:`Status.spent` grew with
    this row, under the filter's own conversion (so the remaining epsilon fell by exactly
    ``epsilon``). For a Laplace release that is the epsilon asked and its sampler's delta;
    for a Gaussian one the growth of the converted rho total (the first one also commits the
    delta ``delta_z`` the rho total is converted at). ``asked_epsilon`` / ``asked_delta`` are
    what the publish asked for (epsilon as the mechanism used it, rounded down to the
    ledger's unit), ``rho`` the zCDP charged, ``sampler_delta`` and ``sampler_epsilon`` what
    the sampler's deviation cost (part of ``delta`` and ``epsilon``); ``spent_*`` and
    ``remaining_*`` are the budget after the release, as ``client.budget()`` reads it.
    """
    used = after.status.spent
    before = policies.Spent(
        used.epsilon_units - entry.epsilon_units,
        used.delta_units - entry.tv_units,
        used.rho_units - entry.rho_units,
    )
    eps_before, delta_before = after.used_units(before)
    eps_after, delta_after = after._used
    charged = None if eps_after is None or eps_before is None else eps_after - eps_before
    spent_epsilon, spent_delta = after.spent()
    sampler_epsilon = entry.epsilon_units if entry.rho_units else 0
    return {
        "epsilon": math.inf if charged is None else in_float(charged, EPSILON_UNIT),
        "delta": in_float(delta_after - delta_before, DELTA_UNIT),
        "asked_epsilon": float(quantize_epsilon(asked_epsilon)),
        "asked_delta": asked_delta,
        "rho": in_float(entry.rho_units, RHO_UNIT),
        "sampler_epsilon": in_float(sampler_epsilon, EPSILON_UNIT),
        "sampler_delta": in_float(entry.tv_units, DELTA_UNIT),
        "spent_epsilon": spent_epsilon,
        "spent_delta": spent_delta,
        "remaining_epsilon": after.remaining_epsilon,
        "remaining_delta": after.remaining_delta,
    }


def _defaults(settings: Settings) -> policies.Allowance:
    return _allowance(settings.default_epsilon_budget, settings.default_delta_budget)


@lru_cache(maxsize=16)  # the node's defaults: the same two numbers on every publish
def _allowance(epsilon: float, delta: float) -> policies.Allowance:
    return policies.Allowance.of(epsilon, delta)


_GRANTS = BudgetGrant.__table__
_LEDGER = table_of(LedgerEntry)
_DATASETS = Dataset.__table__
# The statements of every publish, built once: building a statement costs more than running
# it on SQLite (the values are bound per call).
_GRANTS_OF = (
    select(*(_GRANTS.c[k] for k in ("at", "epsilon_units", "delta_units", "granted_by", "reason")))
    .where(_GRANTS.c.user_id == bindparam("user_id"))
    .order_by(_GRANTS.c.id)
)
_SUMS = (
    func.coalesce(func.sum(_LEDGER.c.epsilon_units), 0),
    func.coalesce(func.sum(_LEDGER.c.rho_units), 0),
    func.coalesce(func.sum(_LEDGER.c.tv_units), 0),
    func.max(_LEDGER.c.at),
)
_MINE = select(*_SUMS).where(_LEDGER.c.user_id == bindparam("user_id"))
_MINE_SINCE = _MINE.where(_LEDGER.c.at >= bindparam("since"))
_TOTALS = LedgerTotal.__table__
#: The same as ``_MINE``, kept up to date by the database (``dpnode.node.db.models.LedgerTotal``).
_TOTAL = select(
    _TOTALS.c.epsilon_units, _TOTALS.c.rho_units, _TOTALS.c.tv_units, _TOTALS.c.newest_at
).where(_TOTALS.c.user_id == bindparam("user_id"))
_USERS = User.__table__
#: The account as a charge needs it (a plain row: no ORM object is built).
_USER = select(_USERS.c.id, _USERS.c.email, _USERS.c.role, _USERS.c.is_active).where(
    _USERS.c.id == bindparam("user_id")
)
_USER_DATASETS = (
    select(_DATASETS.c.id, _DATASETS.c.name)
    .where(_DATASETS.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(_DATASETS.c.id)
)
#: The same for one dataset, the usual case (an expanding IN is rendered anew on each call).
_USER_DATASET = select(_DATASETS.c.id, _DATASETS.c.name).where(_DATASETS.c.id == bindparam("id"))
#: The same, locking the rows on PostgreSQL (see :func:`_lock`); the account's on the cursor.
_LOCK_USER = Direct(_USER.with_for_update(key_share=True))
_LOCK_DATASETS = _USER_DATASETS.with_for_update(key_share=True)
_LOCK_DATASET = _USER_DATASET.with_for_update(key_share=True)
#: One dataset's, run on the cursor (:class:`Direct`), by PostgreSQL; several datasets' (an
#: expanding IN), by PostgreSQL.
_DATASET_QUERY = {False: Direct(_USER_DATASET), True: Direct(_LOCK_DATASET)}
_DATASETS_QUERY = {False: _USER_DATASETS, True: _LOCK_DATASETS}


def _of_user(column: Any) -> Any:
    return select(column).where(_TOTALS.c.user_id == bindparam("user_id")).scalar_subquery()


#: What a charge reads after the lock (see :func:`_lock`): the policy revision in force, the
#: user's ledger total (NULLs: no row) and whether any budget was granted to them.
_STATE = (
    *policy_service.NEWEST,
    *(_of_user(_TOTALS.c[k]) for k in ("epsilon_units", "rho_units", "tv_units", "newest_at")),
    select(_GRANTS.c.id).where(_GRANTS.c.user_id == bindparam("user_id")).exists(),
)
_READ_STATE = Direct(select(*_STATE))
#: SQLite: the account and the state in one statement (BEGIN IMMEDIATE serialised it all).
_USER_STATE = Direct(_USER.add_columns(*_STATE))


class Account(NamedTuple):
    """The user a charge is for, as its transaction reads (and locks) the row."""

    id: int
    email: str
    role: Role


def policy_user(
    on: Session | Connection, user: User | Account, *, granted: bool = True
) -> policies.User:
    """``user`` as the policies see it, with every budget grant made to them (none read when
    the caller found none: ``granted`` false)."""
    grants = connection_of(on).execute(_GRANTS_OF, {"user_id": user.id}) if granted else ()
    return policies.User(
        user.id,
        user.email,
        user.role.value,
        tuple(policies.Grant(at, e, d, by=by, reason=why) for at, e, d, by, why in grants),
    )


@dataclass(frozen=True)
class _Ledger:
    """The ledger rows a decision needs (``charges``), and the user's own rows of the current
    period summed in ledger units (``mine``: epsilon, rho, sampler deviation, the newest
    ``at``), from which the budget after a charge follows without reading the ledger again."""

    charges: list[policies.Charge]
    #: All the user's rows of the period unless ``listed``: then those not passed one by one.
    mine: tuple[int, int, int, datetime | None]
    #: Whether ``charges`` passes some of the user's rows one by one (the rate limit's).
    listed: bool
    #: The user's rows in the rate limit's window (0 without a rate limit).
    in_rate_window: int


def _charges(
    session: Session,
    policy: policies.Policy,
    request: policies.PublishRequest,
    user: policies.User,
) -> list[policies.Charge]:
    """The ledger as :func:`policies.decide` needs it, in a few rows whatever its length.

    See :func:`_load`.
    """
    return _load(session, policy, request, user).charges


def _load(
    on: Session | Connection,
    policy: policies.Policy,
    request: policies.PublishRequest,
    user: policies.User,
    total: tuple[int, int, int, datetime | None] | None = None,
) -> _Ledger:
    """The ledger as :func:`policies.decide` needs it, in a few rows whatever its length.

    Rows matter one by one only to the rate limit, and only once the user reached it (the
    newest ``max_publishes`` in its window say when the next publish is free); otherwise
    the ledger enters as sums, each dated by its newest row so that it lands in the same
    renewal window: the user's rows of the current window (counted against the user, no
    dataset), plus zero-cost markers so that the rate limit counts every row of its window,
    and for each capped dataset everyone's rows on it in the cap's window except those
    passed one by one (counted against the dataset, user 0: nobody). Each row's samplers'
    delta is in ``tv_units`` already (costed when it was charged), so sums add up exactly.
    Decisions on these equal decisions on the whole ledger (tests/node/test_budget_scope.py).
    All the user's rows (no renewal, none passed one by one) are read as their total, which
    the database keeps equal to their sum (tests/node/test_ledger_totals.py): ``total`` when
    the caller read it in this transaction (:func:`_lock`).
    """

    def charge(
        at: datetime, who: int, ids: tuple[int, ...], e: int, r: int, delta: int
    ) -> policies.Charge:
        return policies.Charge(at, who, ids, e, delta, r)

    user_id = user.id
    scope = policies.ledger_scope(policy, user, request)
    # A cap names a dataset; count every row that read a dataset of that name, whatever its
    # id (one deleted and uploaded again keeps its cap).
    capped = {
        dataset_id: name
        for name, dataset_id in request.datasets.items()
        if dataset_id in scope.datasets
    }

    def reads(dataset_id: int) -> Any:  # rare (a capped dataset): built per call
        entries = select(LedgerEntryDataset.ledger_id).where(
            or_(
                LedgerEntryDataset.dataset_name == capped[dataset_id],
                # SQLite may give a deleted dataset's id to a new one: ids decide only for
                # charges recorded before names were.
                and_(
                    LedgerEntryDataset.dataset_name.is_(None),
                    LedgerEntryDataset.dataset_id == dataset_id,
                ),
            )
        )
        return LedgerEntry.id.in_(entries)

    connection = connection_of(on)
    period = None if policy.renewal is None else policy.renewal.period()
    since = None if period is None else period.window(request.at)[0]
    found: list[policies.Charge] = []
    listed: list[int] = []  # ids of the rows passed one by one
    extra, extra_at, count = 0, request.at, 0
    limit = policy.rate_limit
    if limit is not None:
        own = select(LedgerEntry).where(LedgerEntry.user_id == user_id)
        # The rate limit needs the count of the user's rows in its window and, once that
        # reaches the limit, the newest max_publishes of them (when the next one is free).
        cutoff = request.at - policies.parse_period(limit.window)
        in_window = own.where(LedgerEntry.at > cutoff)
        count = int(connection.scalar(in_window.with_only_columns(func.count())) or 0)
        if count >= limit.max_publishes:
            newest = in_window.order_by(LedgerEntry.at.desc(), LedgerEntry.id.desc())
            recent = connection.execute(newest.limit(limit.max_publishes)).all()
            listed = [e.id for e in recent]
            found += _listed(connection, recent, capped, charge, user_id)
            extra = count - len(recent)  # in the window, summed below: counted by markers
            if recent:
                extra_at = recent[-1].at
    if since is None and not listed:  # all the user's rows: their total, one row
        if total is None:
            total = _total(connection.execute(_TOTAL, {"user_id": user_id}).first())
        mine = total
    else:
        rest = _MINE if since is None else _MINE_SINCE
        if listed:
            rest = rest.where(_LEDGER.c.id.not_in(listed))
        row = connection.execute(rest, {"user_id": user_id, "since": since}).one()
        mine = _total(row)  # sums of no rows are 0, their newest NULL
    newest_at = mine[3]
    if newest_at is not None:
        found.append(charge(newest_at, user_id, (), *mine[:3]))
        if limit is not None and newest_at > request.at - policies.parse_period(limit.window):
            extra -= 1  # the sum itself sits in the rate window
    # Zero-cost markers, so that the rate limit counts the summed rows of its window too.
    found += [charge(extra_at, user_id, (), 0, 0, 0) for _ in range(max(extra, 0))]
    for dataset_id, cap_since in sorted(scope.datasets.items()):
        touching = select(LedgerEntry).where(reads(dataset_id))
        if cap_since is not None:
            touching = touching.where(LedgerEntry.at >= cap_since)
        if listed:  # not the rows passed one by one above
            touching = touching.where(LedgerEntry.id.not_in(listed))
        eps, rho, tv, newest = connection.execute(touching.with_only_columns(*_SUMS)).one()
        if newest is not None:
            found.append(charge(newest, 0, (dataset_id,), int(eps), int(rho), int(tv)))
    return _Ledger(found, mine, bool(listed), count)


def _listed(
    connection: Connection,
    rows: Sequence[Any],
    capped: dict[int, str],
    charge: Any,
    user_id: int,
) -> list[policies.Charge]:
    """Rows passed one by one (``ledger_entries`` rows), each listing the capped datasets it
    read by name too."""
    named: dict[int, set[int]] = {}
    if capped and rows:
        index = select(LedgerEntryDataset).where(
            LedgerEntryDataset.ledger_id.in_([e.id for e in rows]),
            LedgerEntryDataset.dataset_name.in_(list(capped.values())),
        )
        by_name = {name: dataset_id for dataset_id, name in capped.items()}
        for row in connection.execute(index):
            named.setdefault(row.ledger_id, set()).add(by_name[str(row.dataset_name)])
    return [
        charge(
            e.at,
            user_id,
            tuple(sorted(set(e.dataset_ids) | named.get(e.id, set()))),
            e.epsilon_units,
            e.rho_units,
            e.tv_units,
        )
        for e in rows
    ]


def _status(
    on: Session | Connection,
    settings: Settings,
    in_force: InForce,
    user: policies.User,
    at: datetime,
) -> Status:
    defaults = _defaults(settings)
    ledger = _load(on, in_force.policy, policies.PublishRequest(at), user)
    return _status_of(in_force, user, ledger.charges, at, defaults)


def _status_of(
    in_force: InForce,
    user: policies.User,
    charges: list[policies.Charge],
    at: datetime,
    defaults: policies.Allowance,
) -> Status:
    status = policies.budget_status(in_force.policy, user, charges, at=at, defaults=defaults)
    limit = policies.Limit.for_policy(in_force.policy, None, status.allocation.delta_units)
    # The user's rows of the window carry the samplers' deltas (and nothing else of delta).
    samplers = status.spent.delta_units * _TV_PER_DELTA
    return Status(in_force, status, limit.conversion_delta_units, samplers)


def _after(
    in_force: InForce,
    defaults: policies.Allowance,
    user: policies.User,
    ledger: _Ledger,
    row: policies.Charge,
) -> Status | None:
    """The budget once ``row`` is in the ledger, exactly as :func:`_status` would read it,
    from the sums read for the decision; ``None`` where :func:`_status` passes rows one by
    one (a rate limit reached), which must read them."""
    limit = in_force.policy.rate_limit
    if ledger.listed or (limit is not None and ledger.in_rate_window + 1 >= limit.max_publishes):
        return None
    at = row.at
    epsilon, rho, delta, newest = ledger.mine
    summed = policies.Charge(
        at if newest is None else max(newest, at),
        user.id,
        (),
        epsilon + row.epsilon_units,
        delta + row.delta_units,
        rho + row.rho_units,
    )
    return _status_of(in_force, user, [summed], at, defaults)


def budget_of(session: Session, settings: Settings, user_id: int) -> Status:
    """The user's budget under the policy in force, as the ledger stands in this transaction.

    Raises:
        NotFoundError: no such user.
    """
    user = session.get(User, user_id)
    if user is None:
        raise NotFoundError(f"no user with id {user_id}")
    in_force = policy_service.current(session)
    return _status(session, settings, in_force, policy_user(session, user), utcnow())


def _total(row: Any) -> tuple[int, int, int, datetime | None]:
    """A ledger total as :func:`_load` uses it (no row or NULLs: nothing spent)."""
    if row is None or row[3] is None:
        return (0, 0, 0, None)
    return (int(row[0]), int(row[1]), int(row[2]), row[3])


@dataclass(frozen=True)
class _Locked:
    """What a charging transaction reads first, under the user's lock (:func:`_lock`)."""

    user: Account
    #: the name of each dataset found, by id
    found: dict[int, str]
    in_force: InForce
    #: the user as the policies see it, with their grants
    puser: policies.User
    #: the user's ledger total, for :func:`_load`
    total: tuple[int, int, int, datetime | None]


def _lock(on: Session | Connection, user_id: int, dataset_ids: Sequence[int]) -> _Locked:
    """Lock the user, then the datasets in id order (PostgreSQL; SQLite's BEGIN IMMEDIATE has
    already serialised the whole transaction). Every publish takes its locks in this order,
    so two publishes cannot wait on each other in a cycle. ``FOR NO KEY UPDATE`` serialises
    charges as ``FOR UPDATE`` would, without blocking rows that merely reference the user or
    the dataset (an audit line, a login) meanwhile.

    Then reads the policy in force, the user's grants and ledger total: on PostgreSQL in a
    statement of their own after the lock, whose snapshot has every charge committed before
    the lock was granted (read in the locking statement, they would be as of before its wait:
    a charge committed meanwhile would be missed); on SQLite with the account.

    Raises:
        AuthenticationError: the account no longer exists or was deactivated (whoever asks
            for a charge holds a token for it).
    """
    connection = connection_of(on)
    values = {"user_id": user_id}
    postgres = connection.dialect.name != "sqlite"
    rows = (_LOCK_USER if postgres else _USER_STATE).execute(connection, values)
    if not rows or not rows[0][3]:  # a publish comes with a token: its account is gone
        raise AuthenticationError(users.GONE)
    row = rows[0]
    state: Sequence[Any] = _READ_STATE.execute(connection, values)[0] if postgres else row[4:]
    user = Account(*row[:3])
    found: dict[int, str] = {}
    ids = sorted(set(dataset_ids))
    if len(ids) == 1:
        found = dict(_DATASET_QUERY[postgres].execute(connection, {"id": ids[0]}))
    elif ids:
        several = connection.execute(_DATASETS_QUERY[postgres], {"ids": ids}).all()
        found = {int(ident): str(name) for ident, name in several}
    in_force = policy_service.in_force(connection, (state[0], state[1]))
    puser = policy_user(connection, user, granted=bool(state[6]))
    return _Locked(user, found, in_force, puser, _total(state[2:6]))


def _refusal(decision: policies.Decision, in_force: InForce, **more: Any) -> PolicyRefusedError:
    detail = f"{decision.reason} [policy {in_force.label}, rule {decision.rule}]"
    budget_rules = ("defaults.", "roles.", "users.", "datasets.")
    cls = BudgetExceededError if decision.rule.startswith(budget_rules) else PolicyRefusedError
    return cls(
        detail,
        rule=decision.rule,
        policy=in_force.name,
        policy_revision=in_force.revision,
        reason=decision.reason,
        **more,
    )


@dataclass(frozen=True)
class Charged:
    """The ledger row :func:`charge` wrote, as it wrote it (a ``ledger_entries`` row)."""

    id: int
    at: datetime
    user_id: int
    mechanism: str
    epsilon_units: int
    rho_units: int
    tv_units: int
    dataset_ids: list[int]
    graph_hash: str | None
    detail: dict[str, Any]
    policy_revision: int | None


#: The rows of a charge: every column given (``Direct`` computes no Python default), the
#: ledger row's as :class:`Charged` holds them.
_INSERT_LEDGER = Direct(
    insert(_LEDGER).returning(_LEDGER.c.id), [f.name for f in fields(Charged) if f.name != "id"]
)
_INSERT_READS = Direct(
    insert(table_of(LedgerEntryDataset)), ("ledger_id", "dataset_id", "dataset_name")
)


class _Transaction:
    """A charge's transaction on ``connection``, with an ORM session joined to it for the rare
    paths that need one (approvals, a refusal's audit line), made on first use. The session
    never commits or closes the transaction (a rollback does roll it back): :meth:`commit`
    writes what it holds, then commits."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = Session(
                self.connection, join_transaction_mode="rollback_only", expire_on_commit=False
            )
        return self._session

    def commit(self) -> None:
        if self._session is not None:
            self._session.flush()
        self.connection.commit()


def charge(
    serial_sessions: sessionmaker[Session],
    settings: Settings,
    user_id: int,
    cost: Cost,
    *,
    claim: idempotency.Claim | None = None,
) -> tuple[Charged, Status]:
    """Decide the cost under the policy in force and record it, atomically.

    ``serial_sessions`` must be bound to ``dpnode.node.db.session.serial_engine``. Returns the
    committed ledger row and the budget after it. ``claim``: the publish's idempotency key,
    recorded with the ledger row (a refused charge records none).

    Raises:
        BudgetExceededError: the cost does not fit the user's budget or a dataset's cap;
            nothing is recorded in the ledger. ``rule`` and ``policy_revision`` say which.
        PolicyRefusedError: another rule refused it (per-publish cap, rate limit, denial).
        ApprovalRequiredError: the publish waits for an admin; a pending request is stored.
        AuthenticationError: the account no longer exists or was deactivated.
        NotFoundError: a dataset read was deleted meanwhile; nothing is recorded.
        idempotency.AlreadyClaimed: another request charged ``claim``'s key; nothing is
            recorded (the caller answers with that request's answer).
    """
    # Pure arithmetic on public quantities: done before the serialised transaction.
    sampler_epsilon, sampler_delta = sampler_units(cost)
    serial: Engine = serial_sessions.kw["bind"]
    # On a bare connection (closing it rolls back what is not committed): the ORM only where
    # a rare path needs it (:class:`_Transaction`).
    with serial.connect() as connection:
        connection.begin()
        tx = _Transaction(connection)
        locked = _lock(connection, user_id, cost.dataset_ids)
        user, found, in_force, puser = locked.user, locked.found, locked.in_force, locked.puser

        def refusing() -> None:
            """Before answering with anything but a charge: a copy of this request that
            raced it and was charged (it committed under the user's lock, which this
            transaction now holds) makes its answer this request's. A charge needs no
            look: the key's unique index refuses a second claim (rolling the charge back)."""
            if claim is not None:
                idempotency.ensure_free(connection, user.id, claim)

        at = utcnow()
        missing = sorted(set(cost.dataset_ids) - set(found))
        if missing:  # its metadata may have been known before (publish.KnownDatasets)
            refusing()
            raise NotFoundError(
                f"dataset {missing[0]} was deleted while this publish ran; nothing was released"
            )
        defaults = _defaults(settings)
        names = {name: ident for ident, name in found.items()}
        request = policies.PublishRequest(
            at=at,
            datasets=names,
            epsilon_units=cost.asked_epsilon,
            delta_units=cost.asked_delta_units,
            rho_units=cost.rho_units,
            extra_delta_units=sampler_delta,
            extra_epsilon_units=sampler_epsilon,
        )
        ledger = _load(connection, in_force.policy, request, puser, locked.total)
        charges = ledger.charges
        gate = in_force.policy.approval
        gated = gate.epsilon_above is not None or gate.delta_above is not None
        if gated and callable(cost.frame_hash):
            cost = replace(cost, frame_hash=cost.frame_hash())  # once, for find and queue
        waiting = None
        if gated and cost.run_id is not None:  # a planned step: under its run's approval
            count = gaussian_count(cost.tv_units)
            waiting = approvals.run_step(tx.session, user.id, cost, values=count)
        if gated and waiting is None:
            waiting = approvals.find(tx.session, user.id, cost)
        answer = None if waiting is None else approvals.answer_of(waiting)
        if answer is not None:
            decision = policies.decide_approved(
                in_force.policy, puser, request, charges, answer, defaults=defaults
            )
        else:
            decision = policies.decide(in_force.policy, puser, request, charges, defaults=defaults)
        summary = {
            "policy": in_force.name,
            "policy_revision": in_force.revision,
            "rule": decision.rule,
            "mechanism": cost.mechanism,
            "epsilon_units": cost.asked_epsilon,
            "delta_units": cost.asked_delta_units,
            "datasets": list(cost.dataset_ids),
            "graph_hash": cost.graph_hash,
        }
        if decision.outcome is policies.Outcome.NEEDS_APPROVAL:
            refusing()
            queued = waiting is None
            if waiting is None:
                waiting = approvals.queue(tx.session, user, cost, decision, in_force.revision)
            error = approvals.waiting(
                tx.session,
                user,
                waiting,
                queued=queued,
                action="publish.approval_requested",
                decision=decision,
                in_force=in_force,
                summary=summary,
                what="this publish",
                again="publish the same computation again once it is approved",
            )
            tx.commit()  # what ``waiting`` wrote (it rolled back all else)
            raise error
        if not decision.allowed or decision.granted is None:
            refusing()
            if waiting is not None and answer is not None and not answer.approved:
                approvals.use(waiting, None)  # a denial is answered once; asking again queues anew
            audit.record(
                tx.session,
                user,
                "publish.refused",
                target_type="user",
                target_id=user.id,
                reason=decision.reason,
                **summary,
            )
            tx.commit()
            raise _refusal(decision, in_force)
        # The rows are written with plain INSERTs (no unit of work: nothing is read back).
        values: dict[str, Any] = {
            "at": at,
            "user_id": user.id,
            "mechanism": cost.mechanism,
            "epsilon_units": decision.granted.epsilon_units,
            "rho_units": decision.granted.rho_units,
            # The samplers' delta, in delta units (see the module docstring).
            "tv_units": decision.granted.delta_units,
            "dataset_ids": sorted(set(cost.dataset_ids)),
            "graph_hash": cost.graph_hash,
            "detail": cost.detail,
            "policy_revision": in_force.revision,
        }
        ((ident,),) = _INSERT_LEDGER.execute(connection, values)
        entry = Charged(id=ident, **values)
        reads = [
            {"ledger_id": entry.id, "dataset_id": d, "dataset_name": found.get(d)}
            for d in entry.dataset_ids
        ]
        if reads:
            _INSERT_READS.execute(connection, reads[0] if len(reads) == 1 else reads)
        if claim is not None:
            lease = settings.publish_lease_seconds
            idempotency.record(connection, user.id, claim, entry.id, at, lease)
            summary["idempotency_key"] = claim.key
        if waiting is not None:
            approvals.use(waiting, entry.id)
            summary["approval_id"] = waiting.id
            if waiting.kind == approvals.RUN:
                summary["run_id"] = waiting.id
                summary["run_step"] = waiting.steps_used
        audit.append(
            connection,
            user,
            "privacy.charge",
            target_type="ledger",
            target_id=entry.id,
            epsilon_charged_units=entry.epsilon_units,
            rho_units=entry.rho_units,
            tv_units=cost.tv_units,
            sampler_epsilon_units=sampler_epsilon,
            sampler_delta_units=sampler_delta,
            **summary,
        )
        after = _after(in_force, defaults, puser, ledger, decision.granted)
        if after is None:
            after = _status(connection, settings, in_force, puser, at)
        tx.commit()
        return entry, after


def ledger_of(
    session: Session,
    user_id: int | None,
    *,
    dataset_id: int | None = None,
    before_id: int | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 100,
) -> list[LedgerEntry]:
    """Charges, newest first: one user's (``None``: everyone's), optionally on one dataset
    and charged at or after ``since`` and before ``until``."""
    query = select(LedgerEntry).order_by(LedgerEntry.id.desc()).limit(limit)
    if user_id is not None:
        query = query.where(LedgerEntry.user_id == user_id)
    if since is not None:
        query = query.where(LedgerEntry.at >= since)
    if until is not None:
        query = query.where(LedgerEntry.at < until)
    if dataset_id is not None:
        query = query.join(
            LedgerEntryDataset, LedgerEntryDataset.ledger_id == LedgerEntry.id
        ).where(LedgerEntryDataset.dataset_id == dataset_id)
    if before_id is not None:
        query = query.where(LedgerEntry.id < before_id)
    return list(session.scalars(query))

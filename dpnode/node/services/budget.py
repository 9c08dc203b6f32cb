"""The privacy budget: an append-only ledger and a check that cannot be raced.

Whether a release may run is the budget policy's decision (:func:`policies.decide`, pure):
the node builds the user (with their grants), the request and the relevant ledger rows,
and writes the ledger row the decision grants. What a release costs, in the ledger's whole
units, is ``dpnode.node.services.costs``; the ledger as a decision reads it (a few sums)
``dpnode.node.services.ledger_sums``; the budget it leaves ``dpnode.node.services.budget_status``;
the ledger as people read it (each row's epsilon used, a run's steps as one line)
``dpnode.node.services.ledger``. Their public names are importable from here too.

The decision, the ledger row and the decision to release happen in one transaction that is
serialised: ``BEGIN IMMEDIATE`` on SQLite; on PostgreSQL row locks on the user and then on
every dataset the release reads, in id order, so that a dataset's cap across all users
holds under concurrency. A result may leave the node only after that commit.

That transaction is on every publish's path, so it reads the ledger as a few sums with
statements built once, writes its three rows (ledger, datasets read, audit) as plain
INSERTs, and derives the budget after the charge from the sums it read plus the new row
instead of reading them again. It runs on a bare connection: an ORM session, whose work
around a transaction costs more than the charge's statements, joins it only on the rare
paths that need one (:class:`_Transaction`). A step of a planned training run names it:
the run must be the caller's (``dpnode.node.services.runs``), its id is written on the
row, and the run's total so far is read in the same transaction for the receipt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, bindparam, insert, select
from sqlalchemy.orm import Session, sessionmaker

from dpnode import policies
from dpnode.core.errors import (
    AuthenticationError,
    BudgetExceededError,
    NotFoundError,
    PolicyRefusedError,
)
from dpnode.node.db.base import table_of, utcnow
from dpnode.node.db.direct import Direct, connection_of
from dpnode.node.db.models import LedgerEntryDataset, TrainingRun, User
from dpnode.node.db.session import RELAXED, sync_wal
from dpnode.node.services import approvals, audit, idempotency, users
from dpnode.node.services import policy as policy_service
from dpnode.node.services.budget_status import (
    RunSoFar,
    Status,
    _after,
    _defaults,
    _status,
    budget_of,
    receipt_terms,
)
from dpnode.node.services.costs import (
    DELTA_UNIT,
    EPSILON_UNIT,
    MAX_EPSILON,
    RHO_UNIT,
    TV_UNIT,
    Cost,
    check_epsilon_size,
    delta_asked_units,
    gaussian_count,
    quantize_epsilon,
    sampler_units,
    units_down,
    units_up,
)
from dpnode.node.services.ledger import ledger_of, run_total
from dpnode.node.services.ledger_sums import (
    _DATASETS,
    _GRANTS,
    _LEDGER,
    _TOTALS,
    Account,
    _load,
    _total,
    policy_user,
)
from dpnode.node.services.policy import InForce
from dpnode.node.services.spending_mark import SpendingMark, dataset_key, user_key
from dpnode.node.settings import Settings

__all__ = [
    "DELTA_UNIT",
    "EPSILON_UNIT",
    "MAX_EPSILON",
    "RHO_UNIT",
    "TV_UNIT",
    "Account",
    "Charged",
    "Cost",
    "Status",
    "budget_of",
    "charge",
    "check_epsilon_size",
    "delta_asked_units",
    "gaussian_count",
    "ledger_of",
    "policy_user",
    "quantize_epsilon",
    "receipt_terms",
    "sampler_units",
    "units_down",
    "units_up",
]

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


_RUNS = table_of(TrainingRun)
#: A planned run, as a step's charge checks it (a plain row: no ORM object is built).
_RUN = select(_RUNS.c.id, _RUNS.c.steps, _RUNS.c.approval_id).where(
    _RUNS.c.id == bindparam("run_id"), _RUNS.c.user_id == bindparam("user_id")
)


class _Run(NamedTuple):
    id: int
    steps: int
    approval_id: int | None


def _run_of(connection: Connection, user_id: int, run_id: int) -> _Run | None:
    """The user's planned run ``run_id``; ``None`` when there is none (or not theirs)."""
    row = connection.execute(_RUN, {"run_id": run_id, "user_id": user_id}).first()
    return None if row is None else _Run(*row)


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
    #: the planned training run it is a step of (``None``: a publish of its own)
    run_id: int | None = None


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

    def __init__(self, connection: Connection, *, relaxed: bool = False) -> None:
        self.connection = connection
        #: begun with ``synchronous=NORMAL`` (see :func:`charge`): only a commit the budget
        #: mark covers may skip the disk
        self.relaxed = relaxed
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = Session(
                self.connection, join_transaction_mode="rollback_only", expire_on_commit=False
            )
        return self._session

    def commit(self, *, covered: bool = False) -> None:
        """Commit; durably unless ``covered`` (the budget mark holds the charge)."""
        if self._session is not None:
            self._session.flush()
        self.connection.commit()
        if self.relaxed and not covered:
            sync_wal(self.connection)


def charge(
    serial_sessions: sessionmaker[Session],
    settings: Settings,
    user_id: int,
    cost: Cost,
    *,
    claim: idempotency.Claim | None = None,
    mark: SpendingMark | None = None,
) -> tuple[Charged, Status]:
    """Decide the cost under the policy in force and record it, atomically.

    ``serial_sessions`` must be bound to ``dpnode.node.db.session.serial_engine``. Returns the
    committed ledger row and the budget after it. ``claim``: the publish's idempotency key,
    recorded with the ledger row (a refused charge records none). ``mark``: the node's
    budget mark, which is made to cover the charge before it commits (the node passes it;
    tests of the decision alone may not).

    Raises:
        BudgetExceededError: the cost does not fit the user's budget or a dataset's cap;
            nothing is recorded in the ledger. ``rule`` and ``policy_revision`` say which.
        BudgetMarkError: the database is behind the budget mark (a restored backup), or the
            mark cannot be read or written; nothing is recorded.
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
    # A charge the mark will cover need not wait for the disk (docs/privacy.md, "A charge's
    # commit and a power loss"); SQLite fixes that when the transaction begins.
    relaxed = (
        mark is not None and settings.ledger_fsync == "covered" and serial.dialect.name == "sqlite"
    )
    with serial.connect() as connection:
        if relaxed:
            connection.execution_options(**{RELAXED: True})
        connection.begin()
        tx = _Transaction(connection, relaxed=relaxed)
        locked = _lock(connection, user_id, cost.dataset_ids)
        if mark is not None:  # before this charge writes: the database as committed
            mark.verify(connection)
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
        run = None
        if cost.run_id is not None:  # a step of a run: of one the caller planned, or refused
            run = _run_of(connection, user.id, cost.run_id)
            if run is None:
                refusing()
                raise NotFoundError(
                    f"this publish names training run {cost.run_id}, which is not a run you "
                    "planned: plan the run first (client.plan_run, which sdk.private_training "
                    "calls) and name the run_id it returns; nothing was charged"
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
        if gated and run is not None and run.approval_id is not None:  # under its approval
            count = gaussian_count(cost.tv_units)
            waiting = approvals.run_step(
                tx.session, user.id, cost, approval_id=run.approval_id, values=count
            )
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
            "run_id": cost.run_id,
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
                summary["run_step"] = waiting.steps_used
        if run is not None:
            summary["run_id"] = run.id
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
        if run is not None:  # the run so far, for the receipt: read before the commit, so
            # that a failure leaves nothing charged
            steps, used = run_total(connection, after, user.id, run.id)
            so_far = RunSoFar(run.id, steps, run.steps, used.epsilon_units, used.delta_units)
            after = replace(after, run=so_far)
        if mark is None:
            tx.commit()
            return entry, after
        # The one place a charge commits: the mark covers it first (a reservation), so that
        # it is never below what was released.
        keys = [user_key(user.id), *(dataset_key(found[d]) for d in entry.dataset_ids)]
        amount = (entry.epsilon_units, entry.rho_units, entry.tv_units)
        left = after.status.remaining
        mark.reserve(connection, keys, amount, room=(left.epsilon_units, None, left.delta_units))
        try:
            tx.commit(covered=True)
        except BaseException:
            mark.rolled_back(keys, amount)
            raise
        mark.committed(keys, amount)
        return entry, after

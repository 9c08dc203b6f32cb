"""The privacy budget: an append-only ledger and a check that cannot be raced.

Whether a release may run is the budget policy's decision (:func:`policies.decide`, pure):
the node builds the user (with their grants), the request and the relevant ledger rows,
and writes the ledger row the decision grants. What a release costs, in the ledger's whole
units, is ``dpnode.node.services.costs``; the ledger as a decision reads it (a few sums)
``dpnode.node.services.ledger_sums``; the budget it leaves ``dpnode.node.services.budget_status``;
the ledger as people read it (each row's epsilon used, a run's steps as one line)
``dpnode.node.services.ledger``. The units and :class:`Cost` are importable from here too.

The decision, the ledger row and the decision to release happen in one transaction that is
serialised: ``BEGIN IMMEDIATE`` on SQLite; on PostgreSQL row locks on the user and then on
every dataset the release reads, in id order (``dpnode.node.services.charge_lock``), so that
a dataset's cap across all users holds under concurrency. A result may leave the node only
after that commit. A refusal is ``dpnode.node.services.policy.refusal``.

That transaction is on every publish's path, so it reads the ledger as a few sums with
statements built once, writes its three rows (ledger, datasets read, audit) as plain
INSERTs, and derives the budget after the charge from the sums it read plus the new row
instead of reading them again. It runs on a bare connection: an ORM session joins it only
on the rare paths that need one (``dpnode.node.services.charge_rows``). A step of a planned
training run names it: the run must be the caller's (``dpnode.node.services.runs``), its id
is written on the row, and the run's total so far is read in the same transaction for the
receipt.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, bindparam, select
from sqlalchemy.orm import Session, sessionmaker

from dpnode import policies
from dpnode.core.errors import NotFoundError
from dpnode.node.db.base import table_of, utcnow
from dpnode.node.db.models import TrainingRun
from dpnode.node.db.session import RELAXED
from dpnode.node.services import approvals, audit, idempotency
from dpnode.node.services import policy as policy_service
from dpnode.node.services.budget_status import RunSoFar, Status, _after, _defaults, _status
from dpnode.node.services.charge_lock import lock
from dpnode.node.services.charge_rows import INSERT_LEDGER, INSERT_READS, Charged, Transaction
from dpnode.node.services.costs import (
    DELTA_UNIT,
    EPSILON_UNIT,
    RHO_UNIT,
    TV_UNIT,
    Cost,
    gaussian_count,
    quantize_epsilon,
    sampler_units,
    units_down,
    units_up,
)
from dpnode.node.services.ledger import run_total
from dpnode.node.services.ledger_sums import _load
from dpnode.node.services.spending_mark import SpendingMark, dataset_key, user_key
from dpnode.node.settings import Settings

__all__ = [
    "DELTA_UNIT",
    "EPSILON_UNIT",
    "RHO_UNIT",
    "TV_UNIT",
    "Cost",
    "charge",
    "gaussian_count",
    "quantize_epsilon",
    "sampler_units",
    "units_down",
    "units_up",
]


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
    # a rare path needs it (:class:`charge_rows.Transaction`).
    # A charge the mark will cover need not wait for the disk (docs/privacy.md, "A charge's
    # commit and a power loss"); SQLite fixes that when the transaction begins.
    relaxed = (
        mark is not None and settings.ledger_fsync == "covered" and serial.dialect.name == "sqlite"
    )
    with serial.connect() as connection:
        if relaxed:
            connection.execution_options(**{RELAXED: True})
        connection.begin()
        tx = Transaction(connection, relaxed=relaxed)
        locked = lock(connection, user_id, cost.dataset_ids)
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
        # A cap-paid release is judged by the caps alone (policies.decide_cap): no threshold.
        gated = not cost.cap_only and (
            gate.epsilon_above is not None or gate.delta_above is not None
        )
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
        elif cost.cap_only:
            decision = policies.decide_cap(
                in_force.policy, puser, request, charges, defaults=defaults
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
        if cost.cap_only:
            summary["cap_only"] = True
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
            raise policy_service.refusal(decision, in_force)
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
            "cap_only": cost.cap_only,
        }
        ((ident,),) = INSERT_LEDGER.execute(connection, values)
        entry = Charged(id=ident, **values)
        reads = [
            {"ledger_id": entry.id, "dataset_id": d, "dataset_name": found.get(d)}
            for d in entry.dataset_ids
        ]
        if reads:
            INSERT_READS.execute(connection, reads[0] if len(reads) == 1 else reads)
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
        # A cap-paid row is not the user's: their budget after it is their budget before.
        after = (
            None if cost.cap_only else _after(in_force, defaults, puser, ledger, decision.granted)
        )
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
        # Under the keys whose sums hold the row (``spending_mark.read_totals``): a cap-paid
        # row is in its datasets' sums, not in its user's total.
        keys = [] if cost.cap_only else [user_key(user.id)]
        keys += [dataset_key(found[d]) for d in entry.dataset_ids]
        amount = (entry.epsilon_units, entry.rho_units, entry.tv_units)
        left = after.status.remaining
        room = (None, None, None) if cost.cap_only else (left.epsilon_units, None, left.delta_units)
        mark.reserve(connection, keys, amount, room=room)
        try:
            tx.commit(covered=True)
        except BaseException:
            mark.rolled_back(keys, amount)
            raise
        mark.committed(keys, amount)
        return entry, after

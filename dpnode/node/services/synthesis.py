"""Synthesis: a differentially private synthetic copy of a dataset, charged like a publish.

Order of events, as for a publish (``dpnode.node.services.publish``), each for a reason:

1. check the account and the request, read the source's public metadata, build the domain
   (:mod:`dpnode.core.synth.domain`) and plan the run (:func:`dpnode.core.synth.plan_aim`,
   :func:`dpnode.core.synth.plan_mst`: the method's entry in
   :data:`dpnode.node.services.synthesis_methods.METHODS`):
   a table with several rows per subject, a column without finite bounds, a domain beyond
   the node's memory quota, a delta of 0 are refused here, before any value is read and
   with nothing charged;
2. charge the run's whole cost as one ledger row (the method, its parameters in the row's
   detail; for AIM, a bound on every run its adaptive rounds can make) in the budget's
   serialised transaction: policy, caps, approvals and the budget decide there;
3. only then read the columns, measure and select with the node's mechanisms
   (:func:`dpnode.core.synth.run_aim`, :func:`dpnode.core.synth.run_mst`), estimate and
   sample (post-processing: ``mbi`` for MST, :mod:`dpnode.core.synth.graphical` for AIM);
4. store the rows as a new dataset owned by the caller, flagged synthetic by its provenance
   (source, method, epsilon, delta, rows, ledger row; a caller's seed is not kept).

Steps 1 and 2 run in the request; steps 3 and 4 run as a job in a background thread
(:mod:`dpnode.node.services.synthesis_jobs`), reporting its progress, since a run takes
seconds to minutes: the request is answered with the job's id.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select

from dpnode.core.errors import (
    ConflictError,
    InvalidRequestError,
    PublishInProgressError,
    QuotaExceededError,
)
from dpnode.core.synth import (
    ColumnFacts,
    decode,
    domain_of,
    encode,
)
from dpnode.node.context import NodeContext
from dpnode.node.db.models import Dataset
from dpnode.node.services import (
    blobs,
    budget,
    budget_status,
    charge_rows,
    costs,
    datasets,
    idempotency,
    synthesis_methods,
    users,
)
from dpnode.node.services.catalog import check_item_name, normalise_tags
from dpnode.node.services.costs import DELTA_UNIT, EPSILON_UNIT, RHO_UNIT, Cost
from dpnode.node.services.synthesis_jobs import Reporter
from dpnode.node.services.synthesis_methods import METHODS, Plan
from dpnode.node.services.tabular import ColumnSpec
from dpnode.node.settings import Settings
from dpnode.node.storage import array_to_bytes

__all__ = [
    "Replayed",
    "Started",
    "SynthesisRequest",
    "Synthesized",
    "Work",
    "cost_of",
    "plan_for",
    "replay",
    "request_hash",
    "sample",
    "start",
    "synthesize",
]


@dataclass(frozen=True)
class SynthesisRequest:
    """What a caller asked for (see :func:`synthesize`)."""

    epsilon: float
    delta: float
    rows: int | None = None
    method: str = "mst"
    bins: Mapping[str, int] | None = None
    columns: Sequence[str] | None = None
    name: str | None = None
    seed: int | None = None


@dataclass(frozen=True)
class Synthesized:
    """The new dataset and the receipt of its charge."""

    dataset: Dataset
    receipt: dict[str, Any]


@dataclass(frozen=True)
class Started:
    """A charged synthesis, running as job ``job``."""

    job: int


@dataclass(frozen=True)
class Replayed:
    """The stored answer of a synthesis already made under the same idempotency key."""

    response: bytes


def request_hash(ref: int | str, request: SynthesisRequest, what: str = "synthesize") -> str:
    """What identifies a synthesis request (``what``: of a copy, or of a mock) under an
    idempotency key."""
    fields = {what: str(ref), **vars(request)}
    fields["bins"] = dict(request.bins) if request.bins is not None else None
    fields["columns"] = list(request.columns) if request.columns is not None else None
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def replay(context: NodeContext, actor_id: int, claim: idempotency.Claim) -> bytes | None:
    """The stored answer of the request ``claim`` names, if it was answered."""
    with context.read_sessions() as session:
        users.active_actor(session, actor_id)
        return idempotency.replay(session, actor_id, claim)


def _check(request: SynthesisRequest, source_rows: int, max_elements: int) -> int:
    if request.method not in METHODS:
        raise InvalidRequestError(
            f"method must be one of {sorted(METHODS)}, got {request.method!r}"
        )
    costs.quantize_epsilon(request.epsilon)  # refuses NaN, 0, a negative or a huge one
    rows = source_rows if request.rows is None else request.rows
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise InvalidRequestError(f"rows must be a whole number >= 1, got {request.rows!r}")
    if rows > max_elements:
        raise InvalidRequestError(
            f"rows={rows} is more than the node stores in a dataset ({max_elements} values)"
        )
    if request.seed is not None and (
        isinstance(request.seed, bool) or not isinstance(request.seed, int) or request.seed < 0
    ):
        raise InvalidRequestError(f"seed must be a whole number >= 0, got {request.seed!r}")
    return rows


def _facts(source: Dataset, columns: Sequence[str] | None) -> list[ColumnFacts]:
    by_name = {c.name: c for c in source.columns}
    names = list(by_name) if columns is None else list(columns)
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise InvalidRequestError(
            f"columns= names {unknown or 'nothing'}; dataset {source.name!r} has {list(by_name)}"
        )
    facts = []
    for n in names:
        column = by_name[n]
        categories = column.categories
        facts.append(
            ColumnFacts(
                n,
                column.dtype,
                tuple(column.row_shape or ()),
                column.lower,
                column.upper,
                None if categories is None else tuple(categories),
            )
        )
    return facts


def cost_of(plan: Plan, request: SynthesisRequest, source: Dataset) -> Cost:
    """What a synthesis costs, in ledger units, with its method and parameters (the row's
    detail)."""
    terms = plan.terms()
    detail = {
        "method": request.method,
        "source": source.id,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "columns": [a.name for a in plan.attributes],
        "bins": {a.name: a.size for a in plan.attributes},
        "rho": terms.rho,
    }
    asked = {**detail, "rows": request.rows, "name": request.name, "seed": request.seed}
    digest = hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()
    return Cost(
        request.method,
        rho_units=costs.units_up(terms.rho, RHO_UNIT, "rho"),
        extra_units=(
            costs.units_up(terms.epsilon, EPSILON_UNIT, "epsilon"),
            costs.units_up(terms.delta, DELTA_UNIT, "delta"),
        ),
        dataset_ids=[source.id],
        detail=detail,
        asked_epsilon_units=costs.units_down(request.epsilon, EPSILON_UNIT, "epsilon"),
        asked_delta_units=costs.delta_asked_units(request.delta),
        frame_hash=digest,
    )


def plan_for(settings: Settings, source: Dataset, request: SynthesisRequest) -> tuple[Plan, int]:
    """The run ``request`` asks for on ``source``, planned from its public metadata alone, and
    the rows it samples.

    Raises:
        InvalidRequestError: a bad epsilon, delta, rows, method, bins or columns; a dataset
            with several rows per subject.
        QuotaExceededError: the domain is too large for the node's memory quota.
    """
    rows = _check(request, source.row_count, settings.max_upload_elements)
    if source.max_rows_per_subject > 1:
        raise InvalidRequestError(
            f"dataset {source.name!r} has up to {source.max_rows_per_subject} rows per "
            f"subject ({source.subject_column!r}); synthesis handles one row per subject "
            "for now: publish statistics through the query builder instead"
        )
    facts = _facts(source, request.columns)
    attributes = domain_of(facts, source.row_count, request.bins)
    epsilon = float(costs.quantize_epsilon(request.epsilon))
    method = METHODS[request.method]
    plan = method.plan(attributes, source.row_count, epsilon, request.delta)
    need, quota = method.memory(plan, rows), settings.max_graph_memory_bytes
    if need > quota:
        raise QuotaExceededError(
            f"this synthesis would hold about {need / 2**20:.1f} MiB, {need / quota:.1f} "
            f"times the node's memory quota of {quota / 2**20:.1f} MiB: use fewer bins "
            "(bins={...}) or fewer columns (columns=[...]); nothing was charged"
        )
    return plan, rows


def _plan(
    context: NodeContext, actor_id: int, ref: int | str, request: SynthesisRequest
) -> tuple[Dataset, Plan, int, str]:
    synthesis_methods.check_estimator(request.method)
    with context.read_sessions() as session:
        users.active_actor(session, actor_id)
        source = datasets.get_dataset(session, ref)
        plan, rows = plan_for(context.settings, source, request)
        name = request.name or f"{source.name}-synthetic-{secrets.token_hex(3)}"
        check_item_name("dataset", name)
        if session.scalar(select(Dataset.id).where(Dataset.name == name)) is not None:
            raise ConflictError(f"a dataset named {name!r} already exists: pick another name=")
        session.expunge_all()
    return source, plan, rows, name


def synthesize(
    context: NodeContext,
    actor_id: int,
    ref: int | str,
    request: SynthesisRequest,
    answer: Callable[[Synthesized], dict[str, Any]],
    key: str | None = None,
) -> Started | Replayed:
    """Charge a differentially private synthetic copy of dataset ``ref`` for the caller, and
    start computing it as a job (:mod:`dpnode.node.services.synthesis_jobs`), whose answer
    is ``answer`` of the new dataset and its receipt.

    ``key``: the request's idempotency key, claimed with the ledger row as a publish's is
    (``dpnode.node.services.idempotency``): a retry under it gets the first answer, the
    same job (:class:`Replayed`, stored by the caller with ``publish.answered``), charged
    once.

    Raises (each before any private value is read, nothing charged):
        AuthenticationError: the account no longer exists or was deactivated.
        NotFoundError: no such dataset.
        InvalidRequestError: a bad epsilon, delta, rows, method, bins, columns or name; a
            dataset with several rows per subject.
        ConflictError: a dataset of that name exists.
        QuotaExceededError: the domain is too large for the node's memory quota.
        EvaluationUnavailableError: the node is installed without ``mbi``.
        PolicyRefusedError, BudgetExceededError, ApprovalRequiredError: the policy or the
            budget refuses the charge.
        ConflictError, PublishInProgressError, PublishLostError: the key names another
            request, or its synthesis is still being started, or was lost.
    """
    claim = None
    if key is not None:
        claim = idempotency.Claim(idempotency.check_key(key), request_hash(ref, request))
        stored = replay(context, actor_id, claim)
        if stored is not None:
            return Replayed(stored)
    source, plan, rows, name = _plan(context, actor_id, ref, request)

    def work(entry: charge_rows.Charged, after: budget_status.Status, report: Reporter) -> Any:
        done = _run(context, actor_id, source, plan, request, rows, name, entry, after, report)
        return answer(done)

    return start(context, actor_id, source, cost_of(plan, request, source), claim, work)


#: A charged run's work in its job: given its ledger row, the budget after it and where to
#: report its progress, the job's answer.
Work = Callable[[charge_rows.Charged, budget_status.Status, Reporter], dict[str, Any]]


def start(
    context: NodeContext,
    actor_id: int,
    source: Dataset,
    cost: Cost,
    claim: idempotency.Claim | None,
    work: Work,
) -> Started | Replayed:
    """Charge ``cost`` for the caller (under ``claim``'s idempotency key) and run ``work`` as
    a job on ``source``: what :func:`synthesize` and a data owner's synthetic mock
    (``dpnode.node.services.mock_synthesis``) share once planned.

    Raises:
        as :func:`synthesize`'s charge does.
    """
    try:
        entry, after = budget.charge(
            context.serial_sessions,
            context.settings,
            actor_id,
            cost,
            claim=claim,
            mark=context.mark,  # as a publish's: the mark must cover the charge
        )
    except idempotency.AlreadyClaimed:  # a copy of this request was charged meanwhile
        assert claim is not None
        stored = replay(context, actor_id, claim)
        if stored is None:
            raise PublishInProgressError(
                f"the synthesis with idempotency key {claim.key!r} was just charged by another "
                "request: retry with the same key to get its answer"
            ) from None
        return Replayed(stored)
    if claim is not None:  # renewed until the answer (the job's id) is stored
        context.leases.hold(actor_id, claim.key)
    try:
        job = context.synthesis_jobs.create(actor_id, source.id, entry.id, cost.mechanism)
    except BaseException:  # not answered: the lease lapses, and its retries learn it is lost
        if claim is not None:
            context.leases.release(actor_id, claim.key)
        raise
    context.synthesis_jobs.launch(job, lambda report: work(entry, after, report))
    return Started(job)


def _run(
    context: NodeContext,
    actor_id: int,
    source: Dataset,
    plan: Plan,
    request: SynthesisRequest,
    rows: int,
    name: str,
    entry: charge_rows.Charged,
    after: budget_status.Status,
    report: Reporter,
) -> Synthesized:
    """Charged: from here on the source's values are read (in the job's thread)."""
    arrays, sampled = sample(context, source, plan, request, rows, report)
    provenance = {
        "source_id": source.id,
        "source": source.name,
        "method": request.method,
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "rows": rows,
        "ledger_id": entry.id,
        "domain": {a.name: a.size for a in plan.attributes},
        "domain_size": math.prod(a.size for a in plan.attributes),
        **sampled.report,
    }
    dataset = _store(context, actor_id, source, plan, arrays, name, provenance)
    receipt = {
        "ledger_id": entry.id,
        "mechanism": request.method,
        **budget_status.receipt_terms(
            entry, after, asked_epsilon=plan.epsilon, asked_delta=plan.delta
        ),
        **sampled.report,
        "domain_size": provenance["domain_size"],
        "policy": after.in_force.name,
        "policy_revision": entry.policy_revision,
    }
    return Synthesized(dataset, receipt)


def sample(
    context: NodeContext,
    source: Dataset,
    plan: Plan,
    request: SynthesisRequest,
    rows: int,
    report: Reporter,
) -> tuple[list[Any], synthesis_methods.Sampled]:
    """Run a charged ``plan`` on ``source``'s values: ``rows`` synthetic values of each of
    the plan's columns, in its order, and the run's utility report. Only once charged: it
    reads private values."""
    by_name = {c.name: c for c in source.columns}
    codes = np.stack(
        [
            encode(a, datasets.read_column(context.store, source, by_name[a.name]))
            for a in plan.attributes
        ],
        axis=1,
    )
    rng = np.random.default_rng(secrets.randbits(128) if request.seed is None else request.seed)
    sampled = METHODS[request.method].run(plan, codes, rows, rng, report)
    arrays = [decode(a, sampled.codes[:, j], rng) for j, a in enumerate(plan.attributes)]
    return arrays, sampled


def _store(
    context: NodeContext,
    actor_id: int,
    source: Dataset,
    plan: Plan,
    arrays: list[Any],
    name: str,
    provenance: dict[str, Any],
) -> Dataset:
    by_name = {c.name: c for c in source.columns}
    staged = blobs.stage(
        context.store, ((array_to_bytes(np.ascontiguousarray(a)),) for a in arrays)
    )
    rows = int(arrays[0].shape[0])
    upload = datasets.DatasetUpload(
        name=name,
        description=f"differentially private synthetic copy of {source.name!r} "
        f"({provenance['method']}, epsilon {plan.epsilon:g}, delta {plan.delta:g})",
        tags=["synthetic", *(t.tag for t in source.tags)],
        spec=ColumnSpec(bounds={}, categories={}),
        order=[a.name for a in plan.attributes],
        columns={},
    )

    def register(_: None, digests: list[str]) -> Dataset:
        table = datasets.StoredTable(
            columns=[
                datasets.StoredColumn(
                    name=a.name,
                    dtype=a.dtype,
                    row_shape=[],
                    lower=by_name[a.name].lower,
                    upper=by_name[a.name].upper,
                    categories=by_name[a.name].categories,
                    blob=digests[j],
                    mock_blob=None,
                )
                for j, a in enumerate(plan.attributes)
            ],
            row_count=rows,
            mock_row_count=None,
            subjects_blob=None,
            subject_count=rows,
            max_rows_per_subject=1,
        )
        return datasets.register_dataset(
            session,
            actor,
            upload,
            table,
            name=name,
            tags=normalise_tags(upload.tags),
            provenance=provenance,
        )

    with context.sessions() as session:
        actor = users.active(session, actor_id)
        return blobs.register_with(session, context.store, staged, lambda: None, register)

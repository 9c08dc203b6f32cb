"""Synthesis: a differentially private synthetic copy of a dataset, charged like a publish.

Order of events, as for a publish (``dpnode.node.services.publish``), each for a reason:

1. check the account and the request, read the source's public metadata, build the domain
   (:mod:`dpnode.core.synth.domain`) and plan the run (:func:`dpnode.core.synth.plan_aim`,
   :func:`dpnode.core.synth.plan_mst`: the method's entry in :data:`METHODS`):
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
import importlib.util
import json
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sqlalchemy import select

from dpnode.core.dp import accounting
from dpnode.core.errors import (
    ConflictError,
    EvaluationUnavailableError,
    InvalidRequestError,
    PublishInProgressError,
    QuotaExceededError,
)
from dpnode.core.synth import (
    AimPlan,
    Attribute,
    ColumnFacts,
    MstPlan,
    decode,
    domain_of,
    encode,
    plan_aim,
    plan_mst,
    run_aim,
    run_mst,
)
from dpnode.core.synth.aim import Progress
from dpnode.core.synth.estimate import estimate_marginals, sample_model, sample_tree
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
    users,
)
from dpnode.node.services.catalog import check_item_name, normalise_tags
from dpnode.node.services.costs import DELTA_UNIT, EPSILON_UNIT, RHO_UNIT, Cost
from dpnode.node.services.synthesis_jobs import Reporter
from dpnode.node.services.tabular import ColumnSpec
from dpnode.node.storage import array_to_bytes

__all__ = [
    "METHODS",
    "Method",
    "Replayed",
    "Sampled",
    "Started",
    "SynthesisRequest",
    "Synthesized",
    "aim_memory_bytes",
    "memory_bytes",
    "synthesize",
]

#: The package that estimates and samples (post-processing), an optional dependency.
ESTIMATOR = "mbi"


class Plan(Protocol):
    """What both methods' plans offer the service."""

    @property
    def attributes(self) -> tuple[Attribute, ...]: ...
    @property
    def rows(self) -> int: ...
    @property
    def epsilon(self) -> float: ...
    @property
    def delta(self) -> float: ...
    def terms(self) -> accounting.Terms: ...


@dataclass(frozen=True)
class Sampled:
    """A run's synthetic codes and its utility report (public or post-processing only: the
    measured column sets, each one's noise, the rounds)."""

    codes: Any
    report: dict[str, Any]


@dataclass(frozen=True)
class Method:
    """A synthesis method: how it plans (public metadata), what it holds in memory at most,
    and how it runs once charged (the plan, the binned table, rows to sample, a generator
    for the sampling, where to report its progress); ``estimator``: whether it needs
    :data:`ESTIMATOR` installed."""

    plan: Callable[[tuple[Attribute, ...], int, float, float], Plan]
    memory: Callable[[Any, int], int]
    run: Callable[[Any, Any, int, np.random.Generator, Reporter], Sampled]
    estimator: bool


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


def _request_hash(ref: int | str, request: SynthesisRequest) -> str:
    """What identifies a synthesis request under an idempotency key."""
    fields = {"synthesize": str(ref), **vars(request)}
    fields["bins"] = dict(request.bins) if request.bins is not None else None
    fields["columns"] = list(request.columns) if request.columns is not None else None
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _replay(context: NodeContext, actor_id: int, claim: idempotency.Claim) -> bytes | None:
    with context.read_sessions() as session:
        users.active_actor(session, actor_id)
        return idempotency.replay(session, actor_id, claim)


def memory_bytes(plan: MstPlan, rows_out: int) -> int:
    """What a run holds at most, from public sizes: the binned source and output tables,
    every marginal scored at once, and the estimate's copies of the tree's marginals (its
    potentials, marginals, gradients and line-search states, a dozen of them in float64).

    >>> from dpnode.core.synth.domain import Attribute
    >>> attrs = [Attribute(n, "int64", 10, 0.0, 9.0, None) for n in "abc"]
    >>> memory_bytes(plan_mst(attrs, rows=100, epsilon=1.0, delta=1e-6), 100)
    26640
    """
    d = len(plan.attributes)
    tables = 8 * d * (plan.rows + rows_out)
    return tables + 8 * plan.cells + 96 * plan.largest_pair * max(d - 1, 0)


def aim_memory_bytes(plan: AimPlan, rows_out: int) -> int:
    """What an AIM run holds at most, from public sizes: the binned source and output tables,
    every candidate's true counts, and the estimate's copies of a model at its size limit
    (as :func:`memory_bytes` counts them).

    >>> from dpnode.core.synth.domain import Attribute
    >>> attrs = [Attribute(n, "int64", 10, 0.0, 9.0, None) for n in "abc"]
    >>> aim_memory_bytes(plan_aim(attrs, rows=100, epsilon=1.0, delta=1e-6), 100)
    140240
    """
    d = len(plan.attributes)
    largest_model = min(plan.model_cells, sum(plan.size(c) for c in plan.workload))
    return 8 * d * (plan.rows + rows_out) + 8 * plan.cells + 96 * largest_model


def _names(plan: Plan, cliques: Sequence[Sequence[int]]) -> list[list[str]]:
    return [[plan.attributes[j].name for j in c] for c in cliques]


#: MST's steps as a job reports them: it measures, selects and measures its tree in one call.
_MST_STEPS = ("measuring", "estimating", "sampling", "storing")


def _run_mst(
    plan: MstPlan, codes: Any, rows: int, rng: np.random.Generator, report: Reporter
) -> Sampled:
    total = len(_MST_STEPS)
    report(0, total, "measuring")
    measured = run_mst(codes, plan)
    report(1, total, "estimating")
    sizes = [a.size for a in plan.attributes]
    if len(sizes) > 1:
        root, edges = estimate_marginals(plan.attributes, measured, plan.rows)
    else:  # one column: its noisy marginal is the model
        root, edges = measured.one_way[0], {}
    tree = _names(plan, measured.pairs)
    shown = {
        "selection_epsilon": plan.select_epsilon * plan.selections,
        "one_way_sigma": measured.one_way_sigma,
        "two_way_sigma": list(measured.two_way_sigma),
        "tree": tree,
        "rounds": len(measured.pairs),
        "measured": [
            *({"columns": [a.name], "sigma": measured.one_way_sigma} for a in plan.attributes),
            *(
                {"columns": names, "sigma": sigma}
                for names, sigma in zip(tree, measured.two_way_sigma, strict=True)
            ),
        ],
    }
    report(2, total, "sampling")
    synthetic = sample_tree(sizes, root, edges, rows, rng)
    report(3, total, "storing")
    return Sampled(synthetic, shown)


def _run_aim(
    plan: AimPlan, codes: Any, rows: int, rng: np.random.Generator, report: Reporter
) -> Sampled:
    # its rounds, then sampling and storing: a run that stops early jumps to sampling
    total = plan.max_rounds + 2

    def rounds(at: Progress) -> None:
        report(at.rounds, total, at.phase)

    run = run_aim(codes, plan, progress=rounds)
    assert run.model is not None  # every run ends with its full fit
    report(plan.max_rounds, total, "sampling")
    synthetic = sample_model(run.model, len(plan.attributes), rows, int(rng.integers(2**32)))
    report(plan.max_rounds + 1, total, "storing")
    shown = {
        "selection_epsilon": math.fsum(m.selection_epsilon for m in run.measurements),
        "rounds": run.rounds,
        "rounds_planned": plan.max_rounds,
        "workload": _names(plan, plan.workload),
        "measured": [
            {
                "columns": [plan.attributes[j].name for j in m.clique],
                "sigma": m.sigma,
                "selection_epsilon": m.selection_epsilon,
            }
            for m in run.measurements
        ],
    }
    return Sampled(synthetic, shown)


#: The methods a synthesis may name.
METHODS: dict[str, Method] = {
    "aim": Method(
        lambda attrs, rows, eps, delta: plan_aim(attrs, rows=rows, epsilon=eps, delta=delta),
        aim_memory_bytes,
        _run_aim,
        estimator=False,  # its own NumPy estimation
    ),
    "mst": Method(
        lambda attrs, rows, eps, delta: plan_mst(attrs, rows=rows, epsilon=eps, delta=delta),
        memory_bytes,
        _run_mst,
        estimator=True,
    ),
}


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


def _cost(plan: Plan, request: SynthesisRequest, source: Dataset) -> Cost:
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


def _check_estimator(method: str) -> None:
    """Refuse, before anything is charged, a method that needs ``mbi`` on a node without it."""
    needs = method in METHODS and METHODS[method].estimator
    if needs and importlib.util.find_spec(ESTIMATOR) is None:
        raise EvaluationUnavailableError(
            f"this node cannot synthesize with method={method!r}: its estimator (Private-PGM, "
            "the 'mbi' package) is not installed; ask its operator to pip install "
            "'dpnode[synth]', or use method='aim', which needs none. Nothing was charged",
            retry_after=3600,
        )


def _plan(
    context: NodeContext, actor_id: int, ref: int | str, request: SynthesisRequest
) -> tuple[Dataset, Plan, int, str]:
    settings = context.settings
    _check_estimator(request.method)
    with context.read_sessions() as session:
        users.active_actor(session, actor_id)
        source = datasets.get_dataset(session, ref)
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
        claim = idempotency.Claim(idempotency.check_key(key), _request_hash(ref, request))
        stored = _replay(context, actor_id, claim)
        if stored is not None:
            return Replayed(stored)
    source, plan, rows, name = _plan(context, actor_id, ref, request)
    cost = _cost(plan, request, source)
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
        stored = _replay(context, actor_id, claim)
        if stored is None:
            raise PublishInProgressError(
                f"the synthesis with idempotency key {key!r} was just charged by another "
                "request: retry with the same key to get its answer"
            ) from None
        return Replayed(stored)
    if claim is not None:  # renewed until the answer (the job's id) is stored
        context.leases.hold(actor_id, claim.key)
    try:
        job = context.synthesis_jobs.create(actor_id, source.id, entry.id, request.method)
    except BaseException:  # not answered: the lease lapses, and its retries learn it is lost
        if claim is not None:
            context.leases.release(actor_id, claim.key)
        raise

    def work(report: Reporter) -> dict[str, Any]:
        done = _run(context, actor_id, source, plan, request, rows, name, entry, after, report)
        return answer(done)

    context.synthesis_jobs.launch(job, work)
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

"""Publishing: decide from public metadata, charge, then evaluate, noise and release.

Order of events, each for a reason:

1. read the caller's account (a deactivated one is told nothing but that: see below) and
   check the epsilon and delta asked for;
2. decode and plan the graph (quotas refuse it before any data is read or allocated);
3. resolve its inputs' public metadata — dataset columns' declared bounds and subject
   structure, public model weights — and check that the caller may use each;
4. track the sensitivity and plan the noise (:func:`dpnode.core.privacy.release.plan_release`):
   a graph the tracker cannot bound is refused here, without being evaluated;
5. charge the budget in one serialised transaction with its ledger row: the policy, the
   rate limit, approvals and the budget decide here;
6. only then read the private columns, evaluate with total kernels, clip every output to
   its public bounds and noise it (:func:`dpnode.core.privacy.release.run_release`);
7. return the noised values; with ``DPNODE_PUBLISH_TIME_QUANTUM_SECONDS`` set, no earlier
   than the padded time :func:`answer_delay` gives (the route waits for it).

With a Dask cluster configured (``DPNODE_DASK_SCHEDULER``), a large publish that only sums
over its rows is evaluated in 6 on the cluster's workers, which read the columns themselves
(:mod:`dpnode.node.cluster`); the noise is still drawn here. Whether it goes there is decided
after 3 from public metadata, and the cluster is checked before 5: out of reach, the publish
is refused (``503 evaluation_unavailable``) with nothing charged.

Every refusal (1 to 5) happens before a private value is read, so what a refused
publish shows — its error type, code, message and time — cannot depend on the data.
After 5, a publish is always answered with a noised result: a failure there still
costs the charge, is recorded in the audit log for the operator, and is not reported to
the analyst (docs/privacy.md, the threat model).

1 to 3 share one read-only transaction (on SQLite a deferred one, which locks nothing), but
on datasets this process has computed on before (``context.known_datasets``,
:class:`dpnode.node.services.datasets.KnownDatasets`): then no transaction comes before 5,
which checks the account and that every dataset still exists, and any refusal before it
checks the account first, so that a deactivated account is told nothing else. No database
transaction is open during 4 and 6.

A publish may come with an idempotency key (``dpnode.node.services.idempotency``). A retry with a
key already answered is answered, right after 1, with the stored answer: nothing is
planned, evaluated or charged. Otherwise 5 claims the key with the ledger row, so that
copies of one request racing each other are charged once; the caller stores the encoded
answer (:func:`answered`) once it is sent.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import and_, bindparam, select
from sqlalchemy.orm import Session

from dpnode.core.dp.mechanisms import gaussian_scale, laplace_scale, plan_gaussian
from dpnode.core.engine import (
    Graph,
    Plan,
    Quotas,
    WireLimits,
    content_hash,
    encode,
    plan,
    structure_hash,
)
from dpnode.core.engine.listing import listing
from dpnode.core.engine.subnormals import flush
from dpnode.core.engine.wire import Layout, decode_layout, hollow_constants, rebind
from dpnode.core.errors import (
    DPNodeError,
    GraphError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    PublishInProgressError,
)
from dpnode.core.inputs import INPUT
from dpnode.core.privacy import InputSpec, PrivacyReport, Subjects, track
from dpnode.core.privacy.release import ReleasePlan, output_ranges, plan_release, run_release
from dpnode.core.privacy.subjects import first_rows
from dpnode.core.structures import Found
from dpnode.node.cluster import Column, columns_for
from dpnode.node.context import NodeContext
from dpnode.node.db.models import MAX_ID, PublishKey, Role, User
from dpnode.node.services import (
    approvals,
    audit,
    budget,
    budget_status,
    costs,
    datasets,
    idempotency,
    models,
    users,
)
from dpnode.node.services.costs import DELTA_UNIT, EPSILON_UNIT, RHO_UNIT, TV_UNIT, Cost
from dpnode.node.services.release_plans import selection_key
from dpnode.node.storage import array_from_bytes


@dataclass(frozen=True)
class PublishRequest:
    epsilon: float
    #: None: Laplace (pure epsilon); a number: Gaussian, calibrated to (epsilon, delta).
    delta: float | None = None
    #: The planned training run this publish is a step of (``dpnode.node.services.runs``).
    run_id: int | None = None
    #: What the requester says it is for: shown to the admin who approves it, kept in the
    #: ledger row (at most ``approvals.MAX_DESCRIPTION`` characters).
    description: str = ""


@dataclass(frozen=True)
class Published:
    values: list[npt.NDArray[np.float64]]
    receipt: dict[str, Any]
    #: for the operator's audit log only (see :func:`record_failure`): never shown
    failure: str | None = None


@dataclass(frozen=True)
class Replayed:
    """The stored answer of a publish already answered under the same idempotency key."""

    body: bytes


@dataclass(frozen=True)
class _Inputs:
    specs: dict[str, InputSpec]
    #: public values (model weights, subject groups), read while resolving
    public: dict[str, npt.NDArray[Any]]
    #: private columns, read only once a release has been charged
    private: dict[str, tuple[datasets.ReadDataset, datasets.ReadColumn]]
    dataset_ids: list[int]
    #: how a listing of the computation calls each input (``dpnode.core.engine.listing``)
    labels: dict[str, str]

    def values(
        self, context: NodeContext, elsewhere: frozenset[str] = frozenset()
    ) -> dict[str, npt.NDArray[Any]]:
        """The inputs' values, but for the private columns read ``elsewhere`` (a cluster)."""
        out = dict(self.public)
        for name, (dataset, column) in self.private.items():
            if name not in elsewhere:
                out[name] = datasets.read_column(context.store, dataset, column)
        return out

    def stored(self) -> dict[str, Column]:
        """Where each private column is stored (public metadata: blob, dtype, shape)."""
        return {
            name: Column(column.blob, column.dtype, (dataset.row_count, *column.row_shape))
            for name, (dataset, column) in self.private.items()
        }


@dataclass(frozen=True)
class _Read:
    """A read transaction's session, and the account it read."""

    session: Session
    actor: users.Actor
    #: the account's row, with what is stored under the publish's idempotency key (if sent)
    account: Any = None


class _Unknown(Exception):
    """An input this process does not know yet: the publish reads the inputs in a transaction."""


def _resolve(context: NodeContext, read: _Read | None, graph: Graph) -> _Inputs:
    """Public metadata of every input the graph names (and where its values are): read in
    ``read``'s transaction, or with ``read`` None from what this process knows of the datasets
    (``context.known_datasets``), raising :class:`_Unknown` for anything else."""
    specs: dict[str, InputSpec] = {}
    public: dict[str, npt.NDArray[Any]] = {}
    private: dict[str, tuple[datasets.ReadDataset, datasets.ReadColumn]] = {}
    dataset_ids: set[int] = set()
    subjects: dict[int, npt.NDArray[np.int64] | None] = {}
    structures: dict[int, Subjects] = {}
    loaded: dict[int, datasets.ReadDataset] = {}  # one query per dataset
    labels: dict[str, str] = {}
    for name in graph.input_names():
        match = INPUT.fullmatch(name)
        if match is None:
            raise GraphError(
                f"input {name!r} names no data on this node: inputs are "
                "'dataset:<id>/<column>' or 'model:<id>/<tensor>'"
            )
        kind, ident, part = match.group(1), int(match.group(2)), match.group(3)
        if ident > MAX_ID:  # no such id (and beyond what the database can be asked)
            raise NotFoundError(f"no {kind} {ident}")
        if kind == "dataset":
            if ident not in loaded:
                known = context.known_datasets.get(ident)
                if known is None:
                    if read is None:
                        raise _Unknown
                    known = datasets.get_dataset_columns(read.session, ident)
                    context.known_datasets.keep(known)
                loaded[ident] = known
            dataset = loaded[ident]
            column = next((c for c in dataset.columns if c.name == part), None)
            if dataset.id not in subjects:  # one read per dataset, not per column
                subjects[dataset.id] = datasets.read_subjects(context.store, dataset)
                structures[dataset.id] = datasets.subject_structure(context.store, dataset)
            if column is None and part == "@subject":  # public: DP-SGD's clipping groups
                public[name] = first_rows(subjects[dataset.id], dataset.row_count)
                specs[name] = InputSpec.public(public[name])
                labels[name] = f"{dataset.name}.subjects  each row's subject (public)"
                dataset_ids.add(dataset.id)
                continue
            if column is None:
                raise NotFoundError(f"dataset {dataset.name!r} has no column {part!r}")
            specs[name] = InputSpec.private(column.lower, column.upper, structures[dataset.id])
            labels[name] = (
                f"{dataset.name}[{json.dumps(part)}]  bounds [{column.lower:g}, {column.upper:g}]"
            )
            private[name] = (dataset, column)
            dataset_ids.add(dataset.id)
            continue
        if read is None:  # a model's weights and who may use them: read each time
            raise _Unknown
        model = models.get_model(read.session, ident)
        tensor = next((t for t in model.tensors if t.name == part), None)
        if tensor is None:
            raise NotFoundError(f"model {model.name!r} has no tensor {part!r}")
        actor = read.actor
        if not model.is_public and actor.role is not Role.ADMIN and actor.id != model.owner_id:
            raise PermissionDeniedError(
                f"model {model.name!r} is private: publishing results computed from its "
                "weights is not supported yet; ask its owner to make it public"
            )
        weights = flush(  # the engine's arithmetic never meets a subnormal value
            array_from_bytes(context.store.get(tensor.blob), tensor.dtype, tuple(tensor.shape))
        )
        specs[name] = InputSpec.public(weights)
        public[name] = weights
        labels[name] = f"{model.name}[{json.dumps(part)}]  public weights"
    return _Inputs(specs, public, private, sorted(dataset_ids), labels)


@dataclass(frozen=True)
class _Template:
    """A header's validated plan (its constants hollow) and where its constants lie."""

    plan: Plan
    layout: Layout


def _decode(context: NodeContext, actor_id: int, found: Found) -> tuple[Graph, Plan]:
    """The graph of a body ``found`` in the structure cache, and its plan for a tracked
    evaluation (the quotas checked on it)."""
    s = context.settings
    limits = WireLimits(max_frame_bytes=s.max_upload_bytes, max_nodes=s.max_graph_nodes)
    template = found.template
    if isinstance(template, _Template):  # the header was decoded whole before: its constants
        graph = rebind(template.plan.graph, template.layout, found.frame, limits)
        planned = replace(template.plan, graph=graph)
        return graph, planned
    graph, layout = decode_layout(found.frame, limits)
    planned = plan(graph, _quotas(context), accurate=True)
    # kept without the constants' values: a training step's template holds no weights
    hollow = replace(planned, graph=hollow_constants(graph))
    context.structures.remember(actor_id, found, _Template(hollow, layout))
    return graph, planned


def _quotas(context: NodeContext) -> Quotas:
    s = context.settings
    return Quotas(
        max_nodes=s.max_graph_nodes,
        max_total_bytes=s.max_graph_memory_bytes,
        max_flops=s.max_graph_flops,
    )


def sensitivity(context: NodeContext, actor_id: int, frame: bytes) -> PrivacyReport:
    """The sensitivity of a graph's outputs, from public metadata only: free, no data read.

    Raises:
        AuthenticationError: the account no longer exists or was deactivated.
        InvalidRequestError: an output is infinite or NaN whatever the data, which a
            publish refuses too (its bounds are not numbers).
    """
    with context.read_sessions() as session:
        actor = users.active_actor(session, actor_id)
        found = context.structures.find(actor.id, frame)  # a reference names its frame
        graph, planned = _decode(context, actor.id, found)
        inputs = _resolve(context, _Read(session, actor), graph)
    report = track(planned, inputs.specs)
    output_ranges(planned, report)  # refused as a publish of it is (JSON has no NaN)
    return report


def _float_at_most(x: Fraction) -> float:
    """The largest float not above ``x``: a mechanism calibrated to it spends at most ``x``.

    >>> _float_at_most(Fraction(1, 10)) <= Fraction(1, 10)
    True
    """
    f = float(x)
    return f if Fraction(f) <= x else math.nextafter(f, 0.0)


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not (math.isfinite(delta) and 0 < delta < 1):
        raise InvalidRequestError(f"delta must be a number in (0, 1), got {delta!r}")
    return delta


#: How a listing names the sensitivity each mechanism is calibrated to.
_SENSITIVITY = {"laplace": "L1 sensitivity", "gaussian": "L2 sensitivity"}


def _release_note(rp: ReleasePlan) -> str:
    """What a listing's release line says: shapes, sensitivity, mechanism and noise scale."""
    noise = rp.noise
    shapes = ", ".join(str(tuple(o.shape)) for o in rp.report.outputs)
    kind = _SENSITIVITY.get(noise.mechanism, "sensitivity")
    return (
        f"{'shape' if len(rp.report.outputs) == 1 else 'shapes'} {shapes}, "
        f"{kind} {noise.sensitivity:.4g}, {noise.mechanism} scale {noise.scale:.4g}"
    )


def _cost(rp: ReleasePlan, request: PublishRequest, inputs: _Inputs, planned: Plan) -> Cost:
    """What the planned release costs, in ledger units: from the plan, never the values."""
    noise = rp.noise
    graph = planned.graph
    if noise.mechanism != "gaussian":  # Laplace noise or a selection: pure epsilon
        cost = Cost(
            noise.mechanism,
            epsilon_units=int(costs.quantize_epsilon(request.epsilon) / EPSILON_UNIT),
        )
    else:
        cost = Cost("gaussian", rho_units=costs.units_up(noise.rho, RHO_UNIT, "rho"))
    return replace(
        cost,
        tv_units=costs.units_up(noise.sampler_tv, TV_UNIT, "sampler deviation"),
        dataset_ids=inputs.dataset_ids,
        graph_hash=structure_hash(graph),
        detail={
            "sensitivity": noise.sensitivity,
            "scale": noise.scale,
            "outputs": [list(o.shape) for o in rp.report.outputs],
            **({"description": request.description} if request.description else {}),
        },
        # What the policy's per-publish caps and approval thresholds compare against, and
        # the exact computation (constants included) an admin's approval covers, computed
        # only when the policy gates publishes.
        asked_epsilon_units=costs.units_down(request.epsilon, EPSILON_UNIT, "epsilon"),
        asked_delta_units=0 if request.delta is None else costs.delta_asked_units(request.delta),
        frame_hash=lambda: content_hash(encode(graph)),
        run_id=request.run_id,
        computation=lambda: listing(planned, inputs.labels, release=_release_note(rp)),
        description=request.description,
    )


def gaussian_cost(epsilon: float, delta: float, values: int) -> Cost:
    """What a Gaussian publish of ``values`` values at ``(epsilon, delta)`` is charged, as
    :func:`publish` computes it from its release plan (the same calibration, the same
    rounding): what each step of a training run costs, known before the run starts.

    Raises:
        InvalidRequestError: a bad epsilon, delta or number of values.

    >>> c = gaussian_cost(0.5, 1e-6, 10)
    >>> c.mechanism, c.rho_units > 0, costs.gaussian_count(c.tv_units)
    ('gaussian', True, 10)
    """
    charged = costs.quantize_epsilon(epsilon)
    _check_delta(delta)
    if isinstance(values, bool) or not isinstance(values, int) or values < 1:
        raise InvalidRequestError(f"values must be a whole number >= 1, got {values!r}")
    noise = plan_gaussian(
        sensitivity_l2=1.0, count=values, epsilon=_float_at_most(charged), delta=delta
    )
    return Cost(
        "gaussian",
        rho_units=costs.units_up(noise.rho, RHO_UNIT, "rho"),
        tv_units=costs.units_up(noise.sampler_tv, TV_UNIT, "sampler deviation"),
        asked_epsilon_units=costs.units_down(epsilon, EPSILON_UNIT, "epsilon"),
        asked_delta_units=costs.delta_asked_units(delta),
    )


@dataclass(frozen=True)
class _Prepared:
    """A publish's graph and inputs, decoded and resolved (steps 2 and 3)."""

    charged: Fraction
    claim: idempotency.Claim | None
    graph: Graph
    planned: Plan
    inputs: _Inputs
    #: the whole graph frame (constants included), which keys a quantile release's plan
    frame: bytes


@dataclass(frozen=True)
class _Decided:
    """A publish decided from public metadata (step 4): what to charge, where to evaluate."""

    claim: idempotency.Claim | None
    inputs: _Inputs
    rp: ReleasePlan
    cost: Cost
    #: the graph's columns the Dask cluster reads (``None``: evaluated here), its threads
    columns: Any
    threads: int


def _read_account(session: Session, actor_id: int, key: str | None) -> _Read:
    """The caller's account in ``session`` (and what is stored under ``key``).

    Raises:
        AuthenticationError: the account no longer exists or was deactivated.
    """
    if key is None:
        return _Read(session, users.active_actor(session, actor_id))
    values = {"user_id": actor_id, "key": key}  # the account and the key: one statement
    account = session.connection().execute(_ACCOUNT_AND_KEY, values).first()
    return _Read(session, users.actor_of(account), account)


def _prepare(
    context: NodeContext,
    actor_id: int,
    frame: bytes,
    request: PublishRequest,
    key: str | None,
    read: _Read | None,
) -> _Prepared | Replayed:
    """Check the privacy parameters, decode and plan the graph and resolve its inputs (in
    ``read``'s transaction, or from what this process knows: see :func:`_resolve`). A key
    answered already is answered from ``read``'s account row."""
    charged = costs.quantize_epsilon(request.epsilon)  # a bad epsilon, before any work
    approvals.check_description(request.description)
    if request.delta is not None:
        _check_delta(request.delta)
    found = context.structures.find(actor_id, frame)  # a reference names its frame
    claim = None
    if key is not None:
        digest = idempotency.request_hash(
            found.frame, request.epsilon, request.delta, request.run_id
        )
        claim = idempotency.Claim(key, digest)
        stored = None if read is None else idempotency.answer_of(read.account, claim)
        if stored is not None:  # answered already: released, nothing new to decide
            return Replayed(stored)
    graph, planned = _decode(context, actor_id, found)
    inputs = _resolve(context, read, graph)
    return _Prepared(charged, claim, graph, planned, inputs, found.frame)


def _plan(context: NodeContext, request: PublishRequest, prepared: _Prepared) -> _Decided:
    """Track the graph, plan the noise and the cost, and where it is evaluated (step 4)."""
    inputs = prepared.inputs
    epsilon = _float_at_most(prepared.charged)
    key = selection_key(prepared.frame, prepared.graph, epsilon, request.delta)
    rp = None if key is None else context.selections.get(key)
    if rp is None:
        rp = plan_release(
            prepared.planned,
            inputs.specs,
            epsilon=epsilon,
            delta=request.delta,
            tracked=context.tracking.report,
        )
        if key is not None and rp.selection is not None:  # public: kept for the same request
            context.selections.add(key, rp)
    cost = _cost(rp, request, inputs, prepared.planned)
    # where it is evaluated: decided from public metadata, the cluster checked before the charge
    cluster = context.cluster
    columns = None
    if cluster is not None and rp.selection is None and rp.keys is None:
        columns = columns_for(context.settings, rp.plan, inputs.stored())
    threads = cluster.check() if cluster is not None and columns is not None else 0
    return _Decided(prepared.claim, inputs, rp, cost, columns, threads)


def _decide(
    context: NodeContext,
    actor_id: int,
    frame: bytes,
    request: PublishRequest,
    key: str | None,
) -> _Decided:
    """Steps 2 to 4 from what this process knows of the inputs, without a transaction.

    Raises:
        _Unknown: an input it does not know: the caller reads them.
    """
    prepared = _prepare(context, actor_id, frame, request, key, None)
    assert not isinstance(prepared, Replayed)  # a key's answer is read with the account
    return _plan(context, request, prepared)


#: The account as :func:`users.actor_of` reads it, with what is stored under the publish's
#: idempotency key (NULLs: unused).
_ACCOUNT_AND_KEY = (
    select(*users.ACTOR, *idempotency.ANSWER)
    .outerjoin(PublishKey, and_(PublishKey.user_id == User.id, PublishKey.key == bindparam("key")))
    .where(User.id == bindparam("user_id"))
)


def publish(
    context: NodeContext,
    actor_id: int,
    frame: bytes,
    request: PublishRequest,
    key: str | None = None,
) -> Published | Replayed:
    """Decide, charge, then evaluate, noise and release (see the module docstring).

    ``actor_id`` comes from a verified token; the account is read with the inputs, or
    checked by the charge (see the module docstring). ``key``:
    the request's idempotency key; a retry of a request already answered under it gets
    that answer (:class:`Replayed`), neither evaluated nor charged again.

    Raises (each before any private value is read):
        AuthenticationError: the account no longer exists or was deactivated; nothing is done.
        InvalidRequestError: a malformed idempotency key.
        PublishInProgressError: the key's publish was charged and is not answered yet.
        ConflictError: the key names another request of this user.
        GraphError, QuotaExceededError: a graph the engine refuses.
        PrivacyTrackingError: a graph whose sensitivity cannot be bounded.
        InvalidRequestError: a bad epsilon or delta.
        EvaluationUnavailableError: the publish is one for the node's Dask cluster, which
            cannot be reached or has no worker; nothing is charged.
        PolicyRefusedError, BudgetExceededError, ApprovalRequiredError: the policy or the
            budget refuses the charge; nothing is released.
        NotFoundError: a dataset was deleted since it was read; nothing is charged.
    """
    if key is not None:
        idempotency.check_key(key)
    try:  # from the inputs this process knows: no transaction before the charge's
        decided = _decide(context, actor_id, frame, request, key)
    except _Unknown:  # the account, then the inputs: one read
        with context.read_sessions() as session:
            read = _read_account(session, actor_id, key)
            prepared = _prepare(context, actor_id, frame, request, key, read)
        if isinstance(prepared, Replayed):
            return prepared
        decided = _plan(context, request, prepared)
    except DPNodeError:  # refused from public metadata: said only to an active account
        with context.read_sessions() as session:
            users.active_actor(session, actor_id)
        raise
    claim, inputs, rp, cost = decided.claim, decided.inputs, decided.rp, decided.cost
    cluster, columns, threads = context.cluster, decided.columns, decided.threads
    try:
        entry, after = budget.charge(
            context.serial_sessions,
            context.settings,
            actor_id,
            cost,
            claim=claim,
            mark=context.mark,
        )
    except NotFoundError:  # a dataset deleted since it was read: nothing was charged
        context.known_datasets.forget(inputs.dataset_ids)
        raise
    except idempotency.AlreadyClaimed:  # a copy of this request was charged, or answered
        assert claim is not None
        with context.read_sessions() as session:
            stored = idempotency.replay(session, actor_id, claim)
        if stored is None:  # its key expired between the two reads
            raise PublishInProgressError(
                f"the publish with idempotency key {key!r} was just charged by another "
                "request: retry with the same key to get its answer"
            ) from None
        return Replayed(stored)
    # Charged: from here on the data is read, and the publish is always answered.
    if claim is not None:  # renewed until the answer is stored (answered)
        context.leases.hold(actor_id, claim.key)
    try:
        if cluster is not None and columns is not None:
            names = frozenset(str(rp.plan.graph.nodes[i].attrs["name"]) for i in columns)
            runner = cluster.runner(rp.plan, columns, threads)
            done = run_release(rp, lambda: inputs.values(context, names), runner=runner)
        else:
            done = run_release(rp, lambda: inputs.values(context))
    except BaseException:  # not answered: the lease lapses, and its retries learn it is lost
        if claim is not None:
            context.leases.release(actor_id, claim.key)
        raise
    release = done.release
    receipt = {
        "ledger_id": entry.id,
        "mechanism": release.mechanism,
        # what this release took from the budget, as client.budget() and the ledger count it
        **budget_status.receipt_terms(
            entry, after, asked_epsilon=request.epsilon, asked_delta=request.delta
        ),
        "sensitivity": release.sensitivity,
        "sensitivity_l1": rp.report.l1,
        "sensitivity_l2": rp.report.l2,
        "noise_scale": release.scale,
        "grid_exponent": release.grid_exponent,
        "sampler_tv": release.sampler_tv,
        # post-processing: noised values moved to the nearer end of their public range
        "clipped": done.clipped,
        # post-processing: symmetric matrices (X.T @ X) made symmetric again after the noise
        "symmetrized": done.symmetrized,
        "policy": after.in_force.name,
        "policy_revision": entry.policy_revision,
    }
    if rp.keys is not None:  # keys kept above a noisy threshold (docs/privacy.md)
        # the ledger's direct delta holds the threshold's (as asked) and the sampler's
        sampler = max(entry.tv_units - cost.asked_delta_units, 0)
        receipt["sampler_delta"] = float(sampler * DELTA_UNIT)
        receipt["threshold"] = rp.keys.plan.threshold
        receipt["threshold_delta"] = rp.keys.plan.bad
        receipt["rows_moved"] = rp.keys.plan.rows_moved
    return Published(done.values, receipt, done.failure)


def answered(context: NodeContext, actor_id: int, key: str, response: bytes) -> None:
    """Store a publish's encoded answer under its idempotency key, for its retries. Called
    once the answer is sent (the route's background task): a retry that arrives before is
    told the publish still runs (``publish_in_progress``) and waits for this. Not stored
    (the exception is the caller's), the key's lease lapses: its retries are told it is
    lost (``publish_lost``)."""
    try:
        idempotency.store(context.relaxed_sessions, actor_id, key, response)
    finally:
        context.leases.release(actor_id, key)


def answer_delay(quantum: float, elapsed: float) -> float:
    """How long to hold a charged publish's answer, ready ``elapsed`` seconds after its request
    arrived, so that it goes out at ``quantum * 2^k`` seconds, the smallest such time with
    ``k >= 0`` not before it is ready; 0 without a quantum.

    The evaluation on private values takes part of ``elapsed``. Its time is then shown only
    through ``k``: nothing while it fits in ``quantum``, and only which doubling it needed
    beyond (docs/privacy.md, "What an answered publish's time shows").

    >>> answer_delay(0.5, 0.1), answer_delay(0.5, 0.5), answer_delay(0.5, 0.75)
    (0.4, 0.0, 0.25)
    >>> answer_delay(0.0, 0.1), answer_delay(0.5, 3.0)
    (0.0, 1.0)
    """
    if quantum <= 0:
        return 0.0
    at = quantum
    while at < elapsed:
        at *= 2
    return at - elapsed


def let_go(context: NodeContext, actor_id: int, key: str) -> None:
    """A charged publish's answer could not be made: stop renewing its key's lease."""
    context.leases.release(actor_id, key)


def record_failure(context: NodeContext, actor_id: int, published: Published) -> None:
    """Tell the operator, in the audit log, that a charged publish was answered with its
    public stand-ins. Called after the answer has gone (its time must not show)."""
    if published.failure is None:
        return
    with context.sessions() as session:
        actor = session.get(User, actor_id)
        audit.record(
            session,
            actor,
            "publish.evaluation_failed",
            target_type="ledger",
            target_id=published.receipt["ledger_id"],
            error=published.failure,
        )
        session.commit()


def noise_scale(report: PrivacyReport, request: PublishRequest) -> float:
    """The noise scale a publish would use (Laplace b, or Gaussian sigma), exactly: on the
    integers for outputs proven integral, as :func:`~dpnode.core.privacy.release.plan_release`
    plans them."""
    epsilon = _float_at_most(costs.quantize_epsilon(request.epsilon))
    count = sum(int(np.prod(o.shape, dtype=np.int64)) for o in report.outputs)
    whole = report.integral
    if request.delta is None:
        return laplace_scale(sensitivity_l1=report.l1, epsilon=epsilon, count=count, integral=whole)
    delta = _check_delta(request.delta)
    return gaussian_scale(
        sensitivity_l2=report.l2, count=count, epsilon=epsilon, delta=delta, integral=whole
    )

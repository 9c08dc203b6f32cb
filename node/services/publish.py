"""Publishing: evaluate a graph on private data, noise it, charge the budget, release.

Order of events, each for a reason:

1. read the caller's account (a deactivated one is refused before any work) and check
   the epsilon and delta asked for;
2. decode and plan the graph (quotas refuse it before any data is read or allocated);
3. resolve its inputs — dataset columns with their declared bounds and subject
   structure, public model weights — and check that the caller may use each;
4. evaluate and track sensitivity in one engine pass (the sensitivity comes from
   public metadata only, so the price never depends on the data);
5. clip every output to the bounds the tracker derived (public) and noise it with the
   mechanism calibrated to exactly the epsilon that will be charged;
6. charge the budget in one serialised transaction with its ledger row;
7. only then return the noised values. A refusal at 6 releases nothing.

1 to 3 share one read-only transaction (on SQLite a deferred one, which locks nothing).
No database transaction is open during 4 and 5.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from node.context import NodeContext
from node.db.models import Dataset, Role, User
from node.dp import gaussian, laplace
from node.dp.mechanisms import Release, gaussian_scale, laplace_scale
from node.engine import (
    Graph,
    Plan,
    Quotas,
    WireLimits,
    content_hash,
    decode,
    encode,
    plan,
    structure_hash,
)
from node.errors import GraphError, InvalidRequestError, NotFoundError, PermissionDeniedError
from node.privacy import InputSpec, PrivacyReport, Subjects, evaluate_tracked, track
from node.privacy.subjects import first_rows
from node.services import budget, datasets, models, users
from node.services.budget import EPSILON_UNIT, RHO_UNIT, TV_UNIT, Cost
from node.storage import array_from_bytes

_INPUT = re.compile(r"^(dataset|model):(\d+)/(.+)$")


@dataclass(frozen=True)
class PublishRequest:
    epsilon: float
    #: None: Laplace (pure epsilon); a number: Gaussian, calibrated to (epsilon, delta).
    delta: float | None = None


@dataclass(frozen=True)
class Published:
    values: list[npt.NDArray[np.float64]]
    receipt: dict[str, Any]


@dataclass(frozen=True)
class _Inputs:
    specs: dict[str, InputSpec]
    values: dict[str, npt.NDArray[Any]]
    dataset_ids: list[int]


def _resolve(
    context: NodeContext, session: Session, actor: User, graph: Graph, *, with_values: bool
) -> _Inputs:
    """Public metadata (and, to evaluate, the values) of every input the graph names."""
    specs: dict[str, InputSpec] = {}
    values: dict[str, npt.NDArray[Any]] = {}
    dataset_ids: set[int] = set()
    subjects: dict[int, npt.NDArray[np.int64] | None] = {}
    structures: dict[int, Subjects] = {}
    loaded: dict[int, Dataset] = {}  # one query per dataset
    for name in graph.input_names():
        match = _INPUT.match(name)
        if match is None:
            raise GraphError(
                f"input {name!r} names no data on this node: inputs are "
                "'dataset:<id>/<column>' or 'model:<id>/<tensor>'"
            )
        kind, ident, part = match.group(1), int(match.group(2)), match.group(3)
        if kind == "dataset":
            if ident not in loaded:
                loaded[ident] = datasets.get_dataset_columns(session, ident)
            dataset = loaded[ident]
            column = next((c for c in dataset.columns if c.name == part), None)
            if dataset.id not in subjects:  # one read per dataset, not per column
                subjects[dataset.id] = datasets.read_subjects(context.store, dataset)
                structures[dataset.id] = datasets.subject_structure(context.store, dataset)
            if column is None and part == "@subject":  # public: DP-SGD's clipping groups
                values[name] = first_rows(subjects[dataset.id], dataset.row_count)
                specs[name] = InputSpec.public(values[name])
                dataset_ids.add(dataset.id)
                continue
            if column is None:
                raise NotFoundError(f"dataset {dataset.name!r} has no column {part!r}")
            specs[name] = InputSpec.private(column.lower, column.upper, structures[dataset.id])
            dataset_ids.add(dataset.id)
            if with_values:
                values[name] = datasets.read_column(context.store, dataset, column)
            continue
        model = models.get_model(session, ident)
        tensor = next((t for t in model.tensors if t.name == part), None)
        if tensor is None:
            raise NotFoundError(f"model {model.name!r} has no tensor {part!r}")
        if not model.is_public and actor.role is not Role.ADMIN and actor.id != model.owner_id:
            raise PermissionDeniedError(
                f"model {model.name!r} is private: publishing results computed from its "
                "weights is not supported yet; ask its owner to make it public"
            )
        weights = array_from_bytes(
            context.store.get(tensor.blob), tensor.dtype, tuple(tensor.shape)
        )
        specs[name] = InputSpec.public(weights)
        values[name] = weights
    return _Inputs(specs, values, sorted(dataset_ids))


def _decode(context: NodeContext, actor: User, body: bytes) -> tuple[Graph, Plan]:
    """The graph, and its plan for a tracked evaluation (the quotas checked on it)."""
    s = context.settings
    limits = WireLimits(max_frame_bytes=s.max_upload_bytes, max_nodes=s.max_graph_nodes)
    frame = context.structures.expand(actor.id, body)  # a reference to a header sent before
    graph = decode(frame, limits)
    planned = plan(graph, _quotas(context), accurate=True)
    context.structures.remember(actor.id, frame)
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
    """
    with context.read_sessions() as session:
        actor = users.active(session, actor_id)
        graph, planned = _decode(context, actor, frame)
        inputs = _resolve(context, session, actor, graph, with_values=False)
    return track(planned, inputs.specs)


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


def _noise(
    values: npt.NDArray[np.float64], report: PrivacyReport, request: PublishRequest
) -> tuple[Release, Cost]:
    charged = budget.quantize_epsilon(request.epsilon)
    epsilon = _float_at_most(charged)
    if request.delta is None:
        release = laplace(values, sensitivity_l1=report.l1, epsilon=epsilon)
        cost = Cost("laplace", epsilon_units=int(charged / EPSILON_UNIT))
    else:
        delta = _check_delta(request.delta)
        release = gaussian(values, sensitivity_l2=report.l2, epsilon=epsilon, delta=delta)
        cost = Cost("gaussian", rho_units=budget.units_up(release.rho, RHO_UNIT, "rho"))
    tv_units = budget.units_up(release.sampler_tv, TV_UNIT, "sampler deviation")
    return release, Cost(cost.mechanism, cost.epsilon_units, cost.rho_units, tv_units)


def publish(
    context: NodeContext, actor_id: int, frame: bytes, request: PublishRequest
) -> Published:
    """Evaluate, noise, charge and release, in that order (see the module docstring).

    ``actor_id`` comes from a verified token; the account is read with the inputs.

    Raises:
        AuthenticationError: the account no longer exists or was deactivated; nothing is done.
        GraphError, QuotaExceededError: a graph the engine refuses, before any data is read.
        PrivacyTrackingError: a graph whose sensitivity cannot be bounded.
        InvalidRequestError: a bad epsilon or delta.
        BudgetExceededError: the release does not fit the budget; nothing is released.
    """
    with context.read_sessions() as session:  # the account, then the inputs: one read
        actor = users.active(session, actor_id)
        budget.quantize_epsilon(request.epsilon)  # refuse a bad epsilon or delta before work
        if request.delta is not None:
            _check_delta(request.delta)
        graph, planned = _decode(context, actor, frame)
        inputs = _resolve(context, session, actor, graph, with_values=True)
    outputs, report = evaluate_tracked(planned, inputs.values, inputs.specs)
    release, cost = _noise(report.clip(outputs), report, request)
    cost = Cost(
        cost.mechanism,
        cost.epsilon_units,
        cost.rho_units,
        cost.tv_units,
        dataset_ids=inputs.dataset_ids,
        graph_hash=structure_hash(graph),
        detail={
            "sensitivity": release.sensitivity,
            "scale": release.scale,
            "outputs": [list(o.shape) for o in report.outputs],
        },
        # What the policy's per-publish caps and approval thresholds compare against, and
        # the exact computation (constants included) an admin's approval covers, computed
        # only when the policy gates publishes.
        asked_epsilon_units=budget.units_down(request.epsilon, EPSILON_UNIT, "epsilon"),
        asked_delta_units=0
        if request.delta is None
        else budget.units_down(request.delta, budget.DELTA_UNIT, "delta"),
        frame_hash=lambda: content_hash(encode(graph)),
    )
    entry, after = budget.charge(context.serial_sessions, context.settings, actor.id, cost)
    pieces = report.split(release.values)
    spent_epsilon, _ = after.spent()
    receipt = {
        "ledger_id": entry.id,
        "mechanism": release.mechanism,
        "epsilon": float(budget.quantize_epsilon(request.epsilon)),
        "delta": request.delta,
        "rho": float(cost.rho_units * RHO_UNIT),
        "sensitivity": release.sensitivity,
        "sensitivity_l1": report.l1,
        "sensitivity_l2": report.l2,
        "noise_scale": release.scale,
        "grid_exponent": release.grid_exponent,
        "sampler_tv": release.sampler_tv,
        "remaining_epsilon": after.remaining_epsilon,
        "spent_epsilon": spent_epsilon,
        "policy": after.in_force.name,
        "policy_revision": entry.policy_revision,
    }
    return Published(pieces, receipt)


def noise_scale(report: PrivacyReport, request: PublishRequest) -> float:
    """The noise scale a publish would use (Laplace b, or Gaussian sigma), exactly."""
    epsilon = _float_at_most(budget.quantize_epsilon(request.epsilon))
    count = sum(int(np.prod(o.shape, dtype=np.int64)) for o in report.outputs)
    if request.delta is None:
        return laplace_scale(sensitivity_l1=report.l1, epsilon=epsilon, count=count)
    delta = _check_delta(request.delta)
    return gaussian_scale(sensitivity_l2=report.l2, count=count, epsilon=epsilon, delta=delta)

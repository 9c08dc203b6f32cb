"""publish in mock mode: the node's release, computed locally on mock data, charging nothing.

Inside ``with sdk.mock(ds):`` a script's ``t.publish(...)`` and ``sdk.publish_grads(...)``
run exactly what the node would run — the engine evaluates the graph, the privacy
tracker derives the sensitivity from the dataset's public bounds, the outputs are
clipped to their tracked bounds and noised by the node's own mechanisms — on the
mock data instead of the real data. Nothing is sent and no budget is spent, so a
whole training loop can be dry-run before it costs anything. Mock rows stand for
distinct subjects unless the mock data carries the dataset's subject column.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from dpnode.core import errors as node_errors
from dpnode.core.engine import plan
from dpnode.core.inputs import INPUT
from dpnode.core.privacy import InputSpec
from dpnode.core.privacy.release import plan_release, run_release
from dpnode.core.privacy.subjects import first_rows
from dpnode.sdk._exceptions import DPNodeError, error_for
from dpnode.sdk._remote import RemoteTensor, graph_for

if TYPE_CHECKING:
    from dpnode.sdk._remote.mock import MockSession

__all__ = ["mock_inputs", "mock_release"]


def mock_inputs(
    session: MockSession, tensors: Sequence[torch.Tensor], names: Sequence[str]
) -> tuple[dict[str, InputSpec], dict[str, npt.NDArray[Any]]]:
    """The privacy specs and mock values of the inputs ``names`` of a graph computing
    ``tensors``, found on the node their data comes from (ids are per node).

    Raises:
        DPNodeError: an input the session does not mock, or data of several nodes.
    """
    from dpnode.sdk._handles import DatasetHandle

    node = session.node_for(tensors)
    bindings = session.bindings(node)
    specs: dict[str, InputSpec] = {}
    values: dict[str, npt.NDArray[Any]] = {}
    for name in names:
        match = INPUT.fullmatch(name)  # as the node reads it
        handle = session.handle(match.group(1), int(match.group(2)), node) if match else None
        if match is None or handle is None:
            raise DPNodeError(
                f"no mock values for {name!r}{f' of {node}' if node else ''}; pass its "
                "dataset or model to sdk.mock(...)"
            )
        part = match.group(3)
        if not isinstance(handle, DatasetHandle):
            values[name] = bindings[name]
            specs[name] = InputSpec.public(values[name])
            continue
        frame = session._frame(handle)
        rows = len(next(iter(frame.values()))) if frame else 0
        ids = frame.get(handle.subject_id) if handle.subject_id else None
        if part == "@subject":
            values[name] = first_rows(ids, rows)
            specs[name] = InputSpec.public(values[name])
            continue
        lower, upper = handle.columns[part].bounds
        subjects = first_rows(ids, rows) if ids is not None else None
        specs[name] = InputSpec.private(lower, upper, subjects)
        values[name] = bindings[name]
    return specs, values


def mock_release(
    session: MockSession, tensors: list[RemoteTensor], *, epsilon: float, delta: float | None
) -> tuple[list[npt.NDArray[np.float64]], dict[str, Any]]:
    """The outputs and the receipt (as the node would send it) of a publish on mock data."""
    graph = graph_for(tensors)
    try:
        specs, values = mock_inputs(session, tensors, graph.input_names())
        planned = plan_release(plan(graph, accurate=True), specs, epsilon=epsilon, delta=delta)
    except node_errors.DPNodeError as exc:  # the node's own checks, raised as the SDK's
        raise error_for(400, exc.code, exc.detail) from None
    done = run_release(planned, values, rng=np.random.default_rng(session.seed))
    if done.failure is not None:  # the node would answer all the same and tell its operator
        warnings.warn(
            f"the mock evaluation failed ({done.failure}); like the node, the release "
            "stands in public constants for the outputs",
            RuntimeWarning,
            stacklevel=3,
        )
    release, report = done.release, planned.report
    receipt = {
        "ledger_id": None,
        "mechanism": release.mechanism,
        "epsilon": epsilon,
        "delta": delta,
        "asked_epsilon": epsilon,
        "asked_delta": delta,
        "rho": release.rho if delta is not None else 0.0,
        "sensitivity_l1": report.l1,
        "sensitivity_l2": report.l2,
        "noise_scale": release.scale,
        "remaining_epsilon": math.nan,
        "clipped": done.clipped,
        "symmetrized": done.symmetrized,
        "mock": True,
    }
    return done.values, receipt

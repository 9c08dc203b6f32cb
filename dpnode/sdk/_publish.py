"""publish: the one request that turns recorded computations into noised numbers.

``t.publish(epsilon=...)`` encodes the graph of ``t`` (and of any tensors published
with it) in one pass, sends it in one HTTP request, and returns plain torch tensors
carrying a :class:`Receipt`. ``t.sensitivity()`` and ``t.noise_scale(...)`` ask the
node what a publish would cost without spending anything: the node derives both from
public metadata only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from dpnode.sdk import _per_sample as per_sample
from dpnode.sdk._display import dataclass_rows, fields_table
from dpnode.sdk._exceptions import DPNodeError, GraphError
from dpnode.sdk._mock_publish import mock_release
from dpnode.sdk._moment_calls import swap_moments
from dpnode.sdk._remote import (
    RemoteTensor,
    active_session,
    encode_graph,
    graph_for,
    origins,
    recorded_by,
)
from dpnode.sdk._synthetic_publish import synthetic_release

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle

__all__ = ["Receipt", "Sensitivity", "noise_scale", "publish", "publish_grads", "sensitivity"]


@dataclass(frozen=True)
class Receipt:
    """What a release cost and how it was noised."""

    #: the ledger row that paid for the release (None for a dry run in mock mode)
    ledger_id: int | None
    mechanism: str
    epsilon: float
    delta: float | None
    rho: float
    sensitivity_l1: float
    sensitivity_l2: float
    noise_scale: float
    remaining_epsilon: float
    #: what the publish asked for; ``epsilon``/``delta`` above are what it took from the
    #: budget (for a Gaussian release, the growth of the converted zCDP total)
    asked_epsilon: float | None = None
    asked_delta: float | None = None
    remaining_delta: float | None = None
    #: the node's policy that allowed the release, and its revision (None: the shipped default)
    policy: str | None = None
    policy_revision: int | None = None
    #: computed locally on mock data inside ``sdk.mock(...)``: nothing was charged
    mock: bool = False
    #: how many noised values lay outside their public range (a count in ``[0, n]``, a
    #: standard deviation ``>= 0``, ...) and were moved to its nearer end: free
    #: post-processing, never further from the true value
    clipped: int = 0
    #: how many outputs are symmetric matrices (``X.T @ X``, a covariance) whose noised
    #: values were averaged with their transpose: free post-processing, less noise
    symmetrized: int = 0
    #: a step of a training run: the run, its steps so far (of ``run_planned_steps``) and
    #: what they added to your budget together, in epsilon terms (the ledger's line for it)
    run_id: int | None = None
    run_steps: int | None = None
    run_planned_steps: int | None = None
    run_epsilon: float | None = None
    run_delta: float | None = None
    #: the tensor asked was computed here from what was released (``torch.cov`` and
    #: ``torch.corrcoef`` from the rows' moments): how, in a sentence
    post_processing: str | None = None
    #: keys released above a noisy threshold: the threshold, and the most probability of
    #: releasing a key one subject alone holds (at most the delta asked)
    threshold: float | None = None
    threshold_delta: float | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Receipt:
        return cls(**{k: body[k] for k in cls.__dataclass_fields__ if k in body})

    def __str__(self) -> str:
        if self.mechanism == "threshold":  # keys kept above a noisy threshold
            noise = (
                f"keys whose noisy count is at least {self.threshold:g} (discrete Laplace of "
                f"scale {self.noise_scale:.4g} on counts of sensitivity "
                f"{self.sensitivity_l1:g}), delta {self.asked_delta}"
            )
        elif self.mechanism == "exponential":  # a quantile: selected, not noised
            noise = (
                "exponential mechanism over the public range (scale "
                f"{self.noise_scale:.4g} for a rank sensitivity of {self.sensitivity_l1:g})"
            )
        else:
            noise = (
                f"{self.mechanism} noise of scale {self.noise_scale:.4g} for sensitivity "
                f"{self.sensitivity_l1 if self.mechanism == 'laplace' else self.sensitivity_l2:.4g}"
            )
        if self.mock:
            return f"{noise}; dry run on mock data, epsilon {self.epsilon:g} not charged"
        asked = ""
        if self.asked_epsilon is not None and self.asked_epsilon != self.epsilon:
            asked = f" (asked {self.asked_epsilon:g})"
        run = ""
        if self.run_id is not None:
            run = (
                f"; run {self.run_id}: {self.run_steps} of {self.run_planned_steps} steps, "
                f"epsilon {self.run_epsilon:g} together"
            )
        then = f"; {self.post_processing}" if self.post_processing else ""
        return (
            f"{noise}; charged epsilon {self.epsilon:g}{asked}{run}; "
            f"{self.remaining_epsilon:g} remaining{then}"
        )

    def _repr_html_(self) -> str:
        return fields_table("receipt", [("summary", str(self)), *dataclass_rows(self)])


@dataclass(frozen=True)
class Sensitivity:
    """How far the outputs can move when one data subject's records change.

    ``rounding_l1``/``rounding_l2``: how much of ``l1``/``l2`` pays for the node's
    floating-point rounding rather than for the query itself (at most; see
    docs/sensitivity.md, "Floating-point rounding").
    """

    l1: float
    l2: float
    subjects: int
    rounding_l1: float = 0.0
    rounding_l2: float = 0.0


def _remote(tensors: RemoteTensor | Sequence[torch.Tensor], what: str) -> list[RemoteTensor]:
    items = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    if not items:
        raise DPNodeError(f"{what} needs at least one remote tensor")
    for t in items:
        if not isinstance(t, RemoteTensor):
            raise DPNodeError(
                f"{what} takes remote tensors; a local {type(t).__name__} has no private "
                "values to publish"
            )
    return items  # type: ignore[return-value]


def _not_in_mock_mode(what: str) -> None:
    if active_session() is not None:
        raise DPNodeError(
            f"{what} asks the node about the real data, which mock mode stands in for: "
            "call it outside 'with sdk.mock(...)'"
        )


def _client(client: Any, tensors: Sequence[RemoteTensor]) -> Any:
    """Where to send ``tensors``: ``client``, else the session their data came from."""
    if client is not None:
        return client
    found = origins([t.node for t in tensors])
    if len(found) > 1:
        raise DPNodeError(
            "these tensors come from datasets or models of different node sessions, and one "
            "publish goes to one node: publish them separately, or pass client="
        )
    if found:
        return found[0]
    from dpnode.sdk import current_client

    return current_client()


def _frame(tensors: list[RemoteTensor]) -> bytes:
    return encode_graph(graph_for(tensors)).frame


@contextmanager
def _naming_calls(tensors: list[RemoteTensor]) -> Iterator[None]:
    """A node's refusal of one of the graph's nodes (``node 12 (div): ...``) also names the
    torch call that recorded it, which is what the user wrote."""
    try:
        yield
    except GraphError as exc:
        call = recorded_by([t.node for t in tensors], exc.detail)
        if call is None:
            raise
        raise type(exc)(
            f"{exc.detail} [recorded by {call}]", status=exc.status, code=exc.code
        ) from exc


def _as_torch(value: np.ndarray[Any, Any], like: RemoteTensor) -> torch.Tensor:
    out = torch.from_numpy(np.array(value, dtype=np.float64, copy=True))
    # Noise makes every number real-valued: floating outputs keep their dtype,
    # integer and boolean ones (counts) come back as float64.
    return out.to(like.dtype) if like.dtype.is_floating_point else out


def publish(
    tensors: RemoteTensor | Sequence[torch.Tensor],
    *,
    epsilon: float,
    delta: float | None = None,
    client: Any = None,
    run_id: int | None = None,
    idempotency_key: str | None = None,
    description: str = "",
) -> Any:
    """Publish remote tensors jointly: one request, one charge, noised plain tensors back.

    Args:
        tensors: one remote tensor, or several (then a list comes back, in order).
        epsilon: privacy loss to spend (> 0).
        delta: leave out for the Laplace mechanism (pure epsilon); set it for the Gaussian
            mechanism, (epsilon, delta)-DP through zCDP.
        client: the node session (default: the last ``sdk.login``).
        run_id: the planned training run this publish is a step of (``client.plan_run``):
            its admin's approval covers the publish when it is one of the planned steps.
        idempotency_key: names this publish (default: a fresh random key); the same key
            again gets the first answer, charged once (see ``Client.publish_frame``).
        description: what the publish is for, in your words (at most 500 characters):
            an admin approving it reads it beside the computation; kept in your ledger.

    Returns:
        A torch tensor (or a list), each with a ``receipt`` attribute.

    Raises:
        BudgetExceededError: it does not fit your budget; nothing is released or charged.
        GraphError: the node cannot bound or run the computation (the message says why).
        NodeUnreachableError: no answer, even after retries: the publish may or may not have
            run; publishing again with ``idempotency_key=err.idempotency_key`` is safe.
    """
    asked = _remote(tensors, "publish")
    # a recorded torch.cov/corrcoef is released from its rows' moments (see _moment_calls)
    swap = swap_moments(asked, epsilon=epsilon, delta=delta, client=client)
    items, delta = swap.items, swap.delta
    session = active_session()
    graph = None if session is not None else graph_for(items)
    exact = None
    if graph is not None and run_id is None:  # not a training step, which the node counts
        exact = synthetic_release(_client(client, items), graph, epsilon=epsilon, delta=delta)
    if session is not None:  # a dry run: the node's release, on mock data, charging nothing
        values, body = mock_release(session, items, epsilon=epsilon, delta=delta)
    elif exact is not None:  # synthetic tables only: exact and free (see _synthetic_publish)
        values, body = exact
    else:
        assert graph is not None
        with _naming_calls(items):
            values, body = _client(client, items).publish_frame(
                encode_graph(graph).frame,
                epsilon=epsilon,
                delta=delta,
                run_id=run_id,
                idempotency_key=idempotency_key,
                description=description,
            )
    receipt = Receipt.from_json(body)
    results = []
    for value, like, finish in zip(values, items, swap.finish, strict=True):
        result = _as_torch(value, like)
        if finish is not None:
            results.append(finish(result, receipt))
            continue
        result.receipt = receipt  # type: ignore[attr-defined]
        results.append(result)
    return results[0] if isinstance(tensors, torch.Tensor) else results


def sensitivity_body(
    items: list[RemoteTensor],
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    client: Any = None,
) -> dict[str, Any]:
    """The node's free ``/sensitivity`` answer for publishing ``items`` together (their
    bounds, sensitivities, and the noise scale at ``epsilon`` if given)."""
    graph = graph_for(items)
    # an answer on datasets alone never changes: the client keeps it
    keep = not any(name.startswith("model:") for name in graph.input_names())
    with _naming_calls(items):
        body: dict[str, Any] = _client(client, items).sensitivity_of_frame(
            encode_graph(graph).frame, epsilon=epsilon, delta=delta, keep=keep
        )
    return body


def sensitivity(
    tensors: RemoteTensor | Sequence[torch.Tensor], *, client: Any = None
) -> Sensitivity:
    """The L1 and L2 sensitivity of publishing ``tensors`` together: free, no budget spent."""
    _not_in_mock_mode("sensitivity()")
    items = swap_moments(
        _remote(tensors, "sensitivity"), epsilon=1.0, delta=None, client=client
    ).items
    body = sensitivity_body(items, client=client)
    outputs = body["outputs"]
    return Sensitivity(
        l1=body["l1"],
        l2=body["l2"],
        subjects=body["subjects"],
        rounding_l1=min(sum(o["rounding_l1"] for o in outputs), body["l1"]),
        rounding_l2=min(math.hypot(*(o["rounding_l2"] for o in outputs)), body["l2"]),
    )


def noise_scale(
    tensors: RemoteTensor | Sequence[torch.Tensor],
    *,
    epsilon: float,
    delta: float | None = None,
    client: Any = None,
) -> float:
    """The noise scale (Laplace b, or Gaussian sigma) a publish at ``epsilon`` would use: free."""
    _not_in_mock_mode("noise_scale()")
    swap = swap_moments(
        _remote(tensors, "noise_scale"), epsilon=epsilon, delta=delta, client=client
    )
    body = sensitivity_body(swap.items, epsilon=epsilon, delta=swap.delta, client=client)
    return float(body["noise_scale"])


def publish_grads(
    model: torch.nn.Module | Iterable[torch.Tensor],
    *,
    epsilon: float,
    delta: float | None = None,
    max_grad_norm: float | None = None,
    subjects: DatasetHandle | torch.Tensor | None = None,
    loss_reduction: Literal["mean", "sum"] = "mean",
    client: Any = None,
    run_id: int | None = None,
) -> Receipt:
    """Publish every remote ``.grad`` of ``model`` in one request; each becomes a plain tensor.

    Afterwards an optimizer can step as usual. Parameters whose gradient is local or
    missing are left alone.

    With ``max_grad_norm=C`` this is a DP-SGD step: the node clips each subject's
    gradient (all the parameters' per-example gradients flattened and concatenated, so
    one vector per subject) to L2 norm ``C``, sums the clipped vectors, and adds Gaussian
    noise for an L2 sensitivity of exactly ``2C`` (replacing one subject moves one
    clipped vector anywhere inside the ball of radius ``C``). Per-example gradients are
    recorded during ``loss.backward()`` for ``nn.Linear`` layers (see ``dpnode.sdk._per_sample``);
    other parameters are refused with a message naming them.

    Args:
        model: a module, or the parameters to publish.
        epsilon, delta: the privacy loss of this step. Without ``max_grad_norm``, leave
            ``delta`` out for Laplace noise; with it, ``delta`` is required (Gaussian).
        max_grad_norm: ``C``; None publishes the plain gradients, whose sensitivity the
            node derives from the data's bounds.
        subjects: which rows belong to one subject, to clip them together: a dataset
            handle (the rows of the batch are that dataset's rows, in order; the node
            supplies its subject index) or an int64 tensor with one group per row. None:
            each row is clipped on its own, which costs ``2C`` times the most rows one
            subject has in the batch (exactly ``2C`` when each subject has one row).
        loss_reduction: ``"mean"`` when the loss averages over the rows (torch's
            default): the per-example gradients are the row count times each row's share,
            and the released sum is divided by the row count again. ``"sum"`` when it adds.
        client: the node session (default: the last ``sdk.login``).
        run_id: the training run this is a step of (``client.plan_run(...).run_id``): the
            ledger shows the run's steps as one line, and the receipt states the run's
            total so far (``run_epsilon``). ``sdk.private_training`` passes it for you.

    Returns:
        The release's :class:`Receipt`.

    Raises:
        DPNodeError: no remote gradients, a parameter without per-example gradients, or
            ``max_grad_norm`` without ``delta``.
        NotFoundError: ``run_id`` is not a run you planned; nothing is charged.
        BudgetExceededError, GraphError: as for :func:`publish`.
    """
    receipt, _ = publish_grads_with(
        model,
        (),
        epsilon=epsilon,
        delta=delta,
        max_grad_norm=max_grad_norm,
        subjects=subjects,
        loss_reduction=loss_reduction,
        client=client,
        run_id=run_id,
    )
    return receipt


def publish_grads_with(
    model: torch.nn.Module | Iterable[torch.Tensor],
    extra: Sequence[RemoteTensor],
    *,
    epsilon: float,
    delta: float | None = None,
    max_grad_norm: float | None = None,
    subjects: DatasetHandle | torch.Tensor | None = None,
    loss_reduction: Literal["mean", "sum"] = "mean",
    client: Any = None,
    run_id: int | None = None,
) -> tuple[Receipt, list[torch.Tensor]]:
    """:func:`publish_grads`, releasing the remote tensors ``extra`` in the same publish (one
    request, one charge, the noise calibrated to all of it together); returns the receipt
    and ``extra``'s noised values. ``run_id``: as for :func:`publish`."""
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else list(model)
    names = (
        [n for n, _ in model.named_parameters()]
        if isinstance(model, torch.nn.Module)
        else [f"#{i}" for i in range(len(params))]
    )
    with_grads = [(p, n) for p, n in zip(params, names, strict=True) if _remote_grad(p)]
    if not with_grads:
        raise DPNodeError("no remote gradients to publish: call loss.backward() first")
    held = [p for p, _ in with_grads]
    if max_grad_norm is None:
        grads = [p.grad for p in held if p.grad is not None]
        released = publish(
            [*grads, *extra], epsilon=epsilon, delta=delta, client=client, run_id=run_id
        )
        per_sample.reset(held)
        for p, g in zip(held, released, strict=False):
            p.grad = g.to(p.dtype)
        return released[0].receipt, released[len(grads) :]
    bound = float(max_grad_norm)
    if not (math.isfinite(bound) and bound > 0):
        raise DPNodeError(f"max_grad_norm must be a finite number > 0, got {max_grad_norm!r}")
    if delta is None:
        raise DPNodeError(
            "max_grad_norm bounds each subject's gradient in L2 norm, which the Gaussian "
            "mechanism uses: pass delta= as well"
        )
    if loss_reduction not in ("mean", "sum"):
        raise DPNodeError(f"loss_reduction is 'mean' or 'sum', got {loss_reduction!r}")
    samples = per_sample.per_example_grads(held, [n for _, n in with_grads])
    rows = int(samples[0].shape[0])
    scale = float(rows) if loss_reduction == "mean" else 1.0
    total = per_sample.clipped_sum(
        samples, max_norm=bound, groups=_groups(subjects, rows), scale=scale
    )
    released, *rest = publish(
        [total, *extra], epsilon=epsilon, delta=delta, client=client, run_id=run_id
    )
    per_sample.reset(held)
    flat = released / scale if scale != 1.0 else released
    start = 0
    for p in held:
        p.grad = flat[start : start + p.numel()].reshape(p.shape).to(p.dtype).clone()
        start += p.numel()
    return released.receipt, rest


def _remote_grad(p: torch.Tensor) -> bool:
    return isinstance(p.grad, RemoteTensor)


def _groups(subjects: DatasetHandle | torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """The ``groups`` argument of the clipping prim for ``subjects`` (see publish_grads)."""
    from dpnode.sdk._handles import DatasetHandle

    if subjects is None:
        return None
    if isinstance(subjects, DatasetHandle):
        if subjects.row_count != rows:
            raise DPNodeError(
                f"subjects={subjects.name!r} has {subjects.row_count} rows but the gradients "
                f"have {rows}: for a batch of rows, pass the batch's rows of "
                f"{subjects.name}.subjects, or leave subjects out to clip each row on its own"
            )
        return subjects.subjects
    if (
        tuple(subjects.shape) != (rows,)
        or subjects.dtype.is_floating_point
        or (subjects.dtype == torch.bool)
    ):
        raise DPNodeError(
            f"subjects must be an integer tensor of shape ({rows},), one group per row; got "
            f"{subjects.dtype} {tuple(subjects.shape)}"
        )
    return subjects.to(torch.int64)

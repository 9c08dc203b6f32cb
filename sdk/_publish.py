"""publish: the one request that turns recorded computations into noised numbers.

``t.publish(epsilon=...)`` encodes the graph of ``t`` (and of any tensors published
with it) in one pass, sends it in one HTTP request, and returns plain torch tensors
carrying a :class:`Receipt`. ``t.sensitivity()`` and ``t.noise_scale(...)`` ask the
node what a publish would cost without spending anything: the node derives both from
public metadata only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sdk._exceptions import DPNodeError
from sdk._remote import RemoteTensor, active_session, encode_graph, graph_for

__all__ = ["Receipt", "Sensitivity", "noise_scale", "publish", "publish_grads", "sensitivity"]


@dataclass(frozen=True)
class Receipt:
    """What a release cost and how it was noised."""

    ledger_id: int
    mechanism: str
    epsilon: float
    delta: float | None
    rho: float
    sensitivity_l1: float
    sensitivity_l2: float
    noise_scale: float
    remaining_epsilon: float

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Receipt:
        return cls(**{k: body[k] for k in cls.__dataclass_fields__})

    def __str__(self) -> str:
        return (
            f"{self.mechanism} noise of scale {self.noise_scale:.4g} for sensitivity "
            f"{self.sensitivity_l1 if self.mechanism == 'laplace' else self.sensitivity_l2:.4g}; "
            f"charged epsilon {self.epsilon:g}; {self.remaining_epsilon:g} remaining"
        )


@dataclass(frozen=True)
class Sensitivity:
    """How far the outputs can move when one data subject's records change."""

    l1: float
    l2: float
    subjects: int


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
    if active_session() is not None:
        raise DPNodeError(
            f"{what} is not available in mock mode: inside 'with sdk.mock(...) as m' use "
            "m.evaluate(t) to see values on the mock data, then publish outside it"
        )
    return items  # type: ignore[return-value]


def _client(client: Any) -> Any:
    if client is not None:
        return client
    from sdk import current_client

    return current_client()


def _frame(tensors: list[RemoteTensor]) -> bytes:
    return encode_graph(graph_for(tensors)).frame


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
) -> Any:
    """Publish remote tensors jointly: one request, one charge, noised plain tensors back.

    Args:
        tensors: one remote tensor, or several (then a list comes back, in order).
        epsilon: privacy loss to spend (> 0).
        delta: leave out for the Laplace mechanism (pure epsilon); set it for the Gaussian
            mechanism, (epsilon, delta)-DP through zCDP.
        client: the node session (default: the last ``sdk.login``).

    Returns:
        A torch tensor (or a list), each with a ``receipt`` attribute.

    Raises:
        BudgetExceededError: it does not fit your budget; nothing is released or charged.
        GraphError: the node cannot bound or run the computation (the message says why).
    """
    items = _remote(tensors, "publish")
    values, body = _client(client).publish_frame(_frame(items), epsilon=epsilon, delta=delta)
    receipt = Receipt.from_json(body)
    results = []
    for value, like in zip(values, items, strict=True):
        result = _as_torch(value, like)
        result.receipt = receipt  # type: ignore[attr-defined]
        results.append(result)
    return results[0] if isinstance(tensors, torch.Tensor) else results


def sensitivity(
    tensors: RemoteTensor | Sequence[torch.Tensor], *, client: Any = None
) -> Sensitivity:
    """The L1 and L2 sensitivity of publishing ``tensors`` together: free, no budget spent."""
    body = _client(client).sensitivity_of_frame(_frame(_remote(tensors, "sensitivity")))
    return Sensitivity(l1=body["l1"], l2=body["l2"], subjects=body["subjects"])


def noise_scale(
    tensors: RemoteTensor | Sequence[torch.Tensor],
    *,
    epsilon: float,
    delta: float | None = None,
    client: Any = None,
) -> float:
    """The noise scale (Laplace b, or Gaussian sigma) a publish at ``epsilon`` would use: free."""
    frame = _frame(_remote(tensors, "noise_scale"))
    body = _client(client).sensitivity_of_frame(frame, epsilon=epsilon, delta=delta)
    return float(body["noise_scale"])


def publish_grads(
    model: torch.nn.Module | Iterable[torch.Tensor],
    *,
    epsilon: float,
    delta: float | None = None,
    client: Any = None,
) -> None:
    """Publish every remote ``.grad`` of ``model`` in one request; each becomes a plain tensor.

    Afterwards an optimizer can step as usual. Parameters whose gradient is local or
    missing are left alone.
    """
    params = list(model.parameters()) if isinstance(model, torch.nn.Module) else list(model)
    with_grads = [p for p in params if isinstance(p.grad, RemoteTensor)]
    if not with_grads:
        raise DPNodeError("no remote gradients to publish: call loss.backward() first")
    grads = publish(
        [p.grad for p in with_grads if p.grad is not None],
        epsilon=epsilon,
        delta=delta,
        client=client,
    )
    for p, g in zip(with_grads, grads, strict=True):
        p.grad = g.to(p.dtype)

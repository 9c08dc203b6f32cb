"""Mock mode: run the same script on a dataset's mock data, locally, with the node's engine.

Inside ``with sdk.mock(ds) as m:``, ``ds["age"]`` and ``ds.tensors(...)`` are
shaped like the *mock* data, and the graphs recorded from them can be
evaluated locally by :meth:`MockSession.evaluate` — by the very engine the node
runs (``dpnode.core.engine``), so a dry run exercises the same prims, dtype rules and
quotas. Everything else behaves exactly as on real data: data-dependent code
still raises PrivateValueError, because it would on the node.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import torch

from dpnode.core.engine import evaluate as engine_evaluate
from dpnode.sdk._exceptions import DPNodeError
from dpnode.sdk._remote.graph import build, origins
from dpnode.sdk._remote.tensor import RemoteTensor

if TYPE_CHECKING:
    from dpnode.sdk._handles import DatasetHandle, ModelHandle

__all__ = ["MockSession", "active_session", "evaluate", "mock", "node_of", "to_torch"]

_ACTIVE: contextvars.ContextVar[MockSession | None] = contextvars.ContextVar(
    "dpnode_mock", default=None
)


def active_session() -> MockSession | None:
    """The innermost active mock session, if any."""
    return _ACTIVE.get()


def to_torch(a: npt.NDArray[Any]) -> torch.Tensor:
    """An engine output as a torch tensor (bfloat16 via float32, which holds it exactly)."""
    if a.dtype.kind == "V" or a.dtype.name == "bfloat16":
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True, order="C"))


def evaluate(
    tensors: Sequence[torch.Tensor],
    inputs: Mapping[str, npt.NDArray[Any]],
    *,
    seed: int | None = None,
) -> list[torch.Tensor]:
    """Evaluate remote tensors with the engine on the given input bindings (name -> array).

    Local tensors among ``tensors`` are returned as they are.
    """
    remote = [t for t in tensors if isinstance(t, RemoteTensor)]
    values: list[torch.Tensor] = []
    if remote:
        graph = build([t.node for t in remote])
        names = graph.input_names()
        missing = [n for n in names if n not in inputs]
        if missing:
            raise DPNodeError(
                f"no mock values for {missing}; pass their dataset or model to sdk.mock(...) "
                "and create the tensors inside the `with` block"
            )
        outs = engine_evaluate(
            graph, {n: inputs[n] for n in names}, rng=np.random.default_rng(seed)
        )
        values = [to_torch(o) for o in outs]
    it = iter(values)
    return [next(it) if isinstance(t, RemoteTensor) else t for t in tensors]


def node_of(client: object) -> str | None:
    """The node a handle's session (or a recorded input's origin) talks to: its address.

    Dataset and model ids are a node's own, so two nodes may both hold a dataset 1: mock
    values are found by node and id, never by id alone.
    """
    url = getattr(client, "url", None)
    return None if url is None else str(url)


class MockSession:
    """Bindings of mock values for some datasets and models; a context manager.

    Args:
        handles: datasets (their mock data) and models (their weights, when you
            may download them) to stand in for the node; several nodes' handles may be
            mocked together (each graph reads one node's, as a publish does).
        seed: seed of the generator for random prims (dropout).
    """

    def __init__(self, *handles: DatasetHandle | ModelHandle, seed: int | None = 0) -> None:
        self.handles = handles
        self.seed = seed
        self._frames: dict[tuple[str | None, str, int], dict[str, npt.NDArray[Any]]] = {}
        self._tokens: list[contextvars.Token[MockSession | None]] = []

    # -- bindings ---------------------------------------------------------------------------

    @staticmethod
    def _key(handle: DatasetHandle | ModelHandle) -> tuple[str | None, str, int]:
        """Which input a handle stands for: its node, its kind (as inputs name it), its id."""
        from dpnode.sdk._handles import DatasetHandle

        kind = "dataset" if isinstance(handle, DatasetHandle) else "model"
        return node_of(handle._client), kind, handle.id

    def _frame(self, handle: DatasetHandle | ModelHandle) -> dict[str, npt.NDArray[Any]]:
        from dpnode.sdk._handles import DatasetHandle

        key = self._key(handle)
        if key not in self._frames:
            self._frames[key] = (
                handle.mock() if isinstance(handle, DatasetHandle) else handle.weights()
            )
        return self._frames[key]

    def covers(self, handle: DatasetHandle | ModelHandle) -> bool:
        """Whether ``handle`` is mocked by this session (the same node's dataset or model)."""
        key = self._key(handle)
        return any(h is handle or self._key(h) == key for h in self.handles)

    def handle(self, kind: str, ident: int, node: str | None) -> DatasetHandle | ModelHandle | None:
        """The mocked handle of ``node``'s dataset or model ``ident`` (``kind``: ``"dataset"``
        or ``"model"``), if any; ``node=None``: of whichever node mocks it."""
        for h in self.handles:
            at, k, i = self._key(h)
            if (k, i) == (kind, ident) and (node is None or at == node):
                return h
        return None

    def column(self, handle: DatasetHandle, name: str) -> npt.NDArray[Any]:
        """The mock values of one column."""
        return self._frame(handle)[name]

    def node_for(self, tensors: Sequence[torch.Tensor]) -> str | None:
        """The node whose data ``tensors`` read (None: no node's, or unknown).

        Raises:
            DPNodeError: they read data of several nodes, which no publish can (one
                publish goes to one node), so no mock binding can either.
        """
        nodes = {
            node_of(o) for o in origins([t.node for t in tensors if isinstance(t, RemoteTensor)])
        }
        nodes.discard(None)
        if len(nodes) > 1:
            raise DPNodeError(
                f"these tensors read data of several nodes ({', '.join(sorted(map(str, nodes)))}), "
                "and one publish goes to one node: compute and publish each node's part "
                "apart (sdk.federated(...) does it for a statistic over several nodes)"
            )
        return next(iter(nodes), None)

    def bindings(self, node: str | None = None) -> dict[str, npt.NDArray[Any]]:
        """Every mocked input of ``node`` (default: of every node mocked), under the names
        remote tensors give their inputs."""
        out: dict[str, npt.NDArray[Any]] = {}
        for h in self.handles:
            at, kind, ident = self._key(h)
            if node is not None and at != node:
                continue
            for k, v in self._frame(h).items():
                out[f"{kind}:{ident}/{k}"] = v
        return out

    # -- evaluation ---------------------------------------------------------------------------

    def evaluate(self, *tensors: torch.Tensor) -> Any:
        """Values of remote tensors on the mock data: one torch tensor, or a list for several."""
        found = self.bindings(self.node_for(tensors))
        values = evaluate(list(tensors), found, seed=self.seed)
        return values[0] if len(values) == 1 else values

    def materialize_grads(self, params: Iterable[torch.Tensor] | torch.nn.Module) -> None:
        """Replace remote ``.grad``s by their values on the mock data (all in one graph).

        The mock-mode stand-in for ``sdk.publish_grads``: afterwards an optimizer
        can step, so that a training loop can be dry-run end to end.
        """
        ps = list(params.parameters() if isinstance(params, torch.nn.Module) else params)
        holders = [p for p in ps if isinstance(p.grad, RemoteTensor)]
        if not holders:
            return
        grads: list[torch.Tensor] = [p.grad for p in holders]  # type: ignore[misc]
        values = evaluate(grads, self.bindings(self.node_for(grads)), seed=self.seed)
        for p, v in zip(holders, values, strict=True):
            p.grad = v.to(p.dtype)

    def __enter__(self) -> MockSession:
        self._tokens.append(_ACTIVE.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._tokens.pop())

    def __repr__(self) -> str:
        names = ", ".join(getattr(h, "name", "?") for h in self.handles)
        return f"<MockSession {names}>"


def mock(*handles: DatasetHandle | ModelHandle, seed: int | None = 0) -> MockSession:
    """Dry-run on mock data: ``with sdk.mock(ds) as m: ... m.evaluate(t)``.

    Inside the block, remote tensors made from ``handles`` are shaped like their
    mock data and can be evaluated locally by the node's own engine, at no
    privacy cost. Code that would fail on the node (data-dependent control flow,
    unsupported ops) fails here the same way.
    """
    return MockSession(*handles, seed=seed)

"""Remote tensors: ordinary PyTorch code recorded into prim graphs for the node.

- ``tensor.py``: :class:`RemoteTensor`, the wrapper subclass over a meta tensor, and aliasing.
- ``dispatch.py``: ATen op -> private / view / in-place / rule / decomposition.
- ``views.py``, ``rules*.py``, ``indexing.py``: the
  ATen -> prim tables.
- ``graph.py``: recorded nodes, engine graphs and wire encoding.
- ``privacy.py``: which recorded values are private; a prim without a privacy rule on
  private data is refused as it is recorded (``sdk.NotPublishableError``).
- ``handles.py``: the remote tensors of dataset columns and model weights.
- ``mock.py``: mock mode, evaluated locally by the node's own engine.

See docs/remote-tensors.md.
"""

from collections.abc import Sequence

import torch

from dpnode.core.engine import Graph
from dpnode.sdk._remote import (  # noqa: F401
    indexing,
    quantiles,
    rules,
    rules_extra,
    rules_histogram,
    rules_linalg,
    rules_nn,
    rules_random,
    rules_reduce,
    rules_special,
    rules_stats,
)
from dpnode.sdk._remote.graph import (
    Encoded,
    build,
    encode_graph,
    input_node,
    origins,
    recorded_by,
)
from dpnode.sdk._remote.mock import MockSession, active_session, evaluate, mock
from dpnode.sdk._remote.tensor import RemoteTensor, Storage

__all__ = [
    "Encoded",
    "MockSession",
    "RemoteTensor",
    "Storage",
    "active_session",
    "build",
    "encode_graph",
    "evaluate",
    "graph_for",
    "input_node",
    "mock",
    "origins",
    "recorded_by",
    "remote_input",
]


def graph_for(tensors: Sequence[RemoteTensor]) -> Graph:
    """The engine graph computing ``tensors`` (its outputs, in order)."""
    return build([t.node for t in tensors])


def remote_input(
    name: str,
    shape: Sequence[int],
    dtype: torch.dtype,
    source: str = "",
    origin: object = None,
    private: bool | None = None,
) -> RemoteTensor:
    """A remote tensor standing for the named graph input (a dataset column, a model weight).

    ``origin``: the client of the node that holds it, where its publishes go.
    ``private``: whether its values are private (default: from the name, like the node:
    ``dataset:<id>/<column>`` is, ``dataset:<id>/@subject`` and ``model:...`` are not).
    """
    meta = torch.empty(tuple(shape), dtype=dtype, device="meta")
    node = input_node(name, shape, dtype, origin, private)
    return RemoteTensor(meta, Storage(node), source=source)

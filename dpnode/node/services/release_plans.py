"""Release plans of quantile publishes, kept by the exact request they plan.

A release of quantiles (``torch.median``, ``torch.quantile``, the query builder's
``quantile``, ``min``, ``max`` and ``describe``) is planned by tracking what the quantiles
are taken of and laying out each selection's public grid
(:func:`dpnode.core.privacy.release.plan_release`): tens of milliseconds for a ``describe``,
every time, where the other releases' tracking is kept by
:class:`dpnode.core.privacy.cache.TrackingCache`. The plan is public — it follows from the
graph (structure and constants), the inputs' public metadata and the privacy parameters —
so the same request planned again gets the same plan, and :class:`SelectionPlans` keeps it.

The key is a digest of the whole graph frame (every constant included) with the epsilon
and delta planned for. A frame names its datasets by id, and a dataset's metadata never
changes once stored and its id is never reused (``dpnode.node.services.datasets``): the
same frame always means the same inputs' metadata. A graph that reads a model's weights
is planned every time (a model's tensors are read with each publish). A deleted dataset
needs no forgetting here: the charge refuses a publish on it, before anything is released.
"""

from __future__ import annotations

import hashlib

from dpnode.core.engine import Graph
from dpnode.core.privacy.release import ReleasePlan
from dpnode.node.storage import SizedLru

__all__ = ["SelectionPlans", "selection_key"]


def selection_key(frame: bytes, graph: Graph, epsilon: float, delta: float | None) -> bytes | None:
    """The key of a publish that may be a release of quantiles; None for any other (or one
    that reads a model), which is not kept.

    >>> from dpnode.core.engine.graph import Node, Ref
    >>> g = Graph((Node("input", (), {"name": "dataset:1/x"}),
    ...            Node("quantile", (Ref(0),), {})), (1,))
    >>> len(selection_key(b"frame", g, 1.0, None)), selection_key(b"frame", g, 1.0, 1e-6) != (
    ...     selection_key(b"frame", g, 1.0, None))
    (32, True)
    >>> plain = Graph(g.nodes, (0,))
    >>> selection_key(b"frame", plain, 1.0, None) is None
    True
    """
    nodes = graph.nodes
    if not any(nodes[o].op == "quantile" for o in graph.outputs):
        return None
    if any(name.startswith("model:") for name in graph.input_names()):
        return None
    h = hashlib.blake2b(frame, digest_size=32)
    h.update(repr((epsilon, delta)).encode())
    return h.digest()


def _weight(rp: ReleasePlan) -> int:
    """Roughly the bytes a plan holds: its grids and bounds, 8 bytes a value."""
    selections = rp.selection.selections if rp.selection is not None else ()
    grids = {id(s.grid): s.grid.size for s in selections}
    return 8 * (sum(grids.values()) + 3 * rp.lower.size) + 1024


class SelectionPlans(SizedLru[bytes, ReleasePlan]):
    """Quantile release plans by :func:`selection_key`, at most ``max_bytes`` of them
    (least recently used out). Safe to share between threads: a plan is read-only."""

    def __init__(self, max_bytes: int = 16 << 20) -> None:
        super().__init__(max_bytes, _weight)

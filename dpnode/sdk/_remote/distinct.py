"""Counting distinct values of a remote tensor: ``sdk.count_distinct(x)``.

``torch.unique(x)`` cannot be recorded on a remote tensor: its shape is the number of
distinct values, which is private (the SDK refuses it and points here). The count itself is
a scalar the node can noise: ``sdk.count_distinct(x)`` records the node's ``count_distinct``
prim, a remote int64 scalar to publish like any other. One subject moves the count by at
most the number of elements it changes (1 for a column with one row per subject; the node
computes it from the subject structure), whatever the values, floating point included.
Every NaN counts as one value and ``0.0`` equals ``-0.0``, as ``np.unique`` (and pandas'
``nunique(dropna=False)``) count them.
"""

from __future__ import annotations

import numpy as np
import torch

from dpnode.sdk._remote.dispatch import _wrap, node_of
from dpnode.sdk._remote.graph import Node, prim
from dpnode.sdk._remote.tensor import RemoteTensor

__all__ = ["count_distinct", "distinct_node"]


def distinct_node(x: Node, *, index: Node | None = None, groups: int = 0) -> Node:
    """The ``count_distinct`` prim of all of ``x``'s elements; with a group ``index`` per
    element and ``groups``, one count per group (an index outside ``[0, groups)``: none)."""
    if index is None:
        node = prim("count_distinct", x)
        node.shape = ()
    else:
        node = prim("count_distinct", x, index, groups=int(groups))
        node.shape = (int(groups),)
    node.dtype = torch.int64
    return node


def count_distinct(x: torch.Tensor) -> torch.Tensor:
    """How many distinct values ``x``'s elements hold, as an int64 scalar.

    On a remote tensor the count stays on the node until published
    (``sdk.count_distinct(ds["age"]).publish(epsilon=1.0)``); its sensitivity is the most
    elements one subject can change. On a local tensor it is computed here, alike.

    Args:
        x: a tensor of any shape and real dtype.

    Raises:
        TypeError: ``x`` is not a tensor.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"count_distinct takes a tensor, got {type(x).__name__}")
    if not isinstance(x, RemoteTensor):
        local = x.detach().cpu()
        if local.dtype == torch.bfloat16:
            local = local.float()
        return torch.tensor(np.unique(local.numpy()).size, dtype=torch.int64)
    meta = torch.empty((), dtype=torch.int64, device="meta")
    result: torch.Tensor = _wrap(meta, distinct_node(node_of(x)), x._source)
    return result

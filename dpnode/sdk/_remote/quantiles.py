"""Quantiles of private values: one ``quantile`` prim, selected on the node.

``torch.median(x)``, ``torch.nanmedian(x)``, ``torch.quantile(x, q)`` and
``torch.nanquantile(x, q)`` over all of a private tensor's elements record the prim
``quantile(x, q)``. The node releases it, as a publish's output, by selection over the
values' public range (permute-and-flip, ``node.dp.selection``): the answer is a point of a
public grid (the integers for integer data), accepted with probability that falls off
exponentially with how many values lie between it and the true quantile. A quantile along
a dim, or of public values, records what torch's own decomposition does (exact on public
values, refused on private ones as it is recorded).

The median is the lower median, as torch's: ``q = 0.5`` with ``interpolation="lower"``.
"""

from __future__ import annotations

from typing import Any

import torch

from sdk._remote.dispatch import _wrap, node_of
from sdk._remote.graph import Node, constant, prim
from sdk._remote.losses import OVERRIDES
from sdk._remote.tensor import RemoteTensor

__all__ = ["selected_quantile"]


def selected_quantile(
    x: Node,
    q: torch.Tensor,
    interpolation: str,
    ignore_nan: bool,
    *,
    index: Node | None = None,
    groups: int = 0,
) -> Node:
    """The ``quantile`` prim of all of ``x``'s elements at the public quantiles ``q``; with a
    group ``index`` per element and ``groups``, of each group's (one row per group)."""
    attrs: dict[str, Any] = {"interpolation": interpolation, "ignore_nan": bool(ignore_nan)}
    if index is None:
        node = prim("quantile", x, constant(q), **attrs)
        node.shape = tuple(q.shape)
    else:
        node = prim("quantile", x, constant(q), index, groups=int(groups), **attrs)
        node.shape = (int(groups), *q.shape)
    node.dtype = x.dtype
    return node


def _override(which: Any, ignore_nan: bool) -> Any:
    def quantile(
        x: Any,
        q: Any,
        dim: Any = None,
        keepdim: bool = False,
        *,
        interpolation: str = "linear",
        out: Any = None,
    ) -> Any:
        if dim is not None or out is not None or not isinstance(x, RemoteTensor):
            return NotImplemented
        if isinstance(q, RemoteTensor) or not node_of(x).private:
            return NotImplemented
        qs = q.detach() if isinstance(q, torch.Tensor) else torch.tensor(q, dtype=x.dtype)
        # torch's own checks (dtype, range, interpolation), on metadata only
        meta = which(x._meta, qs.to("meta"), keepdim=keepdim, interpolation=interpolation)
        if bool(((qs < 0) | (qs > 1) | qs.isnan()).any()):
            raise RuntimeError(f"{which.__name__}() q values must be in the range [0, 1]")
        node = selected_quantile(node_of(x), qs.to(x.dtype), interpolation, ignore_nan)
        return _wrap(meta, node, x._source)

    return quantile


for _fn, _nan in ((torch.quantile, False), (torch.nanquantile, True)):
    OVERRIDES[_fn] = _override(_fn, _nan)
    OVERRIDES[getattr(torch.Tensor, _fn.__name__)] = _override(_fn, _nan)

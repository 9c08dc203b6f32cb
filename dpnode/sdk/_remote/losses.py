"""Losses whose torch composite cannot run on remote tensors, written in ops that can.

``F.cross_entropy`` with class weights, label smoothing and ``reduction="mean"`` divides by
the weights of the kept labels, which torch's composite selects with ``masked_select``: a
shape that depends on the labels, so a remote tensor refuses it. The same quantity is the
sum of the one-hot code of the kept labels times the weights, a shape known in advance.
:data:`OVERRIDES` maps the torch function to a replacement that returns ``NotImplemented``
where torch's own composite is fine.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["OVERRIDES"]

_CROSS_ENTROPY = inspect.signature(F.cross_entropy)


def _cross_entropy(*args: Any, **kwargs: Any) -> Any:
    bound = _CROSS_ENTROPY.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    x, target, weight = a["input"], a["target"], a["weight"]
    smoothing, reduction = float(a["label_smoothing"]), a["reduction"]
    legacy = a["size_average"] is not None or a["reduce"] is not None
    if weight is None or smoothing == 0 or reduction != "mean" or legacy:
        return NotImplemented
    if target.dtype.is_floating_point:  # class probabilities: no labels to select
        return NotImplemented
    dim = 1 if x.dim() > 1 else 0
    classes = x.shape[dim]
    logp = F.log_softmax(x, dim)
    keep = (target != a["ignore_index"]).to(logp.dtype)
    shape = [1] * logp.dim()
    shape[dim] = classes
    w = weight.reshape(shape)
    nll = F.nll_loss(logp, target, weight=weight, ignore_index=a["ignore_index"], reduction="sum")
    smooth = (-(logp * w).sum(dim) * keep).sum()
    hot = (target.unsqueeze(dim) == torch.arange(classes).reshape(shape)).to(logp.dtype)
    total = ((hot * w).sum(dim) * keep).sum()
    return ((1 - smoothing) * nll + smoothing / classes * smooth) / total


OVERRIDES: dict[Callable[..., Any], Callable[..., Any]] = {F.cross_entropy: _cross_entropy}

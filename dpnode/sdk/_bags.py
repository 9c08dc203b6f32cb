"""``nn.EmbeddingBag`` on remote token ids: bags as rows, with per-example gradients.

torch's ``embedding_bag`` reduces each bag with ``scatter_add``/``scatter_reduce`` at
positions the offsets choose, which have no privacy rule on private ids. For a 2-d input
(each row one bag, no offsets) the bags are the rows, so the same result is a lookup of
every id and a sum, mean or max along the row: a public table read at private positions
(the node's rule for lookups) and a reduction. The table's per-example gradients are those
of the lookup (``sdk._per_sample.watch_lookup``). A max's gradient splits among ties where
torch's goes to the first; a tie of one id repeated in a bag reads one table row, so the
table's gradient is torch's, but equal entries of different ids get shares of it.
Offsets, ``padding_idx`` (whose mean divides by a count of the ids), ``max_norm`` and
``scale_grad_by_freq`` fall back to torch's code, and are refused on private data.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from sdk._per_sample import watch_lookup
from sdk._remote.losses import OVERRIDES

__all__: list[str] = []


def _embedding_bag(
    input: torch.Tensor,
    weight: torch.Tensor,
    offsets: Any = None,
    max_norm: Any = None,
    norm_type: float = 2,
    scale_grad_by_freq: bool = False,
    mode: str = "mean",
    sparse: bool = False,
    per_sample_weights: Any = None,
    include_last_offset: bool = False,
    padding_idx: Any = None,
) -> Any:
    if (
        input.dim() != 2
        or offsets is not None
        or max_norm is not None
        or scale_grad_by_freq
        or padding_idx is not None
        or (per_sample_weights is not None and mode != "sum")
    ):
        return NotImplemented
    rows = F.embedding(input, weight)  # [bags, ids per bag, dim]
    watch_lookup(weight, input, rows, None)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(-1)
    if mode == "sum":
        return rows.sum(dim=1)
    return rows.mean(dim=1) if mode == "mean" else rows.amax(dim=1)


OVERRIDES[F.embedding_bag] = _embedding_bag

"""Multi-head attention on remote tensors, with per-example gradients of its projections.

torch's ``F.multi_head_attention_forward`` cannot train on private data as it is: it calls
``scaled_dot_product_attention``, whose CPU backward has no decomposition into prims, and
it applies its projections with ``F.linear`` on the module's raw parameters, which the
per-example hooks of ``nn.Linear`` modules never see. This replacement (registered for
remote tensors in ``dpnode.sdk._remote.losses.OVERRIDES``) computes the same attention with
``linear``, batched ``matmul`` (each batch row is one example's head: the node's rule for
per-example products), ``softmax`` and, in training, ``dropout``; and records each
projection's per-example gradient as ``nn.Linear``'s is: ``sum over positions of the output
gradient times the input`` (rows are dim 1 here: attention works on ``(L, N, E)``).

It covers self-attention and attention over other keys and values, with the module's own
in-projection and bias, ``need_weights`` and ``is_causal`` (whose mask is, by torch's
contract, the causal one); other masks, ``bias_k``/``bias_v``, ``add_zero_attn``, separate
projection weights and static keys fall back to torch's code.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from dpnode.sdk._per_sample import watch_linear
from dpnode.sdk._remote import RemoteTensor
from dpnode.sdk._remote.losses import OVERRIDES

__all__: list[str] = []


def _linear(x: torch.Tensor, weight: Any, bias: Any, rows: slice) -> torch.Tensor:
    whole = rows.start == 0 and rows.stop == weight.shape[0]
    w = weight if whole else weight[rows]
    b = None if bias is None else (bias if whole else bias[rows])
    out = F.linear(x, w, b)
    if isinstance(out, RemoteTensor):
        watch_linear(out, x, weight, bias, rows_at=1, part=rows)
    return out


def _per_head(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for ``(N, heads, ., .)`` operands, one batched product per head."""
    return torch.stack([torch.matmul(a[:, h], b[:, h]) for h in range(a.shape[1])], dim=1)


def _attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Any,
    in_proj_bias: Any,
    bias_k: Any,
    bias_v: Any,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: torch.Tensor,
    out_proj_bias: Any,
    training: bool = True,
    key_padding_mask: Any = None,
    need_weights: bool = True,
    attn_mask: Any = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Any = None,
    k_proj_weight: Any = None,
    v_proj_weight: Any = None,
    static_k: Any = None,
    static_v: Any = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> Any:
    unsupported = (
        bias_k is not None
        or bias_v is not None
        or add_zero_attn
        or key_padding_mask is not None
        or (attn_mask is not None and not is_causal)  # with is_causal it is the causal mask
        or use_separate_proj_weight
        or static_k is not None
        or static_v is not None
        or in_proj_weight is None
        or query.dim() != 3
    )
    if unsupported:
        return NotImplemented
    length, n, e = query.shape
    source = key.shape[0]
    heads, d = num_heads, e // num_heads
    if e != embed_dim_to_check or heads * d != e:
        return NotImplemented
    if query is key and key is value:  # self-attention: one projection of the rows
        q, k, v = _linear(query, in_proj_weight, in_proj_bias, slice(0, 3 * e)).chunk(3, dim=-1)
    else:
        q = _linear(query, in_proj_weight, in_proj_bias, slice(0, e))
        k = _linear(key, in_proj_weight, in_proj_bias, slice(e, 2 * e))
        v = _linear(value, in_proj_weight, in_proj_bias, slice(2 * e, 3 * e))
    # (L, N, E) -> (N, heads, L, d), and one product per head (batched over the examples):
    # examples and heads stay two dims, so the node keeps one bound per head, not one per
    # example and head (torch folds a 4-d matmul's batch dims into one, and with them
    # folded every state from the scores on held rows x heads x L x d numbers)
    q = q.reshape(length, n, heads, d).permute(1, 2, 0, 3)
    k = k.reshape(source, n, heads, d).permute(1, 2, 3, 0)
    v = v.reshape(source, n, heads, d).permute(1, 2, 0, 3)
    scores = _per_head(q, k) * (1.0 / math.sqrt(d))
    if is_causal:
        future = torch.ones(length, source, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, -math.inf)
    weights = torch.softmax(scores, dim=-1)
    if training and dropout_p > 0:
        weights = F.dropout(weights, p=dropout_p)
    out = _per_head(weights, v).permute(2, 0, 1, 3).reshape(length, n, e)
    out = _linear(out, out_proj_weight, out_proj_bias, slice(0, e))
    if not need_weights:
        return out, None
    return out, (weights.mean(dim=1) if average_attn_weights else weights)


OVERRIDES[F.multi_head_attention_forward] = _attention

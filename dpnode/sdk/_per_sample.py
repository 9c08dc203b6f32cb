"""Per-example gradients of remote training steps, for DP-SGD's per-subject clipping.

DP-SGD clips each subject's gradient before summing, so it needs one gradient per
example, while ``loss.backward()`` only leaves their sum in ``.grad``. This module
records the per-example gradients *alongside* the ordinary backward pass, the way
Opacus does for local tensors: a global module forward hook notices every
``nn.Linear`` whose output is a remote tensor requiring grad, keeps its input, and
hooks the output's gradient; in the backward pass the example ``i``'s gradient of the
weight is ``grad_out[i]^T input[i]`` (summed over any middle dims) and of the bias
``grad_out[i]``. They are recorded as ordinary prims (``mul``, ``sum``), lazily: when
nothing publishes them, they are never built, sent or computed. A weight's rows that are
one outer product each (no middle dims, one call of the layer) are clipped from their two
factors (:func:`clipped_sum`, the node's ``clip_by_subject_norm`` with ``outer``): the
``rows x out x in`` numbers are never built, as in Opacus's fast gradient clipping.

The trade-off: this covers models built from ``nn.Linear`` layers and parameter-free
modules (activations, dropout, reshapes) — logistic and linear regression, MLPs —
with nothing to set up. ``torch.func.vmap(torch.func.grad(...))`` also runs on remote
tensors and covers more, but needs the loss written as a function, not the
``loss.backward()`` loop. A parameter whose gradient does not come (only) from hooked
layers is reported at publish time, never silently mixed.

Bookkeeping follows ``.grad``: a backward pass that starts from an empty (``None`` or
zeroed) ``.grad`` starts the per-example sums afresh, one that adds to a ``.grad``
this module followed adds to them (gradient accumulation), and anything else (a
``.grad`` changed by hand) makes the parameter's per-example gradients unavailable.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from dpnode.sdk._exceptions import DPNodeError
from dpnode.sdk._remote import RemoteTensor, Storage
from dpnode.sdk._remote.conv_grads import per_example_weight_grad
from dpnode.sdk._remote.dispatch import node_of
from dpnode.sdk._remote.graph import Node, prim

__all__ = ["clipped_sum", "per_example_grads", "reset"]


@dataclass
class _Samples:
    """Per-example gradients of one parameter, in step with its ``.grad``."""

    #: [rows, *param.shape]: per-example gradients summed into ``.grad`` so far
    total: torch.Tensor | None = None
    #: why ``total`` is unavailable, if it is
    broken: str | None = None
    #: the node of ``.grad`` right after the last accumulation this module followed
    after: Node | None = None
    #: backward pass (graph task id) -> (how it starts, its contributions so far)
    pending: dict[int, tuple[str | None, list[torch.Tensor | None]]] = field(default_factory=dict)
    watched: bool = False


_UNSUPPORTED = (
    "its gradient does not come from an nn.Linear, Conv1d/2d/3d, Embedding, LayerNorm, "
    "GroupNorm or InstanceNorm layer"
)


#: parameter -> its per-example gradients (weakly keyed by identity: tensors have no ==)
_STATE: WeakIdKeyDictionary = WeakIdKeyDictionary()

#: per-example weight gradients ``[rows, p, q]`` of a linear layer -> their factors
#: ``(grad_out [rows, p], input [rows, q])``: :func:`clipped_sum` sends the factors, and the
#: node clips the rows without building them (the gradients stay an unsent lazy node)
_FACTORS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _lookup(p: torch.Tensor) -> _Samples | None:
    st: _Samples | None = _STATE.get(p)  # type: ignore[no-untyped-call]
    return st


def _state(p: torch.Tensor) -> _Samples:
    st = _lookup(p)
    if st is None:
        st = _STATE[p] = _Samples()
    if not st.watched:
        p.register_post_accumulate_grad_hook(_accumulated)  # type: ignore[no-untyped-call]
        st.watched = True
    return st


def _start(p: torch.Tensor, st: _Samples) -> str | None:
    """How this backward pass relates to ``p.grad``: None to continue, "" to start, or why not."""
    g = p.grad
    if g is None:
        return ""
    if isinstance(g, RemoteTensor):
        if st.total is not None and st.after is not None and g.node is st.after:
            return None
        return st.broken or "its .grad was changed after the backward pass that computed it"
    if not bool(g.detach().any()):  # zeroed in place (zero_grad(set_to_none=False))
        return ""
    return "its .grad holds a local gradient that was not zeroed before this backward pass"


def _contribute(p: torch.Tensor, value: torch.Tensor | None) -> None:
    """Add one layer call's per-example gradients of ``p`` (None: it had no rows)."""
    st = _state(p)
    task = torch._C._current_graph_task_id()
    if task not in st.pending:
        st.pending = {task: (_start(p, st), [])}  # drops leftovers of torch.autograd.grad calls
    st.pending[task][1].append(value)


def _accumulated(p: torch.Tensor) -> None:
    """After autograd added this backward pass's gradient to ``p.grad``: follow it."""
    st = _state(p)
    start, parts = st.pending.pop(torch._C._current_graph_task_id(), ("", []))
    st.pending.clear()
    st.after = p.grad.node if isinstance(p.grad, RemoteTensor) else None
    if not parts:
        st.total, st.broken = None, _UNSUPPORTED
        return
    if start is not None and start != "":
        st.total, st.broken = None, start
        return
    if any(t is None for t in parts):
        st.total, st.broken = None, "a layer saw an input without a row dimension"
        return
    rows = {int(t.shape[0]) for t in parts if t is not None}
    if st.total is not None and start is None:
        rows.add(int(st.total.shape[0]))
    if len(rows) != 1:
        st.total, st.broken = None, f"its layers saw different numbers of rows {sorted(rows)}"
        return
    present = [t for t in parts if t is not None]
    total = present[0]
    for t in present[1:]:
        total = total + t
    st.total, st.broken = (total if start == "" or st.total is None else st.total + total), None


def watch_linear(
    out: torch.Tensor,
    x: torch.Tensor,
    weight: Any,
    bias: Any,
    *,
    rows_at: int = 0,
    part: slice | None = None,
) -> None:
    """Record the per-example gradients of ``weight`` and ``bias`` from
    ``out = x @ weight[part].T + bias[part]`` (all of them without ``part``): per example,
    the output's gradient times the input, summed over every dim but the rows'
    (``rows_at``) and the features; the parameters' rows outside ``part`` get zeros.

    A local ``out`` is watched too (public rows, e.g. a recurrent layer's first hidden
    state, whose gradient arrives remote); a public gradient gives nothing per example.
    """
    w = weight if isinstance(weight, torch.Tensor) and weight.requires_grad else None
    b = bias if isinstance(bias, torch.Tensor) and bias.requires_grad else None
    if not out.requires_grad or (w is None and b is None):
        return
    for p in (w, b):
        if p is not None:
            _state(p)
    x = x.detach()
    summed = tuple(d for d in range(x.dim() - 1) if d != rows_at)
    total = (w if w is not None else b).shape[0]  # type: ignore[union-attr]
    part = part or slice(0, total)
    before, after = part.start, total - part.stop

    def on_grad(g: torch.Tensor) -> None:
        if not isinstance(g, RemoteTensor):  # a public gradient: nothing per example
            return
        if x.dim() < 2:  # no row dimension: nothing is per example
            for p in (w, b):
                if p is not None:
                    _contribute(p, None)
            return
        if w is not None:
            per = g.unsqueeze(-1) * x.unsqueeze(-2)  # [.., rows, .., out, in]
            if not (summed or before or after):
                _FACTORS[per] = (g, x)
            per = per.sum(dim=summed) if summed else per
            _contribute(w, F.pad(per, (0, 0, before, after)) if before or after else per)
        if b is not None:
            per = g.sum(dim=summed) if summed else g
            _contribute(b, F.pad(per, (before, after)) if before or after else per)

    out.register_hook(on_grad)  # type: ignore[no-untyped-call]


def _linear_hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    """After an ``nn.Linear`` call on remote rows: record its per-example gradients in backward."""
    if not isinstance(module, torch.nn.Linear) or not isinstance(output, RemoteTensor):
        return
    if not args or not isinstance(args[0], torch.Tensor):
        return
    watch_linear(output, args[0], module.weight, module.bias)


_CONVS = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def _conv_hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    """After a convolution layer's call on remote images: its per-example gradients in backward.

    The geometry and the input are the recorded convolution's own (so padding modes and
    ``padding="same"`` need no special case): the weight's per-example gradient is a sum over
    output positions of the output's gradient times the input window it saw.
    """
    if not isinstance(module, _CONVS) or not isinstance(output, RemoteTensor):
        return
    conv = output.node
    weight = module.weight if module.weight.requires_grad else None
    bias = module.bias if module.bias is not None and module.bias.requires_grad else None
    if not output.requires_grad or (weight is None and bias is None):
        return
    for p in (weight, bias):
        if p is not None:
            _state(p)
    nsp = module.weight.dim() - 2
    batched = output.dim() == nsp + 2 and conv.op == "convolution"

    def on_grad(g: torch.Tensor) -> None:
        if not batched or not isinstance(g, RemoteTensor):  # no row dimension
            for p in (weight, bias):
                if p is not None:
                    _contribute(p, None)
            return
        if weight is not None:
            node = per_example_weight_grad(
                conv.args[0],
                g.node,
                kernel=tuple(module.weight.shape[2:]),
                stride=conv.attrs["stride"],
                padding=conv.attrs["padding"],
                dilation=conv.attrs["dilation"],
                groups=int(conv.attrs.get("groups") or 1),
            )
            meta = torch.empty((g.shape[0], *module.weight.shape), dtype=g.dtype, device="meta")
            _contribute(weight, RemoteTensor(meta, Storage(node), source=g._source))
        if bias is not None:
            _contribute(bias, g.sum(dim=tuple(range(2, 2 + nsp))))

    output.register_hook(on_grad)  # type: ignore[no-untyped-call]


_INSTANCE_NORMS = (torch.nn.InstanceNorm1d, torch.nn.InstanceNorm2d, torch.nn.InstanceNorm3d)


def _standardised(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The normalisation layer's input standardised as the layer does it, without affine."""
    if isinstance(module, torch.nn.LayerNorm):
        return F.layer_norm(x, module.normalized_shape, eps=module.eps)
    if isinstance(module, torch.nn.GroupNorm):
        return F.group_norm(x, module.num_groups, eps=module.eps)
    assert isinstance(module, _INSTANCE_NORMS)
    return F.instance_norm(x, eps=module.eps)


def _summed_dims(module: torch.nn.Module, x: torch.Tensor) -> tuple[int, ...]:
    """The dims an affine parameter's per-example gradient sums over (between the rows and
    the normalised dims for LayerNorm; the positions after the channels otherwise)."""
    if isinstance(module, torch.nn.LayerNorm):
        return tuple(range(1, x.dim() - len(module.normalized_shape)))
    return tuple(range(2, x.dim()))


def _norm_hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    """After a LayerNorm, GroupNorm or InstanceNorm call on remote rows: per-example
    gradients of its affine parameters, ``sum(grad * x_hat)`` and ``sum(grad)`` per example,
    with ``x_hat`` the input standardised again (recorded lazily, computed only if published).
    """
    norms = (torch.nn.LayerNorm, torch.nn.GroupNorm, *_INSTANCE_NORMS)
    if not isinstance(module, norms) or not isinstance(output, RemoteTensor):
        return
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    weight = weight if weight is not None and weight.requires_grad else None
    bias = bias if bias is not None and bias.requires_grad else None
    if not output.requires_grad or (weight is None and bias is None):
        return
    for p in (weight, bias):
        if p is not None:
            _state(p)
    x = args[0].detach()
    if isinstance(module, torch.nn.LayerNorm):
        rows = x.dim() > len(module.normalized_shape)
    else:  # (N, C, ...): an unbatched instance norm has no row dimension
        rows = x.dim() >= 2 and not (
            isinstance(module, _INSTANCE_NORMS) and x.dim() == module._get_no_batch_dim()
        )

    def on_grad(g: torch.Tensor) -> None:
        if not rows:
            for p in (weight, bias):
                if p is not None:
                    _contribute(p, None)
            return
        dims = _summed_dims(module, x)
        if weight is not None:
            w = g * _standardised(module, x)
            _contribute(weight, w.sum(dim=dims) if dims else w)
        if bias is not None:
            _contribute(bias, g.sum(dim=dims) if dims else g)

    output.register_hook(on_grad)  # type: ignore[no-untyped-call]


def watch_lookup(weight: torch.Tensor, ids: Any, output: Any, padding_idx: int | None) -> None:
    """Record per-example gradients of a table read at ``ids`` into ``output``
    (``[*ids.shape, dim]``): the one-hot codes of each example's ids times their output
    gradients, summed over the example's positions (``[rows, num_embeddings, dim]``;
    ``padding_idx`` gets none)."""
    if not (isinstance(output, RemoteTensor) and output.requires_grad and weight.requires_grad):
        return
    _state(weight)
    ids = ids.detach() if isinstance(ids, torch.Tensor) else None
    size = weight.shape[0]
    codes = torch.ones(size, dtype=weight.dtype)
    if padding_idx is not None:
        codes[padding_idx] = 0.0

    def on_grad(g: torch.Tensor) -> None:
        if ids is None or ids.dim() < 1:
            _contribute(weight, None)
            return
        hot = (ids.unsqueeze(-1) == torch.arange(size)).to(g.dtype) * codes
        per = hot.unsqueeze(-1) * g.unsqueeze(-2)  # [n, *positions, num_embeddings, dim]
        positions = tuple(range(1, ids.dim()))
        _contribute(weight, per.sum(dim=positions) if positions else per)

    output.register_hook(on_grad)  # type: ignore[no-untyped-call]


def _embedding_hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
    """After an ``nn.Embedding`` call on remote token ids: per-example gradients of its
    table (:func:`watch_lookup`). ``max_norm`` (which rewrites the table where the ids
    point) and ``scale_grad_by_freq`` (which scales by how often ids occur) depend on the
    ids: such layers get none."""
    if not isinstance(module, torch.nn.Embedding):
        return
    if module.max_norm is not None or module.scale_grad_by_freq:
        return
    watch_lookup(module.weight, args[0] if args else None, output, module.padding_idx)


torch.nn.modules.module.register_module_forward_hook(_linear_hook)
torch.nn.modules.module.register_module_forward_hook(_embedding_hook)
torch.nn.modules.module.register_module_forward_hook(_conv_hook)
torch.nn.modules.module.register_module_forward_hook(_norm_hook)


def per_example_grads(params: Sequence[torch.Tensor], names: Sequence[str]) -> list[torch.Tensor]:
    """Each parameter's per-example gradients ``[rows, *shape]``, whose sum is its ``.grad``.

    Raises:
        DPNodeError: a parameter has none (the message names it and says why).
    """
    out = []
    for p, name in zip(params, names, strict=True):
        st = _lookup(p)
        why = None
        if st is None:
            why = _UNSUPPORTED
        elif st.total is None or st.broken is not None:
            why = st.broken or "no backward pass recorded them"
        elif not (isinstance(p.grad, RemoteTensor) and p.grad.node is st.after):
            why = "its .grad was changed after the backward pass that computed it"
        if why is not None:
            raise DPNodeError(
                f"no per-example gradients for parameter {name!r}: {why}. Per-example "
                "clipping (max_grad_norm=) supports models whose parameters are those of "
                "nn.Linear, Conv, Embedding, LayerNorm, GroupNorm and InstanceNorm layers, "
                "trained with loss.backward() on remote rows; see "
                "docs/remote-tensors.md"
            )
        assert st is not None and st.total is not None
        out.append(st.total)
    rows = {int(t.shape[0]) for t in out}
    if len(rows) > 1:
        raise DPNodeError(
            f"the parameters' per-example gradients have different numbers of rows "
            f"{sorted(rows)}: clip them in separate publishes"
        )
    return out


def reset(params: Sequence[torch.Tensor]) -> None:
    """Forget the per-example gradients of ``params`` (their ``.grad`` was published)."""
    for p in params:
        st = _lookup(p)
        if st is not None:
            st.total, st.broken, st.after = None, None, None
            st.pending.clear()


def clipped_sum(
    per_example: Sequence[torch.Tensor],
    *,
    max_norm: float,
    groups: torch.Tensor | None = None,
    scale: float = 1.0,
    ord: int = 2,
) -> RemoteTensor:
    """Clip each group's gradient (all parameters jointly) to L2 norm ``max_norm`` and sum.

    Args:
        per_example: ``[rows, *shape]`` tensors, one per parameter (same rows).
        max_norm: the clipping bound ``C``; the sum then moves by at most ``2C`` per group
            a subject's rows fall into.
        groups: int64 ``[rows]``: rows to clip together (the dataset's subject index);
            None: every row on its own.
        scale: multiplies every row before clipping (the row count, when the loss is a
            mean over rows, so that each row is one example's own gradient).
        ord: 1 to clip to the L1 norm instead (the sum then moves by at most ``2C`` in L1:
            what a Laplace release needs).

    Returns:
        A remote ``[sum of the parameters' sizes]`` vector: the parameters' gradients,
        flattened and concatenated in order.
    """
    rows = int(per_example[0].shape[0])
    # each parameter's rows flattened (a view), or the two factors of a linear layer's
    # weight gradients; the node joins them into one vector per row as it clips, without
    # a copy of them all together
    parts: list[tuple[torch.Tensor, ...]] = [
        _FACTORS.get(t) or (t.reshape(rows, -1),)  # type: ignore[no-untyped-call]
        for t in per_example
    ]
    common = functools.reduce(torch.promote_types, [f.dtype for p in parts for f in p])
    parts = [tuple(f if f.dtype == common else f.to(common) for f in p) for p in parts]
    if scale != 1.0:
        parts = [(p[0] * scale, *p[1:]) for p in parts]
    remote = [f for p in parts for f in p if isinstance(f, RemoteTensor)]
    if not remote:
        raise DPNodeError("per-example gradients of local tensors have nothing private to clip")
    attrs: dict[str, Any] = {"max_norm": float(max_norm)}
    if ord != 2:
        attrs["ord"] = int(ord)
    if any(len(p) == 2 for p in parts):
        attrs["outer"] = [len(p) - 1 for p in parts]
    args = [node_of(f) for p in parts for f in p]
    # every row on its own: the node counts the rows itself (``arange``), where a constant
    # of the row indices was 8 bytes a row in every request, decoded and hashed each time
    grouping = (
        prim("arange", start=0.0, end=float(rows), step=1.0, dtype="int64")
        if groups is None
        else node_of(groups)
    )
    node = prim("clip_by_subject_norm", *args, grouping, **attrs)
    size = sum(math.prod(int(f.shape[1]) for f in p) for p in parts)
    meta = torch.empty((size,), dtype=remote[0].dtype, device="meta")
    return RemoteTensor(meta, Storage(node), source=remote[0]._source)

"""``torch.cov`` and ``torch.corrcoef`` of remote data, published from the rows' moments.

A recorded graph computes what torch computes, and torch's covariance centres every value on
the mean before multiplying: interval arithmetic charges each centred product for the shift
of the mean, and a correlation divides by a standard deviation whose range contains 0, which
no noise can cover. The accurate release noises the rows' moments once and divides after
(:mod:`dpnode.sdk._moments`), which a graph cannot say. So ``torch.cov(x)`` and
``torch.corrcoef(x)`` (and ``x.cov()``, ``x.corrcoef()``) record torch's composite as usual
(the tensor has its shape and dtype, and the node could run it) and remember the call; when
*that* tensor is published (alone or with others; likewise ``sensitivity()`` and
``noise_scale()``), the rows' moment vector is published in its place and the matrix is
computed from it here. Its receipt's ``post_processing`` says so.

Anything computed from the matrix before publishing (``torch.cov(x)[0, 1]``, an in-place
change) is an ordinary graph again: a covariance then gets the tracker's bound, a correlation
its refusal. ``fweights``/``aweights`` record the composite as well.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from dpnode.sdk._moments import (
    VARIANCE_FLOOR,
    MomentPlan,
    MomentRelease,
    choose_plan,
    moment_release,
    weighted_plan,
)
from dpnode.sdk._remote import (
    RemoteTensor,
    active_session,
    encode_graph,
    graph_for,
    origins,
)
from dpnode.sdk._remote.graph import Node
from dpnode.sdk._remote.losses import OVERRIDES

if TYPE_CHECKING:
    from dpnode.sdk._publish import Receipt

__all__ = ["MomentCall", "Swap", "recorded_call", "swap_moments"]


@dataclass(frozen=True)
class MomentCall:
    """A ``torch.cov``/``torch.corrcoef`` of remote ``x`` (variables, observations) whose
    result was the recorded node ``node``."""

    kind: str
    x: RemoteTensor
    correction: int
    node: Node
    #: the moment vector built for each plan so far: publishing the same tensor again
    #: reuses it (and the bounds the node reported for it)
    releases: dict[MomentPlan, MomentRelease] = field(default_factory=dict, compare=False)

    @property
    def rows(self) -> torch.Tensor:
        """The observations as rows: ``(observations, variables)``."""
        return self.x.unsqueeze(1) if self.x.dim() == 1 else self.x.T


#: result tensor -> the call that made it (weakly keyed by identity: tensors have no ==)
_RECORDED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def recorded_call(t: torch.Tensor) -> MomentCall | None:
    """The cov/corrcoef call whose result ``t`` still is, if any."""
    call: MomentCall | None = _RECORDED.get(t)  # type: ignore[no-untyped-call]
    if call is None or not isinstance(t, RemoteTensor) or t.node is not call.node:
        return None
    return call


def _composite(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return torch._C._disabled_torch_function_impl(func, (RemoteTensor,), args, kwargs)


def _remember(kind: str, x: Any, out: Any, correction: int) -> Any:
    if (
        isinstance(x, RemoteTensor)
        and isinstance(out, RemoteTensor)
        and x.node.private
        and x.dim() in (1, 2)
        and x.numel() > 0
        and x.shape[-1] - correction > 0
    ):
        _RECORDED[out] = MomentCall(kind, x, correction, out.node)
    return out


def _cov(func: Any) -> Callable[..., Any]:
    def cov(input: Any, *, correction: int = 1, fweights: Any = None, aweights: Any = None) -> Any:
        kwargs = {"correction": correction, "fweights": fweights, "aweights": aweights}
        out = _composite(func, (input,), kwargs)
        if fweights is not None or aweights is not None:
            return out
        return _remember("cov", input, out, int(correction))

    return cov


def _corrcoef(func: Any) -> Callable[..., Any]:
    def corrcoef(input: Any) -> Any:
        return _remember("corrcoef", input, _composite(func, (input,), {}), 1)

    return corrcoef


_CALLS: list[tuple[Any, Callable[[Any], Callable[..., Any]]]] = [
    (torch.cov, _cov),
    (torch.Tensor.cov, _cov),
    (torch.corrcoef, _corrcoef),
    (torch.Tensor.corrcoef, _corrcoef),
]
for _func, _make in _CALLS:
    OVERRIDES[_func] = _make(_func)


Finish = Callable[[torch.Tensor, "Receipt"], torch.Tensor]


@dataclass(frozen=True)
class Swap:
    """What a publish sends in place of the tensors asked (``items``), the delta to send
    with them, and how to turn each released value back into the tensor asked (None: as it
    is)."""

    items: list[RemoteTensor]
    delta: float | None
    finish: list[Finish | None]


def swap_moments(
    items: Sequence[RemoteTensor], *, epsilon: float, delta: float | None, client: Any = None
) -> Swap:
    """Each recorded cov/corrcoef among ``items`` replaced by its rows' moment vector.

    The norm follows the publish: L1 (Laplace) without ``delta``; with it, L2 (Gaussian)
    when other tensors share the publish, else whichever noises the matrices less
    (:func:`dpnode.sdk._moments.choose_plan`; a Laplace release is sent without ``delta``).

    Raises:
        DPNodeError: a column without finite bounds (as :func:`moment_release`).
    """
    calls = [recorded_call(t) for t in items]
    if not any(calls):
        return Swap(list(items), delta, [None] * len(items))
    order = 1
    if delta is not None:
        widest = max(int(c.rows.shape[1]) for c in calls if c is not None)
        alone = all(c is not None for c in calls)
        order = choose_plan(widest, epsilon=epsilon, delta=delta).order if alone else 2
    sent: list[RemoteTensor] = []
    finish: list[Finish | None] = []
    for t, call in zip(items, calls, strict=True):
        if call is None:
            sent.append(t)
            finish.append(None)
            continue
        plan = weighted_plan(int(call.rows.shape[1]), False, order)
        release = call.releases.get(plan)
        if release is None:
            release = _kept_release(call.rows, plan, epsilon=epsilon, client=client)
            call.releases[plan] = release
        sent.append(release.vector)
        finish.append(_finisher(call, release, t))
    return Swap(sent, delta if order == 2 else None, finish)


#: the moment releases last built (:data:`KEPT_RELEASES`), by their rows' graph and plan,
#: each with the sessions it was built for (:func:`_kept_release`)
_KEPT: OrderedDict[tuple[bytes, MomentPlan], tuple[tuple[Any, ...], MomentRelease]] = OrderedDict()
KEPT_RELEASES = 64
_KEPT_LOCK = threading.Lock()


def _kept_release(
    rows: torch.Tensor, plan: MomentPlan, *, epsilon: float, client: Any
) -> MomentRelease:
    """:func:`moment_release` of ``rows``, or the one built before from the same graph.

    A release follows from the rows' graph (its frame: the datasets' columns by id, every
    op and constant), the columns' public ranges (the datasets' declared bounds, which never
    change under an id never reused) and the plan; so ``torch.cov(x)`` recorded again on
    the same columns (a loop, a notebook cell run twice) reuses its vector instead of asking
    the node for the ranges and recording two dozen ops again. Not kept: a dry run's (the
    mock's ranges) and rows computed from a model's weights (which an owner may replace);
    nor shared between sessions (the sessions the data came from, and ``client``, are part
    of the entry)."""
    assert isinstance(rows, RemoteTensor)  # a recorded call's rows
    graph = graph_for([rows])
    if active_session() is not None or any(n.startswith("model:") for n in graph.input_names()):
        return moment_release(rows, epsilon=epsilon, plan=plan, client=client)
    key = (hashlib.blake2b(encode_graph(graph).frame, digest_size=32).digest(), plan)
    sessions = (client, *origins([rows.node]))
    with _KEPT_LOCK:  # publishes from several threads
        kept = _KEPT.get(key)
        if (
            kept is not None
            and len(kept[0]) == len(sessions)
            and all(a is b for a, b in zip(kept[0], sessions, strict=True))
        ):
            _KEPT.move_to_end(key)
            return kept[1]
    release = moment_release(rows, epsilon=epsilon, plan=plan, client=client)
    with _KEPT_LOCK:
        _KEPT[key] = (sessions, release)
        while len(_KEPT) > KEPT_RELEASES:
            _KEPT.popitem(last=False)
    return release


def _finisher(call: MomentCall, release: MomentRelease, like: RemoteTensor) -> Finish:
    def finish(released: torch.Tensor, receipt: Receipt) -> torch.Tensor:
        moments = release.finish(released, receipt)
        matrix = moments.cov(call.correction) if call.kind == "cov" else moments.corrcoef()
        out = matrix.reshape(like.shape)
        out = out.to(like.dtype) if like.dtype.is_floating_point else out
        plan = release.plan
        note = (
            f"torch.{call.kind} computed here from one release of the rows' moments (each "
            f"row's columns centred and scaled by their bounds, its vector of sums, squares "
            f"and products clipped to L{plan.order} norm {plan.bound:.4g}); the covariance "
            "projected onto the positive semidefinite matrices"
        )
        if call.kind == "corrcoef":
            note += (
                f"; each variance dividing no lower than {VARIANCE_FLOOR:g} standard deviations "
                "of its noise"
            )
        out.receipt = dataclasses.replace(receipt, post_processing=note)  # type: ignore[attr-defined]
        return out

    return finish

"""A release in two halves: what public metadata decides, then what the values give.

A refused publish must not tell the analyst anything about the data: not in its message,
not in its error type, not in its timing. So everything that can refuse a release is
decided *before* any private value is read, from the graph, the inputs' public metadata
and the request only:

1. :func:`plan_release` tracks the graph's sensitivity (:func:`~dpnode.core.privacy.track`: a
   graph the tracker cannot bound is refused without being evaluated) and plans the noise
   (:func:`~dpnode.core.dp.mechanisms.plan_laplace` / ``plan_gaussian``), which fixes the cost.
   The caller then charges the budget: policy, rate limits and budget refuse here too.
2. :func:`run_release` evaluates the plan on the values, with total kernels (no value
   makes a prim fail: :attr:`~dpnode.core.engine.prims.Call.total`), clips every output to its
   public bounds, replaces a NaN by a public constant, noises, and clips the noised values
   to the same bounds (post-processing: a count stays in ``[0, n]``, a standard deviation
   stays ``>= 0``; the tracker caps each output's sensitivity at its range's width for
   the same reason). It does not raise
   because of a value: once charged, always answered. Should the evaluation fail all the
   same (a bug, or memory), the answer is the public constants, noised as any other, and
   the failure is returned separately for the operator's log: never to the analyst.

The keys private data holds (``key_counts``) are released above a noisy threshold paid with
epsilon and delta (:mod:`dpnode.core.privacy.key_release`): the answer's length depends on the
data only through which keys clear it.

A quantile (``torch.median``, ``torch.quantile``) of private values is not noised but
*selected* by the exponential mechanism over a public grid (:mod:`dpnode.core.dp.selection`):
a publish whose outputs are all quantiles plans that instead (:func:`_plan_selection`),
from the same public metadata (the values' tracked range, and how many of them one
subject can move), and evaluates only what the quantiles are taken of.

The bits of the answer carry nothing beyond the noised value: NaN never leaves (1.), a
``-0.0`` becomes ``0.0`` (:func:`~dpnode.core.dp.mechanisms.apply_noise`), and values on the
noise grid are the exact post-processing of an integer mechanism (:mod:`dpnode.core.dp.grid`).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.dp import selection
from dpnode.core.dp.mechanisms import NoisePlan, Release, apply_noise, plan_gaussian, plan_laplace
from dpnode.core.dp.samplers import Source, word_source
from dpnode.core.engine import Graph, Plan, plan, run, structure_hash
from dpnode.core.engine.blocks import PassRunner
from dpnode.core.engine.graph import Ref
from dpnode.core.errors import InvalidRequestError
from dpnode.core.privacy.key_release import KeyRelease, plan_keys_release, run_keys_release
from dpnode.core.privacy.spec import InputSpec
from dpnode.core.privacy.state import PrivacyTrackingError
from dpnode.core.privacy.tracker import OutputSensitivity, PrivacyReport, selection_inputs, track

__all__ = ["ReleasePlan", "Released", "output_ranges", "plan_release", "run_release"]

#: Grid indices are kept below 2^this (the grid check in dpnode.core.dp.grid allows more).
_GRID_INDEX_BITS = 1000


@dataclass(frozen=True, eq=False)
class ReleasePlan:
    """Everything about a release that is known before its values: public by construction.

    Attributes:
        plan: the engine plan (made with ``accurate=True``: accurate and total kernels).
        report: the tracked sensitivity and bounds of every output.
        noise: the mechanism, its grid, scale and cost.
        lower, upper: per released element (flattened), the bounds values are clipped to:
            the tracked bounds, narrowed to what the noise grid can hold.
        fallback: per released element, the public value that stands for a NaN.
        selection: for a release of quantiles, their selections; ``plan`` then computes
            what they are taken of (one output per quantile output).
    """

    plan: Plan
    report: PrivacyReport
    noise: NoisePlan
    lower: npt.NDArray[np.float64]
    upper: npt.NDArray[np.float64]
    fallback: npt.NDArray[np.float64]
    selection: selection.SelectionPlan | None = None
    #: for a release of the keys private data holds (``key_counts``), its threshold plan
    keys: KeyRelease | None = None
    #: per output: whether it is a symmetric matrix in exact arithmetic (``X.T @ X``)
    symmetric: tuple[bool, ...] = ()

    @property
    def count(self) -> int:
        return self.noise.count


@dataclass(frozen=True, eq=False)
class Released:
    """The outputs of a release, in their shapes, and how they were noised.

    ``failure`` is for the node's operator only (an audit record): the analyst's answer
    is the same whether or not it is set.
    """

    values: list[npt.NDArray[np.float64]]
    release: Release
    failure: str | None
    #: how many noised values were outside their public range and moved to its end (a
    #: function of the answer and public bounds: the analyst could count them too)
    clipped: int = 0
    #: how many outputs, symmetric matrices, were made symmetric again after the noise
    symmetrized: int = 0


def plan_release(
    planned: Plan,
    specs: Mapping[str, InputSpec],
    *,
    epsilon: float,
    delta: float | None,
    tracked: Callable[[Plan, Mapping[str, InputSpec]], PrivacyReport] = track,
) -> ReleasePlan:
    """Track ``planned`` and plan its noise, from public metadata only.

    Args:
        planned: from ``plan(graph, quotas, accurate=True)``.
        specs: every input's public metadata (a public input may carry its value).
        epsilon: the epsilon the mechanism is calibrated to (> 0).
        delta: None for Laplace (pure epsilon), else the Gaussian's delta.
        tracked: what tracks the plan (:func:`~dpnode.core.privacy.track`, or a
            :class:`~dpnode.core.privacy.cache.TrackingCache`'s ``report``).

    Raises:
        PrivacyTrackingError: the graph cannot be bounded (a prim without a privacy rule
            on private data, an unbounded output).
        InvalidRequestError: the privacy parameters are invalid or too small for the count.
    """
    chosen = _plan_selection(planned, specs, epsilon=epsilon, delta=delta)
    if chosen is not None:
        return chosen
    keys = plan_keys_release(planned, specs, epsilon=epsilon, delta=delta)
    if keys is not None:
        of, shown, noise, release = keys
        none = np.zeros(0)
        return ReleasePlan(of, shown, noise, none, none, none, keys=release)
    report = tracked(planned, specs)
    # A report reused (the same publish again, a training loop's steps) keeps what follows
    # from it, for the same structure and privacy parameters: all of it public.
    key = (structure_hash(planned.graph), epsilon, delta)
    kept = report.kept.get(key)
    if kept is None:
        kept = _public_plan(planned, report, epsilon=epsilon, delta=delta)
        if kept.noise.count <= _KEPT_VALUES:
            if len(report.kept) >= _KEPT_PLANS:
                report.kept.clear()
            report.kept[key] = kept
    return ReleasePlan(
        planned, report, kept.noise, kept.lower, kept.upper, kept.fallback, symmetric=kept.symmetric
    )


#: A release of at most this many values keeps its plan's arrays with its report (larger ones
#: cost as much to keep as to work out again), and a report keeps at most this many plans.
_KEPT_VALUES = 4096
_KEPT_PLANS = 8


@dataclass(frozen=True)
class _PublicPlan:
    """What a release plan works out from its report (:func:`plan_release`); the arrays are
    read-only, as a plan kept is shared by the releases that use it."""

    noise: NoisePlan
    lower: npt.NDArray[np.float64]
    upper: npt.NDArray[np.float64]
    fallback: npt.NDArray[np.float64]
    symmetric: tuple[bool, ...]


def _public_plan(
    planned: Plan, report: PrivacyReport, *, epsilon: float, delta: float | None
) -> _PublicPlan:
    count = sum(math.prod(o.shape) for o in report.outputs)
    # every output proven an integer on every dataset: noised on the integers, unrounded
    whole = report.integral
    if delta is None:
        noise = plan_laplace(sensitivity_l1=report.l1, epsilon=epsilon, count=count, integral=whole)
    else:
        noise = plan_gaussian(
            sensitivity_l2=report.l2, count=count, epsilon=epsilon, delta=delta, integral=whole
        )
    lower, upper = output_ranges(planned, report)
    # Narrowing the clip to what the grid holds is post-processing (clipping never widens
    # a difference); only absurd magnitudes (beyond 2^1000 grid steps) are touched.
    limit = sys.float_info.max
    if noise.grid_exponent is not None and _GRID_INDEX_BITS + noise.grid_exponent < 1024:
        limit = math.ldexp(1.0, _GRID_INDEX_BITS + noise.grid_exponent)
    np.clip(lower, -limit, limit, out=lower)
    np.clip(upper, -limit, limit, out=upper)
    fallback = np.clip(np.zeros(count), lower, upper)
    for array in (lower, upper, fallback):
        array.flags.writeable = False
    symmetric = tuple(_symmetric(planned.graph, o) for o in planned.graph.outputs)
    return _PublicPlan(noise, lower, upper, fallback, symmetric)


def output_ranges(
    planned: Plan, report: PrivacyReport
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per released element (flattened), the public range its value lies in: the tracked
    bounds, an integer output's rounded inward to integers.

    Raises:
        InvalidRequestError: an output is infinite or NaN whatever the data (the mean of no
            rows): a public value, with nothing to noise.
    """
    # an integer output's values are integers: its range's ends are too
    ends = [
        (o.lower, o.upper) if m.dtype.is_float else (np.ceil(o.lower), np.floor(o.upper))
        for o, m in zip(report.outputs, planned.outputs, strict=True)
    ]
    lower = _flat([lo for lo, _ in ends], report)
    upper = _flat([hi for _, hi in ends], report)
    if not ((lower < math.inf).all() and (upper > -math.inf).all()):  # NaN or infinite
        raise InvalidRequestError(  # (a private output's bounds were checked finite)
            "an output is infinite or NaN whatever the data (a public value): there is "
            "nothing to noise; compute it without publishing"
        )
    return lower, upper


#: prims that keep a symmetric matrix symmetric when their other arguments are scalars
_ELEMENTWISE = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "neg",
        "abs",
        "sqrt",
        "exp",
        "log",
        "clamp",
        "convert_element_type",
        "true_divide",
        "pow",
        "square",
        "reciprocal",
    }
)


def _symmetric(graph: Graph, index: int) -> bool:
    """Whether node ``index`` is a square matrix equal to its transpose in exact arithmetic,
    from the graph's structure alone: ``A.T @ A`` or ``A @ A.T``, and elementwise functions of
    symmetric matrices and scalars (``(X.T @ X) / n``, a covariance). False when unsure."""
    nodes = graph.nodes
    seen: dict[int, bool] = {}

    def transposed(i: int, j: int) -> bool:  # node i is node j transposed
        n = nodes[i]
        return (
            n.op == "permute"
            and tuple(n.attrs.get("dims", ())) == (1, 0)  # type: ignore[arg-type]
            and isinstance(n.args[0], Ref)
            and n.args[0].index == j
        )

    def check(i: int, depth: int) -> bool:
        if i in seen:
            return seen[i]
        n = nodes[i]
        ok = False
        if depth < 64 and n.op == "matmul" and len(n.args) == 2:
            a, b = n.args
            if isinstance(a, Ref) and isinstance(b, Ref):
                ok = transposed(a.index, b.index) or transposed(b.index, a.index)
        elif depth < 64 and n.op in _ELEMENTWISE:
            refs = [a for a in n.args if isinstance(a, Ref)]
            ok = (
                bool(refs)
                and all(check(r.index, depth + 1) or _scalar(nodes[r.index]) for r in refs)
                and any(not _scalar(nodes[r.index]) for r in refs)
            )
        seen[i] = ok
        return ok

    return check(index, 0)


def _scalar(node: object) -> bool:
    """A 0-dim constant (a Python scalar recorded as a tensor)."""
    value = getattr(node, "value", None)
    return getattr(node, "op", None) == "constant" and value is not None and value.ndim == 0


def _plan_selection(
    planned: Plan, specs: Mapping[str, InputSpec], *, epsilon: float, delta: float | None
) -> ReleasePlan | None:
    """The plan of a release of quantiles of private values; None if there are none.

    Every output must then be such a quantile, of public quantiles ``q`` (a constant),
    possibly per group (a group index per value, ``groups`` attribute).
    """
    nodes, outputs = planned.graph.nodes, planned.graph.outputs
    quantiles = [o for o in outputs if nodes[o].op == "quantile"]
    if not quantiles:
        return None
    # what the selections read: each quantile's values, and its group index if grouped
    taken: list[int] = []
    joined: dict[int, int] = {}
    for o in quantiles:
        taken.append(_ref(nodes[o].args[0]))
        if _groups(nodes[o]):
            joined[len(taken) - 1] = len(taken)
            taken.append(_ref(nodes[o].args[2]))
    of = plan(Graph(nodes, tuple(taken)), accurate=True)
    report, moves, spans = selection_inputs(of, specs, joined)
    if all(moves[i] is None for i in range(len(taken)) if i not in joined.values()):
        return None  # quantiles of public values: computed exactly, like any public value
    if len(quantiles) != len(outputs):
        raise PrivacyTrackingError(
            "a quantile (median) of private values is released by the exponential mechanism, "
            "on its own: publish the quantiles and the other results separately"
        )
    if delta is not None:
        raise InvalidRequestError(
            "a quantile (median) is selected by the exponential mechanism, which is pure "
            "epsilon-DP: publish it without delta"
        )
    asked = []
    parts: list[tuple[npt.NDArray[np.float64], list[float], int, int]] = []
    shapes, ks = [], []
    position = 0
    for o in quantiles:
        q = nodes[_ref(nodes[o].args[1])]
        if q.op != "constant" or q.value is None:
            raise PrivacyTrackingError(f"node {o} (quantile): the quantiles must be constants")
        span = spans[position]
        grid = selection.candidates(span.lo, span.hi, span.integral, span.values)
        groups = _groups(nodes[o])
        alphas = [float(v) for v in np.asarray(q.value, dtype=np.float64).reshape(-1)]
        if not alphas:
            raise InvalidRequestError(
                f"node {o} (quantile) asks for no quantiles (q is empty): there is nothing "
                "to publish"
            )
        k = moves[position] or 0
        parts.append((grid, alphas, k, groups))
        shape = tuple(np.shape(q.value))
        shapes.append((groups, *shape) if groups else shape)
        ks.append(k)
        asked.append(position)
        position += 2 if groups else 1
    sel = selection.plan_selection(epsilon=epsilon, outputs=parts)
    # what the receipt shows: per output, the score's sensitivity and the candidates' range
    selected = PrivacyReport(
        tuple(
            OutputSensitivity(
                shape,
                k,
                k,
                np.full(shape, grid[0]),
                np.full(shape, grid[-1]),
                np.full(1, float(k)),
                np.full(1, float(k)),
                k,
                k,
                0.0,
                0.0,
            )
            for shape, k, (grid, *_) in zip(shapes, ks, parts, strict=True)
        ),
        report.subjects,
    )
    noise = NoisePlan(
        mechanism="exponential",
        count=sel.count,
        grid_exponent=None,
        # the largest scale of the selections: 2 * sensitivity / epsilon
        scale=max((2 * float(x.sensitivity) / x.epsilon for x in sel.selections), default=0.0),
        sensitivity=float(max(ks, default=0)),
        epsilon=epsilon,
        rho=0.0,
        sampler_tv=sel.sampler_tv,
        sampler=None,
    )
    lower = _flat([grid[0] for grid, *_ in parts], selected)
    upper = _flat([grid[-1] for grid, *_ in parts], selected)
    return ReleasePlan(of, selected, noise, lower, upper, lower.copy(), sel)


def _groups(node: Any) -> int:
    """A quantile's number of groups (0: not grouped)."""
    groups = node.attrs.get("groups")
    return groups if isinstance(groups, int) else 0


def _ref(arg: object) -> int:
    if not isinstance(arg, Ref):
        raise PrivacyTrackingError("a quantile's arguments must be tensors")
    return arg.index


def _run_selection(
    rp: ReleasePlan,
    inputs: Mapping[str, npt.NDArray[Any]] | Callable[[], Mapping[str, npt.NDArray[Any]]],
    *,
    rng: np.random.Generator | None,
    source: Source,
) -> Released:
    """:func:`run_release` for quantiles: evaluate what they are taken of, then select."""
    sel = rp.selection
    assert sel is not None
    failure: str | None = None
    metas = rp.plan.outputs
    try:
        values = inputs() if callable(inputs) else inputs
        taken = [np.asarray(v) for v in run(rp.plan, values, rng=rng).outputs]
    except Exception as exc:  # once charged, always answered: public stand-ins
        failure = f"{type(exc).__name__}: {exc}"
        taken = [np.zeros(m.shape, dtype=m.dtype.np) for m in metas]
    try:
        flat_all = _select(rp, taken, source)
    except Exception as exc:  # a bug: the public stand-ins, as for a failed evaluation
        failure = failure or f"{type(exc).__name__}: {exc}"
        flat_all = rp.fallback.copy()
    release = Release(
        values=flat_all,
        mechanism="exponential",
        grid_exponent=None,
        scale=rp.noise.scale,
        sensitivity=rp.noise.sensitivity,
        epsilon=rp.noise.epsilon,
        rho=0.0,
        sampler_tv=rp.noise.sampler_tv,
    )
    return Released(rp.report.split(flat_all + 0.0), release, failure)


def _select(
    rp: ReleasePlan, taken: list[npt.NDArray[Any]], source: Source
) -> npt.NDArray[np.float64]:
    """The selected quantiles, flat, from the values they are taken of."""
    sel = rp.selection
    assert sel is not None
    metas = rp.plan.outputs
    words = word_source(source)
    pieces: list[npt.NDArray[np.float64]] = []
    position, j = 0, 0
    for out, grouped in zip(rp.report.outputs, sel.grouped, strict=True):
        x, meta = taken[position], metas[position]
        index = np.asarray(taken[position + 1]).reshape(-1).astype(np.int64) if grouped else None
        lo, hi = float(np.min(out.lower)), float(np.max(out.upper))
        flat = np.asarray(x, dtype=np.float64).reshape(-1)
        # the same work whatever the values: clip to the public range, NaN to its low end
        flat = np.where(np.isnan(flat), lo, np.clip(flat, lo, hi))
        count = math.prod(out.shape[1:] if grouped else out.shape)
        picks = []
        for _ in range(count):
            picks.append(
                selection.select_quantiles(flat, sel.selections[j], words=words, groups=index)
            )
            j += 1
        chosen = np.stack(picks, axis=-1) if picks else np.zeros((0,))
        if not meta.dtype.is_float:  # an integer quantile is an integer (post-processing)
            chosen = np.round(chosen)
        pieces.append(chosen.reshape(-1))
        position += 2 if grouped else 1
    return np.concatenate(pieces) if pieces else np.zeros(0)


def _flat(parts: list[npt.NDArray[Any]], report: PrivacyReport) -> npt.NDArray[np.float64]:
    arrays = [
        np.broadcast_to(np.asarray(p, dtype=np.float64), o.shape).ravel()
        for p, o in zip(parts, report.outputs, strict=True)
    ]
    return np.concatenate(arrays) if arrays else np.zeros(0)


def run_release(
    rp: ReleasePlan,
    inputs: Mapping[str, npt.NDArray[Any]] | Callable[[], Mapping[str, npt.NDArray[Any]]],
    *,
    rng: np.random.Generator | None = None,
    source: Source = "auto",
    runner: PassRunner | None = None,
) -> Released:
    """Evaluate, clip, and noise: never raises because of a value (see the module docstring).

    Args:
        rp: from :func:`plan_release`.
        inputs: one array per graph input, or a function reading them (called inside,
            so that a failure to read is answered like any other).
        rng: the generator of random prims (a fresh OS-seeded one if None).
        source: the noise's randomness source.
        runner: evaluates the plan's block passes elsewhere (``inputs`` then omits the row
            inputs: :func:`~dpnode.core.engine.evaluator.run`); the noise is drawn here.
    """
    if rp.selection is not None:
        return _run_selection(rp, inputs, rng=rng, source=source)
    if rp.keys is not None:
        answer, done, problem = run_keys_release(rp.plan, rp.keys, inputs, rng=rng, source=source)
        return Released([answer], done, problem)
    failure: str | None = None
    flat = np.empty(rp.count)
    try:
        values = inputs() if callable(inputs) else inputs
        outputs = run(rp.plan, values, rng=rng, runner=runner).outputs
        start = 0
        for v in outputs:
            size = v.size
            flat[start : start + size] = np.asarray(v, dtype=np.float64).reshape(-1)
            start += size
    except Exception as exc:  # once charged, always answered
        failure = f"{type(exc).__name__}: {exc}"
        flat[:] = rp.fallback
    # the same work whatever the values: clip, then a NaN (or an infinite value of a public
    # output, whose range is unknown) becomes its public stand-in
    np.clip(flat, rp.lower, rp.upper, out=flat)
    nan = ~np.isfinite(flat)
    np.copyto(flat, rp.fallback, where=nan)
    if failure is None and nan.any():  # a tracker that missed a NaN: the operator hears of it
        failure = f"{int(nan.sum())} NaN or infinite values replaced by their public stand-ins"
    release = apply_noise(flat, rp.noise, source=source)
    # Free post-processing: a noised value outside its public range is moved to the range's
    # nearer end (never further from the true value, which lies inside); + 0.0 keeps a
    # bound of -0.0 from showing as a sign.
    noised = release.values
    symmetrized = 0
    if any(rp.symmetric):  # free post-processing: the mean of a matrix and its transpose
        pieces = rp.report.split(noised.copy())
        for k, sym in enumerate(rp.symmetric):
            m = pieces[k]
            if sym and m.ndim == 2 and m.shape[0] == m.shape[1]:
                pieces[k] = (m + m.T) / 2
                symmetrized += 1
        noised = np.concatenate([p.reshape(-1) for p in pieces]) if pieces else noised
    public = np.clip(noised, rp.lower, rp.upper) + 0.0
    clipped = int(np.count_nonzero(public != noised))
    return Released(rp.report.split(public), release, failure, clipped, symmetrized)

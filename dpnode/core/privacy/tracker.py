"""The privacy tracker: an engine :class:`~dpnode.core.engine.Tracker` and the public entry points.

:class:`PrivacyTracker` rides along :func:`dpnode.core.engine.run` and gives every node a
:class:`~dpnode.core.privacy.state.State` from its arguments' states, the node's metadata and
public constants only: it is never handed a private value, so what it reports (and
the epsilon charged from it) cannot depend on the data. :func:`track` runs it without
any data (a free sensitivity query); :func:`evaluate_tracked` runs it alongside the
evaluation, in one pass.

Vector outputs get joint bounds beyond what per-element bounds give from three
structures a state may carry: finite-domain and threshold tables (elements that are
functions of one private scalar, :mod:`~dpnode.core.privacy.tables`,
:mod:`~dpnode.core.privacy.thresholds`, through casts by
:mod:`~dpnode.core.privacy.casts`), and partition axes
(:mod:`~dpnode.core.privacy.partitions`). The partition rule: where a state holds at most
one nonzero element per slice along some axes on every dataset (a one-hot, a histogram's
bin filling, their products over several keys), replacing a subject changes at most two
elements per slice, so each slice moves by its two largest element changes and a
histogram of any number of cells by L1 2, L2 sqrt 2 per row of the subject, however
its cells were computed (codes combined from several columns, casts, rounding at bin
edges only choose which cell a row is in).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.engine import REGISTRY, Graph, Plan, Quotas, plan, run
from dpnode.core.engine.dtypes import dtype, from_numpy
from dpnode.core.engine.graph import Node, Ref
from dpnode.core.engine.prims import Call, Scalar, TensorMeta
from dpnode.core.engine.subnormals import flushing
from dpnode.core.privacy import moves, relations, rounding
from dpnode.core.privacy.moves import Span
from dpnode.core.privacy.rules import RULES, Ctx
from dpnode.core.privacy.spec import InputSpec
from dpnode.core.privacy.state import (
    MIXED,
    PUBLIC,
    Array,
    PrivacyTrackingError,
    State,
    fit,
    joint,
    public_state,
)
from dpnode.core.privacy.subjects import Subjects
from dpnode.core.privacy.tables import lazy_root_ids, make_root

__all__ = [
    "OutputSensitivity",
    "PrivacyReport",
    "PrivacyTracker",
    "evaluate_tracked",
    "selection_inputs",
    "track",
]

_log = logging.getLogger("dpnode")

#: the tracker's own float64 arithmetic keeps IEEE gradual underflow (never in the
#: engine's flush-to-zero mode): its roundings err by half of this, absolutely
_SMALLEST_SUBNORMAL = 2.0**-1074


@dataclass(frozen=True)
class OutputSensitivity:
    """Sensitivity of one graph output under replace-one-subject.

    ``l1``/``l2``: bounds on ``||f(D) - f(D')||`` over neighbouring datasets.
    ``lower``/``upper``: bounds on every element's computed value (broadcast to ``shape``).
    ``per_subject_l1``/``per_subject_l2``: the bounds when subject ``s`` changes, shape
    ``(subjects,)``, or ``(1,)`` when they are the same for every subject.
    ``exact_l1``/``exact_l2``: the bounds of exact arithmetic (plus the rounding of
    elements that only their owner moves, which is folded in where it happens);
    ``rounding_l1``/``rounding_l2``: what the rest of the engine's floating-point
    rounding adds (``2 E`` over the elements). ``l1``/``l2`` are their sums, widened by
    the tracker's own rounding (a relative ``1e-9`` at most for a million elements).
    ``integral``: every computed value is an integer on every dataset within the declared
    bounds (:func:`~dpnode.core.privacy.rounding.integral`, from public metadata only), so the
    release can noise it on the integers without rounding it.
    """

    shape: tuple[int, ...]
    l1: float
    l2: float
    lower: Array
    upper: Array
    per_subject_l1: Array
    per_subject_l2: Array
    exact_l1: float
    exact_l2: float
    rounding_l1: float
    rounding_l2: float
    integral: bool = False


@dataclass(frozen=True)
class PrivacyReport:
    """Per-output sensitivities, and the joint sensitivity of publishing them all."""

    outputs: tuple[OutputSensitivity, ...]
    subjects: int

    @functools.cached_property
    def l1(self) -> float:
        """L1 sensitivity of all outputs released together (worst subject, summed)."""
        return _joined([o.per_subject_l1 for o in self.outputs], squares=False)

    @functools.cached_property
    def l2(self) -> float:
        """L2 sensitivity of all outputs released together."""
        return _joined([o.per_subject_l2 for o in self.outputs], squares=True)

    @property
    def integral(self) -> bool:
        """Whether every output is an integer on every dataset (an empty report is not:
        it has nothing to noise)."""
        return bool(self.outputs) and all(o.integral for o in self.outputs)

    @functools.cached_property
    def kept(self) -> dict[Any, Any]:
        """Public values worked out from this report, kept with it for its next use (a
        report a :class:`~dpnode.core.privacy.cache.TrackingCache` reuses): the release
        plans of :func:`dpnode.core.privacy.release.plan_release`."""
        return {}

    def split(self, flat: npt.NDArray[np.float64]) -> list[npt.NDArray[np.float64]]:
        """All outputs' elements, flattened one after the other, back in their shapes."""
        pieces, start = [], 0
        for out in self.outputs:
            size = int(np.prod(out.shape, dtype=np.int64))
            pieces.append(flat[start : start + size].reshape(out.shape))
            start += size
        return pieces


def _as_float64_error(lo: Array, hi: Array) -> Array:
    """How far an integer in ``[lo, hi]`` moves when the release converts it to float64:
    half a float64 step at its magnitude beyond 2^53, none below (a count offset by 2^62
    moved by 1024 when it moved by 1, across a rounding boundary)."""
    with np.errstate(invalid="ignore"):
        magnitude = np.maximum(np.abs(lo), np.abs(hi))
        return np.where(magnitude >= 2.0**53, np.spacing(magnitude) / 2, 0.0)


def _joined(parts: list[Array], *, squares: bool) -> float:
    """The worst subject's L1 (sum) or L2 (root of the sum of squares) over the outputs'
    per-subject bounds ``parts``, rounded up.

    The L2 is computed on the bounds divided by a power of two above the largest, so that
    no square underflows or overflows: a lone output's L2 of 1e-170 squared to 0, and the
    Gaussian released its value without noise. The float64 sums and root are widened by
    their relative error."""
    if len(parts) == 1:
        return float(parts[0].max(initial=0.0))  # no arithmetic: exact
    top = max(float(p.max(initial=0.0)) for p in parts)
    if top == 0.0 or not math.isfinite(top):
        return top
    if not squares:
        total = float(functools.reduce(np.add, parts).max(initial=0.0))
    else:
        # a power of two in (top / 2, top]: dividing by it is exact (to 2^-1022)
        scale = math.ldexp(1.0, math.frexp(top)[1] - 1)
        sq = functools.reduce(np.add, [np.square(p / scale) for p in parts])
        total = math.sqrt(float(sq.max(initial=0.0))) * scale
    widened = total * (1 + rounding.gamma(len(parts) + 3, rounding.unit(dtype("float64"))))
    return math.nextafter(widened, math.inf)


class PrivacyTracker:
    """Per-node privacy states, from public metadata only (see the module docstring)."""

    name = "privacy"

    def __init__(
        self,
        specs: Mapping[str, InputSpec],
        boxes: Mapping[int, tuple[Array, Array]] | None = None,
    ) -> None:
        self.specs = dict(specs)
        #: constants (by node index) tracked as a public interval instead of their value
        self.boxes = dict(boxes or {})
        self.nsub = 1
        #: subject structure per input name, computed once per index array
        self.structures: dict[str, Subjects] = {}
        #: elements of the largest tensor visited, plus the nodes visited
        self.terms = 0

    def prepare(self, graph: Graph) -> None:
        """Count subjects over the graph's private inputs (before the first visit)."""
        n = 0
        by_index: dict[int, Subjects] = {}
        for node in graph.nodes:
            if node.op == "input":
                name = str(node.attrs["name"])
                spec = self._spec(name)
                shape: tuple[int, ...] = tuple(node.attrs["shape"])  # type: ignore[arg-type]
                if spec.is_public or not shape:
                    continue
                rows = int(shape[spec.row_axis % len(shape)])
                key = id(spec.subjects) if spec.subjects is not None else -rows - 1
                if key not in by_index:  # columns of one dataset share one index
                    by_index[key] = spec.structure(rows)
                self.structures[name] = by_index[key]
                n = max(n, spec.subject_count(shape))
        self.nsub = max(n, 1)

    def _spec(self, name: str) -> InputSpec:
        spec = self.specs.get(name)
        if spec is None:
            raise PrivacyTrackingError(
                f"input {name!r} has no privacy metadata; declare bounds or mark it public"
            )
        return spec

    def visit(
        self, index: int, node: Node, call: Call | None, meta: TensorMeta, arg_states: list[Any]
    ) -> State:
        """The state of node ``index`` (the engine's tracker protocol)."""
        self.terms = max(self.terms, meta.numel) + 1
        if node.op == "input":
            name = str(node.attrs["name"])
            s = self._spec(name).state(name, meta.shape, meta.dtype, self.structures.get(name))
            if s.is_public:
                return s
            t = make_root(s, index)
            if t is not None:
                return s.with_(table=t)
            if not meta.dtype.is_bool:  # a root for threshold tables (comparisons)
                return s.with_(vid=lazy_root_ids(index, meta.shape))
            return s
        if node.op == "constant":
            assert node.value is not None
            box = self.boxes.get(index)
            if box is not None:  # public, anywhere in the box: the report holds for all
                z = fit(0.0, meta.shape)
                lo, hi = (np.asarray(b, dtype=np.float64).reshape(meta.shape) for b in box)
                return State(
                    meta.shape, meta.dtype, lo, hi, fit(np.int64(PUBLIC), meta.shape), z, z
                )
            return public_state(node.value, meta.dtype)
        assert call is not None
        if meta.numel == 0:  # no elements: nothing any subject could move
            return public_state(np.zeros(meta.shape, dtype=meta.dtype.np), meta.dtype)
        ctx = self._context(index, node, call, meta, arg_states)
        present = [a for a in ctx.args if a is not None]
        rule = RULES.get(node.op)
        if all(a.is_public for a in present):
            public = self._public(ctx)
            if public is not None:
                return public
            if rule is None:
                return _unknown_public(meta)
        if rule is None:
            raise PrivacyTrackingError(
                f"node {index}: prim {node.op!r} has no privacy rule, so it cannot be "
                "applied to private data; the graph is refused"
            )
        try:
            state = relations.narrow(ctx, rounding.apply(ctx, rule))
        except PrivacyTrackingError:
            raise
        except (ArithmeticError, IndexError, TypeError, ValueError) as exc:
            # a rule met arguments it was not written for: a bug in the rule, logged for the
            # operator, but still a refusal before anything runs or is charged (never a 500)
            _log.exception("the privacy rule of %s failed on node %d", node.op, index)
            raise PrivacyTrackingError(
                f"node {index} ({node.op}): the node's privacy tracker cannot bound this op "
                f"for these arguments (an internal error, {type(exc).__name__}, in its rule; "
                "the node's log has the details): the graph is refused and nothing was charged"
            ) from exc
        if state.shape != meta.shape:  # pragma: no cover - a rule bug, never silently
            raise AssertionError(f"privacy rule of {node.op} gave shape {state.shape}")
        if any(_may_be_nan(a) for a in present):
            # a NaN argument makes a NaN (an interval cannot hold it: 1 / (|NaN| + 0.5)
            # would look bounded); a comparison, isnan or cast of it is bounded, but whether
            # it is NaN is not what its argument's changes bound (0 * m is NaN when a sum m
            # of every row overflows): any subject may move it across its range
            return _nan(state) if meta.dtype.is_float else _any_subject(state)
        if meta.dtype.is_float and _makes_nan(node.op, present, state):
            return _nan(state)
        return state

    def _context(
        self, index: int, node: Node, call: Call, meta: TensorMeta, arg_states: list[Any]
    ) -> Ctx:
        args: list[State | None] = []
        raw: list[Any] = []
        refs: list[int | None] = []
        for a, st in zip(node.args, arg_states, strict=True):
            if isinstance(a, Ref):
                args.append(st)
                raw.append(None)
                refs.append(a.index)
            elif isinstance(a, Scalar):
                v = np.asarray(a.value)
                args.append(public_state(v, from_numpy(v.dtype)))
                raw.append(a.value)
                refs.append(None)
            else:
                args.append(None)
                raw.append(None)
                refs.append(None)
        return Ctx(index, node, call, meta, args, raw, refs, self.nsub)

    def _public(self, c: Ctx) -> State | None:
        """A prim on public arguments only: its value, when every argument's is known."""
        vals: list[Any] = []
        for st, r in zip(c.args, c.raw, strict=True):
            if st is None:
                vals.append(None)
            elif r is not None:
                vals.append(r)
            elif st.value is not None:
                vals.append(np.asarray(st.value))
            else:
                return None
        try:  # in the engine's mode, so that the value is the engine's to the bit
            with np.errstate(all="ignore"), flushing():
                v = np.asarray(REGISTRY[c.node.op].kernel(c.call, vals, None))
        except Exception:  # random prims (no generator here) and the like: value unknown
            return None
        if v.shape != c.meta.shape or v.dtype != c.meta.dtype.np:
            return None
        return public_state(v, c.meta.dtype)

    def report(self, states: list[State], locate: Callable[[], str] | None = None) -> PrivacyReport:
        """Sensitivities of the outputs whose states are ``states``. ``locate`` names, for a
        refusal of unbounded values, the node where they became unbounded (called only then).
        """
        # the tracker's own float64 arithmetic (sums of at most ``terms`` terms, chained
        # over the graph) is rounded to nearest: every reported bound is widened by its
        # relative error so that it holds exactly, and a nonzero sensitivity also by as many
        # of the smallest subnormals (a product in the subnormal range errs by up to half of
        # one absolutely, which no relative margin covers)
        roundings = 4 * self.terms + 64
        slack = rounding.gamma(roundings, rounding.unit(dtype("float64")))
        floor = roundings * _SMALLEST_SUBNORMAL  # its own arithmetic never flushes to zero
        outs = []
        for k, s in enumerate(states):
            t1, t2 = joint(s, self.nsub)
            lo, hi = (np.broadcast_to(b, s.shape) for b in rounding.wide(s))  # computed values
            with np.errstate(invalid="ignore"):  # a bound of exactly 0 is exact
                lo = lo - slack * np.abs(lo) - np.where(lo != 0, floor, 0.0)
                hi = hi + slack * np.abs(hi) + np.where(hi != 0, floor, 0.0)
            if not s.is_public and not (np.isfinite(lo).all() and np.isfinite(hi).all()):
                at = "" if locate is None else locate()
                raise PrivacyTrackingError(
                    f"output {k}: its values are unbounded{at} (an operation can overflow, "
                    "divide by a range containing 0 or leave its domain), so no noise can "
                    "cover it"
                )
            exact1, exact2 = float(t1.max(initial=0.0)), float(t2.max(initial=0.0))
            r1 = r2 = 0.0
            E = s.E
            if s.dtype.is_int:  # released as float64, which rounds an integer beyond 2^53
                E = _as_float64_error(lo, hi) if E is None else E + _as_float64_error(lo, hi)
            if E is not None:  # |f~(D) - f~(D')| <= |f(D) - f(D')| + 2E, element by element
                r1, r2 = (2 * r for r in rounding.spread(s, E))
                t1, t2 = t1 + r1, t2 + r2
            t1, t2 = (np.where(t > 0, t * (1 + slack) + floor, t) for t in (t1, t2))
            if not s.is_public:  # no subject moves a value beyond its public range
                w1, w2 = _range_widths(lo, hi)
                t1, t2 = np.minimum(t1, w1), np.minimum(t2, w2)
            l1 = float(t1.max(initial=0.0))
            l2 = float(t2.max(initial=0.0))
            if not (np.isfinite(r1) and np.isfinite(r2)):
                raise PrivacyTrackingError(
                    f"output {k}: the engine's floating-point rounding cannot be bounded "
                    "(an operation's error grows without bound over the input ranges)"
                )
            if not (np.isfinite(l1) and np.isfinite(l2)):
                raise PrivacyTrackingError(f"output {k}: its sensitivity is unbounded")
            outs.append(
                OutputSensitivity(
                    s.shape, l1, l2, lo, hi, t1, t2, exact1, exact2, r1, r2, rounding.integral(s)
                )
            )
        return PrivacyReport(tuple(outs), self.nsub)


def _may_be_nan(s: State) -> bool:
    """Whether a rule marked ``s`` as possibly NaN (NaN bounds: ``inf - inf``, ``0 * inf``,
    ``inf / inf``, ``0 / 0``, sin of infinity)."""
    if not s.dtype.is_float:
        return False
    # a min or max is NaN if any element is (one pass, no temporary array); the computed
    # values' bounds too (an error bound of inf - inf)
    ends = [(s.lo, s.hi)] if s.clo is None or s.chi is None else [(s.lo, s.hi), (s.clo, s.chi)]
    return any(
        math.isnan(float(np.min(lo, initial=np.inf)))
        or math.isnan(float(np.max(hi, initial=-np.inf)))
        for lo, hi in ends
    )


#: prims that make no NaN of infinite (not NaN) arguments, or whose rule already gives NaN
#: bounds where they can: moves and selections, monotone and bounded functions, domains
#: (NaN outside them), ``mul`` (``0 * inf`` is NaN in its interval corners), ``div`` and
#: ``sin``/``cos`` (checked in their rules), and the clip (its kernel zeroes a row that is not
#: finite); ``add``, ``sub``, ``sum`` and ``mean`` are checked by :func:`_makes_nan`
_INFINITY_SAFE = frozenset(
    {
        "abs", "acos", "acosh", "amax", "amin", "asin", "asinh", "atan", "atanh", "cat",
        "ceil", "clamp", "clip_by_subject_norm", "convert_element_type", "cos", "cosh", "div",
        "erf", "erfc", "exp", "exp2", "expand", "expm1", "flip", "floor", "gather",
        "hypot", "index", "index_select", "log", "log10", "log1p", "log2", "maximum",
        "minimum", "mul", "neg", "pad", "permute", "quantile", "rand", "reciprocal",
        "reshape", "round", "rsqrt", "sign", "sin", "sinh", "slice", "sqrt", "squeeze",
        "tanh", "trunc", "unfold", "unsqueeze", "where",
    }
)  # fmt: skip


#: prims that add up terms (of one argument, or products of two): NumPy adds them pairwise
#: or in blocks, so partial sums of finite terms can overflow to +inf and to -inf apart
_SUMS = frozenset({"sum", "mean", "matmul", "convolution"})


def _makes_nan(op: str, args: list[State], state: State) -> bool:
    """Whether the prim may make a NaN that its rule's intervals do not show.

    - Infinite arguments that meet: ``inf - inf`` (an interval sum adds the lower ends and
      the upper ends apart, so ``[0, inf] - [0, inf]`` is ``[-inf, inf]``, never NaN), a sum
      over both infinities, or any prim outside :data:`_INFINITY_SAFE` given an infinite
      argument (a product of matrices meets ``0 * inf``; ``pow``, ``fmod``, ...).
    - Finite terms whose partial sums may overflow apart: the result's computed bounds are
      infinite and its terms may have both signs, so one partial sum may be +inf and
      another -inf (``[1e308, 1e308, -1e308, -1e308]`` sums to NaN pairwise). Terms of one
      sign overflow to one infinity only (a softmax's sum of exponentials).
    """
    if op in _INFINITY_SAFE:
        return False
    ends = [rounding.wide(a) for a in args]
    with np.errstate(invalid="ignore"):
        up = [bool(np.any(np.asarray(hi) == np.inf)) for _, hi in ends]
        down = [bool(np.any(np.asarray(lo) == -np.inf)) for lo, _ in ends]
    if op == "add" and len(args) == 2:
        return (up[0] and down[1]) or (down[0] and up[1])
    if op == "sub" and len(args) == 2:
        return (up[0] and up[1]) or (down[0] and down[1])
    meet = (up[0] and down[0]) if op in ("sum", "mean") and len(args) == 1 else any(up + down)
    if meet or op not in _SUMS:
        return meet
    lo, hi = rounding.wide(state)
    with np.errstate(invalid="ignore"):
        if bool(np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            return False
        return any(bool(np.any(np.asarray(lo) < 0)) for lo, _ in ends)


def _any_subject(s: State) -> State:
    """``s`` with every element movable by any subject across its whole range."""
    with np.errstate(invalid="ignore"):
        width = np.asarray(s.hi, dtype=np.float64) - np.asarray(s.lo, dtype=np.float64)
    width = np.where(np.isnan(width), np.inf, width)
    mixed = fit(np.int64(MIXED), s.shape)
    return s.with_(
        owner=mixed, L=width, G=width, t1=None, t2=None, table=None, vid=None, tag=None, part=None
    )


def _nan(s: State) -> State:
    """``s`` as possibly NaN: NaN bounds, which every later rule keeps and the report refuses."""
    nan = np.full((), np.nan)
    return s.with_(
        lo=nan, hi=nan, clo=None, chi=None, E=None, table=None, t1=None, t2=None, part=None
    )


def _range_widths(lo: Array, hi: Array) -> tuple[float, float]:
    """L1 and L2 norms of ``hi - lo``, rounded up: however one subject moves an output whose
    computed values lie in ``[lo, hi]``, and the release clips them there before the noise
    (:func:`dpnode.core.privacy.release.run_release`), it moves it by at most these.

    >>> [round(w, 9) for w in _range_widths(np.array([0.0, -1.0]), np.array([3.0, 3.0]))]
    [7.0, 5.0]
    """
    with np.errstate(all="ignore"):
        w = np.asarray(hi, dtype=np.float64) - np.asarray(lo, dtype=np.float64)
    if w.size == 0:
        return 0.0, 0.0
    if not np.isfinite(w).all():
        return math.inf, math.inf
    top = float(w.max())
    if top == 0:
        return 0.0, 0.0
    # fsum rounds to nearest, the squares and the root add ulps, and scaling by the widest
    # keeps tiny widths from vanishing in their squares (and huge ones from overflowing)
    margin = 1 + 1e-12
    scaled = w.ravel() / top
    try:
        l1 = math.fsum(w.ravel()) * margin
    except OverflowError:  # widths near the largest float: their sum is not a float
        l1 = math.inf
    return l1, top * math.sqrt(math.fsum(scaled * scaled)) * margin


def _unknown_public(meta: TensorMeta) -> State:
    z = fit(0.0, meta.shape)
    return State(
        meta.shape,
        meta.dtype,
        fit(-np.inf, meta.shape),
        fit(np.inf, meta.shape),
        fit(np.int64(PUBLIC), meta.shape),
        z,
        z,
    )


def _specs_with_values(
    graph: Graph, specs: Mapping[str, InputSpec], inputs: Mapping[str, Array]
) -> dict[str, InputSpec]:
    out = dict(specs)
    for name in graph.input_names():
        spec = out.get(name)
        if spec is not None and spec.is_public and spec.value is None and name in inputs:
            out[name] = InputSpec.public(np.asarray(inputs[name]))
    return out


def _accurate(graph: Graph | Plan, quotas: Quotas | None) -> Plan:
    """The plan a tracked evaluation runs: ``graph`` planned with ``accurate=True``, or a
    plan made so already (a caller that planned to check quotas need not plan twice)."""
    if not isinstance(graph, Plan):
        return plan(graph, quotas, accurate=True)
    if not all(c is None or c.accurate for c in graph.calls):
        raise ValueError("tracking needs a plan made with plan(..., accurate=True)")
    return graph


def track(
    graph: Graph | Plan,
    input_specs: Mapping[str, InputSpec],
    quotas: Quotas | None = None,
    *,
    boxes: Mapping[int, tuple[Array, Array]] | None = None,
) -> PrivacyReport:
    """Sensitivity of every output of ``graph``, without any data.

    ``graph`` may be a plan from ``plan(graph, quotas, accurate=True)``; ``quotas`` are
    then those it was made with. ``boxes`` (node index -> lower and upper arrays) tracks
    those constants as public values anywhere in their box (``dpnode.core.privacy.cache``).

    Raises:
        GraphError, QuotaExceededError: the graph itself is invalid or too big.
        PrivacyTrackingError: a prim without a privacy rule touches private data, an
            input lacks metadata, or an output's sensitivity is unbounded.
    """
    p = _accurate(graph, quotas)
    tracker, outs = _track(p, input_specs, boxes)
    return tracker.report(outs, lambda: _unbounded_from(p, input_specs, boxes))


def _track(
    p: Plan,
    input_specs: Mapping[str, InputSpec],
    boxes: Mapping[int, tuple[Array, Array]] | None = None,
) -> tuple[PrivacyTracker, list[State]]:
    tracker = PrivacyTracker(input_specs, boxes)
    wanted = set(p.graph.outputs)
    found = {i: state for i, _, state, _ in _visits(tracker, p) if i in wanted}
    return tracker, [found[o] for o in p.graph.outputs if o in found]


def _visits(
    tracker: PrivacyTracker, p: Plan
) -> Iterator[tuple[int, Node, State, list[State | None]]]:
    """Each live node of ``p`` tracked in order: its index, node, state and arguments' states."""
    tracker.prepare(p.graph)
    states: list[State | None] = [None] * len(p.graph.nodes)
    for i, node in enumerate(p.graph.nodes):
        if not p.live[i] and node.op != "input":
            continue
        args = [states[a.index] if isinstance(a, Ref) else None for a in node.args]
        state = states[i] = tracker.visit(i, node, p.calls[i], p.metas[i], args)
        yield i, node, state, args


def _unbounded_from(
    p: Plan,
    input_specs: Mapping[str, InputSpec],
    boxes: Mapping[int, tuple[Array, Array]] | None = None,
) -> str:
    """`` from node i (op) on``: the first node whose private values may be unbounded (or
    NaN) though none of its arguments' were, found by tracking the graph again (a refusal's
    path only: the check costs a pass over every state's bounds); ``""`` if there is none."""
    for i, node, state, args in _visits(PrivacyTracker(input_specs, boxes), p):
        if not _bounded(state) and all(a is None or _bounded(a) for a in args):
            return f" from node {i} ({node.op}) on"
    return ""


def _bounded(s: State) -> bool:
    lo, hi = rounding.wide(s)
    with np.errstate(invalid="ignore"):
        return s.is_public or bool(np.isfinite(lo).all() and np.isfinite(hi).all())


def selection_inputs(
    graph: Graph | Plan,
    input_specs: Mapping[str, InputSpec],
    joined: Mapping[int, int] | None = None,
) -> tuple[PrivacyReport, list[int | None], list[Span]]:
    """What the exponential mechanism needs of each output of ``graph``, from public
    metadata only: its report (bounds; an output that may be unbounded or NaN is refused),
    the most elements of it that replacing one subject can change (None: public,
    :mod:`~dpnode.core.privacy.moves`), and where its candidates lie: the tracked interval of
    its computed values, without the margin the report adds for the tracker's own rounding
    (a column's range is then its declared bounds, not 1e-11 wider; values outside are
    clipped into it, each alone), whether they are integers (also after a cast to a float
    dtype that holds them exactly) and the finite set they lie in when a table knows it.

    ``joined`` maps an output to another of the same shape read with it (a grouped
    quantile's values and their group index): an element then moves if it moves in either
    (:func:`~dpnode.core.privacy.moves.moved_together`).
    """
    p = _accurate(graph, None)
    tracker, outs = _track(p, input_specs)
    report = tracker.report(outs, lambda: _unbounded_from(p, input_specs))
    spans = []
    for s in outs:
        lo, hi = rounding.wide(s)
        spans.append(
            Span(
                float(np.min(lo, initial=np.inf)),
                float(np.max(hi, initial=-np.inf)),
                rounding.integral(s),
                moves.support(s),
            )
        )
    counts: list[int | None] = []
    for i, s in enumerate(outs):
        partner = None if joined is None else joined.get(i)
        if partner is None:
            counts.append(None if s.is_public else moves.most(moves.moved(s, tracker.nsub)))
            continue
        t = outs[partner]
        if s.is_public and t.is_public:
            counts.append(None)
        else:
            counts.append(moves.most(moves.moved_together(s, t, tracker.nsub)))
    return report, counts, spans


def evaluate_tracked(
    graph: Graph | Plan,
    inputs: Mapping[str, Array],
    input_specs: Mapping[str, InputSpec],
    quotas: Quotas | None = None,
    *,
    rng: np.random.Generator | None = None,
) -> tuple[list[Array], PrivacyReport]:
    """Evaluate ``graph`` and track its sensitivity in the same pass.

    Public inputs' values are handed to the tracker (they are public by declaration);
    private ones never are. ``graph`` may be a plan, as for :func:`track`.

    Raises:
        everything :func:`dpnode.core.engine.run` and :func:`track` raise.
    """
    p = _accurate(graph, quotas)
    specs = _specs_with_values(p.graph, input_specs, inputs)
    tracker = PrivacyTracker(specs)
    tracker.prepare(p.graph)
    ev = run(p, inputs, rng=rng, trackers=[tracker])
    return ev.outputs, tracker.report(ev.tracked[tracker.name], lambda: _unbounded_from(p, specs))

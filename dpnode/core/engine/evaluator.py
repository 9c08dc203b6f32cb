"""Plan and evaluate graphs: validate, infer shapes/dtypes, check quotas, run.

``plan`` does everything that needs no data: structural validation, shape and
dtype inference for every node, per-tensor and compute quotas, and the peak
memory of the intermediates under the evaluator's own freeing schedule. Only a
graph that passes is ever run, so a hostile graph is refused before any
allocation. ``run`` is one forward loop over the nodes (graphs are stored in
topological order), dropping each intermediate after its last consumer and
letting an elementwise prim write into a dying input of the right shape and
dtype when no other live value shares its buffer.

Trackers ride along the same loop: each gets, per node, the states it returned
for that node's arguments and returns the node's state. The privacy layer is
one such tracker, with one rule per prim kept in ``PrimDef.rules``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from dpnode.core.engine.blocks import BLOCK_ELEMENTS, PassRunner, Schedule, run_blocks, schedule
from dpnode.core.engine.dtypes import dtype, from_numpy
from dpnode.core.engine.graph import Graph, Node, Ref, validate_structure
from dpnode.core.engine.prims import REGISTRY
from dpnode.core.engine.prims.registry import ArgMeta, Call, Scalar, TensorMeta
from dpnode.core.engine.quotas import Quotas
from dpnode.core.engine.subnormals import flushing
from dpnode.core.errors import DPNodeError, EvaluationError, GraphError, QuotaExceededError

__all__ = ["Evaluation", "Plan", "Tracker", "evaluate", "infer", "plan", "run"]

Array = npt.NDArray[Any]


class Tracker(Protocol):
    """A per-node computation that rides along evaluation (e.g. privacy tracking).

    ``visit`` is called once per evaluated node in order. ``call`` is None for
    inputs and constants. ``arg_states`` holds the states returned for the
    node's reference arguments (None for scalar or null arguments).
    """

    name: str

    def visit(
        self, index: int, node: Node, call: Call | None, meta: TensorMeta, arg_states: list[Any]
    ) -> Any: ...


@dataclass(frozen=True)
class Plan:
    """A validated graph with every node's metadata and its resource estimate."""

    graph: Graph
    metas: tuple[TensorMeta, ...]
    calls: tuple[Call | None, ...]
    last_use: tuple[int, ...]
    live: tuple[bool, ...]
    peak_bytes: int
    flops: int
    #: how to evaluate it over blocks of rows (``dpnode.core.engine.blocks``), None: whole
    blocks: Schedule | None = None

    @property
    def outputs(self) -> list[TensorMeta]:
        """Shape and dtype of each graph output."""
        return [self.metas[o] for o in self.graph.outputs]


@dataclass(frozen=True)
class Evaluation:
    """Outputs of a run and, per tracker name, the tracker state of each output."""

    outputs: list[Array]
    tracked: dict[str, list[Any]]


def plan(graph: Graph, quotas: Quotas | None = None, *, accurate: bool = False) -> Plan:
    """Validate ``graph`` and infer every node's shape and dtype, without data.

    ``accurate``: the plan of a computation on private data. Float sums, means and matrix
    products accumulate in float64 whatever the dtype (torch accumulates float32 in
    float32; the result keeps torch's dtype), and kernels are total: no value makes one
    fail (:attr:`Call.total`), so an evaluation's outcome never depends on the data.

    Raises:
        GraphError: the graph is malformed, names the node, prim and argument.
        QuotaExceededError: nodes, elements, peak memory or compute over ``quotas``.
    """
    q = quotas or Quotas()
    if len(graph.nodes) > q.max_nodes:
        raise QuotaExceededError(f"graph has {len(graph.nodes)} nodes; the quota is {q.max_nodes}")
    g = validate_structure(graph)
    n = len(g.nodes)
    metas: list[TensorMeta] = []
    calls: list[Call | None] = []
    flops = 0
    for i, node in enumerate(g.nodes):
        call: Call | None = None
        if node.op == "input":
            meta = TensorMeta(tuple(node.attrs["shape"]), dtype(str(node.attrs["dtype"])))  # type: ignore[arg-type]
        elif node.op == "constant":
            assert node.value is not None
            meta = TensorMeta(tuple(int(s) for s in node.value.shape), from_numpy(node.value.dtype))
        else:
            args: list[ArgMeta] = [metas[a.index] if isinstance(a, Ref) else a for a in node.args]
            call = Call(i, node.op, args, node.attrs)
            call.accurate = call.total = accurate
            p = REGISTRY[node.op]
            try:
                meta = p.infer(call)
            except DPNodeError:
                raise
            except (ValueError, TypeError, IndexError, OverflowError, KeyError) as e:
                raise GraphError(f"{call.where()}: {e}") from None
            call.meta = meta
        _check_tensor(i, node.op, meta, q)
        if call is not None:
            flops += REGISTRY[node.op].flops(call)
            if flops > q.max_flops:
                raise QuotaExceededError(
                    f"node {i} ({node.op}): estimated compute reaches {flops:.3g} "
                    f"operations; the quota is {q.max_flops:.3g}"
                )
        metas.append(meta)
        calls.append(call)
    # liveness: only nodes the outputs depend on run; each dies after its last consumer
    live = [False] * n
    for o in g.outputs:
        live[o] = True
    last_use = [-1] * n
    for i in range(n - 1, -1, -1):
        if not live[i]:
            continue
        for a in g.nodes[i].args:
            if isinstance(a, Ref):
                live[a.index] = True
                if last_use[a.index] < i:
                    last_use[a.index] = i
    for o in g.outputs:
        last_use[o] = n  # never freed
    work = [0 if c is None else REGISTRY[c.op].workspace(c) for c in calls]
    peak = _peak_bytes(g, metas, live, last_use, work)
    if peak > q.max_total_bytes:
        raise QuotaExceededError(
            f"graph needs about {peak:,} bytes of intermediates at its peak; "
            f"the quota is {q.max_total_bytes:,}"
        )
    blocks = schedule(g, metas, calls, live) if accurate else None
    return Plan(g, tuple(metas), tuple(calls), tuple(last_use), tuple(live), peak, flops, blocks)


def _check_tensor(i: int, op: str, meta: TensorMeta, q: Quotas) -> None:
    if meta.ndim > q.max_dims:
        raise QuotaExceededError(f"node {i} ({op}): {meta.ndim} dims; the quota is {q.max_dims}")
    if meta.numel > q.max_elements_per_tensor:
        raise QuotaExceededError(
            f"node {i} ({op}): shape {list(meta.shape)} has {meta.numel:,} elements; "
            f"the quota is {q.max_elements_per_tensor:,} per tensor"
        )


def _peak_bytes(
    g: Graph,
    metas: Sequence[TensorMeta],
    live: Sequence[bool],
    last_use: Sequence[int],
    work: Sequence[int],
) -> int:
    """Peak bytes under the run loop's schedule: live values plus the running kernel's
    temporaries (views counted as copies, so an upper bound)."""
    alive = peak = 0
    dying: dict[int, list[int]] = {}
    for i, m in enumerate(metas):
        if not live[i] or g.nodes[i].op == "input":
            continue
        alive += m.nbytes
        peak = max(peak, alive + work[i])
        dying.setdefault(last_use[i], []).append(i)
        for j in dying.pop(i, ()):
            alive -= metas[j].nbytes
    return peak


def infer(graph: Graph, quotas: Quotas | None = None) -> list[TensorMeta]:
    """Shape and dtype of each output of ``graph``, without data.

    >>> from dpnode.core.engine.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.input("x", "int64", (4,))
    >>> infer(b.build([b.op("div", x, 2)]))
    [TensorMeta(shape=(4,), dtype=float32)]
    """
    return plan(graph, quotas).outputs


def _bind(i: int, node: Node, meta: TensorMeta, inputs: Mapping[str, Any]) -> Array:
    name = str(node.attrs["name"])
    if name not in inputs:
        raise EvaluationError(f"node {i} (input): no value given for input {name!r}")
    v = inputs[name]
    if not isinstance(v, np.ndarray):
        raise EvaluationError(
            f"node {i} (input {name!r}): expected a NumPy array, got {type(v).__name__}"
        )
    if v.dtype != meta.dtype.np or v.shape != meta.shape:
        raise EvaluationError(
            f"node {i} (input {name!r}): declared {meta.dtype.name}{list(meta.shape)}, "
            f"got {v.dtype}{list(v.shape)}"
        )
    return v


def run(
    graph_or_plan: Graph | Plan,
    inputs: Mapping[str, Array],
    quotas: Quotas | None = None,
    *,
    rng: np.random.Generator | None = None,
    trackers: Sequence[Tracker] = (),
    block_elements: int | None = BLOCK_ELEMENTS,
    runner: PassRunner | None = None,
) -> Evaluation:
    """Evaluate a graph (planning it first if needed) with optional trackers.

    A tracked evaluation's plan that only sums over its rows (``Plan.blocks``) is evaluated
    over blocks of rows of about ``block_elements`` elements (None: whole), with the same
    values (:mod:`dpnode.core.engine.blocks`), when it has more rows than one block and no trackers.

    Args:
        graph_or_plan: a graph, or a plan from :func:`plan` (then ``quotas`` is ignored).
        inputs: one array per input placeholder, matching its declared dtype and shape.
        rng: the node's generator for random prims (a fresh OS-seeded one if None).
        trackers: per-node computations run alongside the values.
        runner: runs the block passes elsewhere (:func:`~dpnode.core.engine.blocks.run_blocks`),
            for a plan with blocks, whatever its rows; ``inputs`` then omits the row inputs.

    Raises:
        GraphError, QuotaExceededError: from planning.
        EvaluationError: a value-dependent failure (integer division by zero,
            index out of range, missing or mismatched input), naming the node.
    """
    p = graph_or_plan if isinstance(graph_or_plan, Plan) else plan(graph_or_plan, quotas)
    g = p.graph
    declared = set(g.input_names())
    extra = set(inputs) - declared
    if extra:
        raise EvaluationError(f"inputs {sorted(extra)} are not declared by the graph")
    gen = rng
    if gen is None and any(n.op in REGISTRY and REGISTRY[n.op].random for n in g.nodes):
        gen = np.random.default_rng()  # seeded from the OS: only for a graph that draws
    blocks = p.blocks
    if runner is not None:
        if blocks is None or trackers:
            raise EvaluationError("internal error: only a block plan, untracked, runs elsewhere")
        bound = {
            i: _bind(i, node, p.metas[i], inputs)
            for i, node in enumerate(g.nodes)
            if node.op == "input" and not (blocks.row[i] and node.attrs["name"] not in inputs)
        }
        elements = block_elements or BLOCK_ELEMENTS
        return Evaluation(run_blocks(blocks, g, p.calls, bound, gen, elements, runner=runner), {})
    if (
        blocks is not None
        and not trackers
        and block_elements is not None
        and blocks.rows > blocks.block_rows(block_elements)
    ):
        bound = {
            i: _bind(i, node, p.metas[i], inputs)
            for i, node in enumerate(g.nodes)
            if node.op == "input"
        }
        return Evaluation(run_blocks(blocks, g, p.calls, bound, gen, block_elements), {})
    n = len(g.nodes)
    values: list[Any] = [None] * n
    owner = [
        -1
    ] * n  # node whose fresh buffer holds the value; -1: caller's or constant, never written
    sharers: dict[int, int] = {}
    states: list[list[Any]] = [[None] * n for _ in trackers]
    # Subnormal results flushed to zero while the kernels run (dpnode.core.engine.subnormals);
    # trackers visit in between, with IEEE gradual underflow, so then only around each kernel.
    each_kernel = flushing if trackers else nullcontext
    with np.errstate(all="ignore"), nullcontext() if trackers else flushing():
        for i, node in enumerate(g.nodes):
            meta = p.metas[i]
            if node.op == "input":
                values[i] = _bind(i, node, meta, inputs)
            elif not p.live[i]:
                continue
            elif node.op == "constant":
                values[i] = node.value
            else:
                call = p.calls[i]
                assert call is not None
                prim = REGISTRY[node.op]
                if prim.random:
                    # a private copy: a Plan may be shared by concurrent runs
                    assert gen is not None
                    call = copy.copy(call)
                    call.rng = gen
                args = [
                    values[a.index]
                    if isinstance(a, Ref)
                    else (a.value if isinstance(a, Scalar) else None)
                    for a in node.args
                ]
                out = _donor(i, node, meta, values, owner, sharers, p) if prim.inplace else None
                try:
                    with each_kernel():
                        r = prim.kernel(call, args, out)
                except DPNodeError:
                    raise
                except (ArithmeticError, ValueError, IndexError, TypeError, MemoryError) as e:
                    raise EvaluationError(f"{call.where()}: {type(e).__name__}: {e}") from None
                r = np.asarray(r)
                if r.dtype != meta.dtype.np or r.shape != meta.shape:
                    raise EvaluationError(
                        f"{call.where()}: internal error: kernel gave {r.dtype}{list(r.shape)}, "
                        f"rule said {meta.dtype.name}{list(meta.shape)}"
                    )
                values[i] = r
                owner[i] = i
                for a in node.args:
                    if isinstance(a, Ref) and np.may_share_memory(r, values[a.index]):
                        owner[i] = owner[a.index]
                        break
            if owner[i] >= 0:
                sharers[owner[i]] = sharers.get(owner[i], 0) + 1
            for t, tracker in enumerate(trackers):
                arg_states = [states[t][a.index] if isinstance(a, Ref) else None for a in node.args]
                states[t][i] = tracker.visit(i, node, p.calls[i], meta, arg_states)
            for a in node.args:
                if isinstance(a, Ref) and p.last_use[a.index] == i and values[a.index] is not None:
                    _free(a.index, values, owner, sharers, states)
    outputs: list[Array] = []
    for o in g.outputs:
        v = values[o]
        # outputs are the caller's to keep or modify (e.g. noise added in place): never hand
        # out a view of an input, a constant or another output
        if owner[o] < 0 or not v.flags.writeable or any(np.may_share_memory(v, w) for w in outputs):
            v = np.array(v, copy=True)
        outputs.append(v)
    tracked = {t.name: [states[k][o] for o in g.outputs] for k, t in enumerate(trackers)}
    return Evaluation(outputs, tracked)


def _free(
    j: int, values: list[Any], owner: list[int], sharers: dict[int, int], states: list[list[Any]]
) -> None:
    values[j] = None
    for s in states:
        s[j] = None
    if owner[j] >= 0:
        sharers[owner[j]] -= 1


def _donor(
    i: int,
    node: Node,
    meta: TensorMeta,
    values: list[Any],
    owner: list[int],
    sharers: dict[int, int],
    p: Plan,
) -> Array | None:
    """An argument buffer the prim may overwrite.

    It must die here, be the only live value on its buffer, and have the output's shape and dtype.
    """
    for a in node.args:
        if not isinstance(a, Ref) or p.last_use[a.index] != i:
            continue
        v = values[a.index]
        o = owner[a.index]
        if (
            o >= 0
            and sharers.get(o) == 1
            and v.shape == meta.shape
            and v.dtype == meta.dtype.np
            and v.flags.writeable
        ):
            return v  # type: ignore[no-any-return]
    return None


def evaluate(
    graph: Graph | Plan,
    inputs: Mapping[str, Array],
    quotas: Quotas | None = None,
    *,
    rng: np.random.Generator | None = None,
) -> list[Array]:
    """Evaluate ``graph`` on ``inputs`` and return its outputs (see :func:`run`).

    >>> from dpnode.core.engine.graph import GraphBuilder
    >>> b = GraphBuilder()
    >>> x = b.input("x", "int64", (3,))
    >>> evaluate(b.build([b.op("add", x, 1.5)]), {"x": np.arange(3)})[0]
    array([1.5, 2.5, 3.5], dtype=float32)
    """
    return run(graph, inputs, quotas, rng=rng).outputs

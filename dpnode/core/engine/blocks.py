"""Evaluate a graph over its rows block by block, when it only sums over them.

Most publishes are elementwise work on the rows of a few columns (joined into a matrix,
reshaped or sliced within each row) followed by sums or means over the rows (``x.mean()``,
``(x > t).sum()``, a variance's two passes, ``ds.tensors(["a", "b"]).mean(0)``, a
regression's ``x.T @ x``). Evaluated whole, each intermediate is as long as the column: a
100M-row ``x.float().mean()`` would hold a 400 MB copy beside the column. :func:`schedule`
recognises such a graph from its plan alone (shapes, dtypes and prims: public), and
:func:`run_blocks` evaluates it on blocks of rows (about :data:`BLOCK_ELEMENTS` elements
each), so that nothing larger than a block is ever allocated and a mapped column
(``dpnode.node.storage``) is read page by page.

Values do not change: elementwise prims compute each element alone, and a sum is the one
of :func:`dpnode.core.engine.accurate.blocked_sum` taken apart: blocks start at multiples of
:data:`~dpnode.core.engine.accurate.BLOCK` rows, so each block of ``BLOCK`` terms is summed as in
the whole array, the block sums are gathered in order and added by the same call, and the
tail last. For a 1-d column this is the same computation on the same bits, so the result
is bitwise the whole array's; for a sum over several axes NumPy may order the terms inside
a block otherwise, and the result then stays within the bound the privacy tracker charges
for any order (``depth(n)`` roundings a term, :mod:`dpnode.core.privacy.rounding`). Integer sums
are exact (wrapping alike in any order).

A graph needing the sums of one pass to go on (``x - x.mean()``) takes several passes over
the rows; the values between them are small and computed whole. A product over the rows
(``x.T @ y``, the transposed ``x`` read by nothing else) is gathered as the accurate kernel
computes it: the float64 product of each ``BLOCK`` of rows, added in row order. Anything else
(a row value that is an output, another matmul, an index, a random prim over the rows, a
reduction that keeps the rows) is evaluated whole by :func:`dpnode.core.engine.evaluator.run`,
as before.

A pass is one loop, :func:`pass_sums`, over any range of rows that starts on a block: it
returns the range's block sums, which :func:`run_blocks` merges in row order. By default one
range holds all the rows; a ``runner`` may spread the ranges over other processes
(``dpnode.node.cluster``, on a Dask cluster) and hand back their sums, giving the same bits.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.engine.accurate import BLOCK, block_sums, rows_last, total
from dpnode.core.engine.dtypes import accumulation
from dpnode.core.engine.graph import Graph, Node, Ref
from dpnode.core.engine.prims import REGISTRY
from dpnode.core.engine.prims.elementwise import BINARY_PRIMS, UNARY_PRIMS
from dpnode.core.engine.prims.linalg import matmul_accumulation
from dpnode.core.engine.prims.registry import Call, Scalar, TensorMeta
from dpnode.core.engine.subnormals import flushing
from dpnode.core.errors import DPNodeError, EvaluationError

__all__ = [
    "BLOCK_ELEMENTS",
    "PassRunner",
    "RangeSums",
    "Schedule",
    "pass_inputs",
    "pass_sums",
    "run_blocks",
    "schedule",
]

Array = npt.NDArray[Any]

#: elements of the widest row value in one block (rows are rounded to whole ``BLOCK``s)
BLOCK_ELEMENTS = 1 << 20

#: prims computing each element of their result from the same element of their arguments
_ELEMENTWISE = (
    frozenset(UNARY_PRIMS)
    | frozenset(BINARY_PRIMS)
    | {
        "where",
        "clamp",
        "convert_element_type",
    }
)


#: prims that move values within each row only, when the rows stay axis 0 (checked from
#: the shapes): ``ds.tensors(["a", "b"])`` joins columns with them
_ROW_PRESERVING = frozenset({"reshape", "unsqueeze", "squeeze", "cat", "slice"})


@dataclass(frozen=True)
class Pass:
    """One read of the rows: the row values computed on each block, the sums they end in."""

    nodes: tuple[int, ...]
    sums: tuple[int, ...]


@dataclass(frozen=True)
class Schedule:
    """How a graph is evaluated over blocks of its ``rows`` (see the module docstring).

    Attributes:
        rows: the length of the row axis (axis 0 of every row value).
        width: elements per row of the widest row value.
        row: per node, whether it is a row value (computed block by block).
        small: per pass, the other nodes computed before it (then the rest, after the last).
        passes: the reads of the rows, in order.
        turned: ``(permute, row value)`` pairs: a 2-d row value transposed (``x.T``), read
            only as the left factor of a product over the rows (``x.T @ y``), whose blocks
            are then the row value's blocks.
    """

    rows: int
    width: int
    row: tuple[bool, ...]
    small: tuple[tuple[int, ...], ...]
    passes: tuple[Pass, ...]
    turned: tuple[tuple[int, int], ...] = ()
    _calls: dict[tuple[int, int], Call] = field(default_factory=dict, compare=False, repr=False)

    def block_rows(self, elements: int) -> int:
        """Rows per block for blocks of about ``elements`` elements: whole ``BLOCK``s.

        >>> Schedule(10**6, 3, (), (), ()).block_rows(1 << 20)
        348160
        """
        return max(1, elements // (self.width * BLOCK)) * BLOCK


def _reduced_axes(call: Call, x: TensorMeta) -> tuple[int, ...]:
    dims = call.attrs.get("dims")
    if not dims:
        return tuple(range(x.ndim))
    return tuple(call.dim(d, x.ndim, "dims") for d in dims)


def _sums_rows(call: Call, x: TensorMeta) -> bool:
    """A sum or mean whose first summed axis is the rows: its blocks follow the rows'."""
    if call.op not in ("sum", "mean") or x.ndim == 0:
        return False
    axes = _reduced_axes(call, x)
    return axes[0] == 0


def schedule(
    graph: Graph,
    metas: Sequence[TensorMeta],
    calls: Sequence[Call | None],
    live: Sequence[bool],
) -> Schedule | None:
    """The block schedule of a planned graph, or None when it must be evaluated whole.

    Decided from the plan only. Only plans of tracked evaluations (``accurate``) are
    scheduled: their sums are the blocked sums that blocks reproduce.
    """
    nodes = graph.nodes
    if not any(c is not None for c in calls) or not all(c.accurate for c in calls if c):
        return None
    lengths = [
        metas[i].shape[0]
        for i, node in enumerate(nodes)
        if node.op == "input" and live[i] and metas[i].ndim >= 1
    ]
    if not lengths or max(lengths) <= BLOCK:
        return None
    rows = max(lengths)
    n = len(nodes)
    row = [False] * n
    level = [0] * n
    sums: dict[int, list[int]] = {}
    turned: dict[int, int] = {}  # x.T (a permute) -> x, the row value it turns
    for i, node in enumerate(nodes):
        meta = metas[i]
        if not live[i] or node.op == "constant":
            continue
        if node.op == "input":
            row[i] = meta.ndim >= 1 and meta.shape[0] == rows
            continue
        refs = [a.index for a in node.args if isinstance(a, Ref)]
        lv = max((level[r] for r in refs), default=0)
        level[i] = lv
        call = calls[i]
        if any(r in turned for r in refs):
            if not _product_over_rows(node.op, refs, turned, row, metas, call, rows):
                return None  # x.T used otherwise: evaluated whole
            level[i] = lv + 1
            sums.setdefault(lv, []).append(i)
            continue
        if not any(row[r] for r in refs):
            continue
        assert call is not None
        if (
            node.op == "permute"
            and metas[refs[0]].ndim == 2
            and tuple(d % 2 for d in call.attr("dims")) == (1, 0)
        ):
            turned[i] = refs[0]  # its one use must be a product over the rows (checked there)
            continue
        if node.op in _ELEMENTWISE and not REGISTRY[node.op].random:
            if meta.ndim == 0 or meta.shape[0] != rows:
                return None
            for r in refs:
                m = metas[r]
                # a row argument is aligned on axis 0; any other broadcasts along it
                if (m.ndim != meta.ndim) if row[r] else (m.ndim == meta.ndim and m.shape[0] != 1):
                    return None
            row[i] = True
        elif node.op in _ROW_PRESERVING:
            # a row's values moved within the row (a column added, columns joined or
            # picked): the rows stay the rows, and a block's rows are the block's
            if meta.ndim == 0 or meta.shape[0] != rows:
                return None
            if not all(row[r] and metas[r].shape[0] == rows for r in refs):
                return None
            if node.op == "slice" and call.dim(call.attr("dim"), metas[refs[0]].ndim) == 0:
                return None
            row[i] = True
        elif len(refs) == 1 and _sums_rows(call, metas[refs[0]]):
            level[i] = lv + 1
            sums.setdefault(lv, []).append(i)
        else:
            return None
    if any(row[o] or o in turned for o in graph.outputs) or not sums:
        return None
    count = max(sums) + 1
    passes = []
    for p in range(count):
        needed: set[int] = set()
        stack = [a for s in sums.get(p, []) for a in _summed(nodes[s], turned)]
        while stack:
            a = stack.pop()
            if isinstance(a, Ref) and row[a.index] and a.index not in needed:
                needed.add(a.index)
                stack.extend(nodes[a.index].args)
        passes.append(Pass(tuple(sorted(needed)), tuple(sums.get(p, []))))
    summed = {i for found in sums.values() for i in found}
    small: list[list[int]] = [[] for _ in range(count + 1)]
    for i, node in enumerate(nodes):
        if live[i] and not row[i] and node.op != "input" and i not in summed and i not in turned:
            small[min(level[i], count)].append(i)
    width = max(math.prod(metas[i].shape[1:]) for i in range(n) if row[i])
    return Schedule(
        rows,
        max(width, 1),
        tuple(row),
        tuple(tuple(s) for s in small),
        tuple(passes),
        tuple(sorted(turned.items())),
    )


def _product_over_rows(
    op: str,
    refs: Sequence[int],
    turned: Mapping[int, int],
    row: Sequence[bool],
    metas: Sequence[TensorMeta],
    call: Call | None,
    rows: int,
) -> bool:
    """Whether a node using a turned row value is ``x.T @ y``: the product of the turned
    ``x [rows, p]`` and a row value ``y`` (``[rows]`` or ``[rows, q]``), accumulated by the
    accurate kernel over blocks of ``BLOCK`` rows (so the blocks can give its pieces)."""
    if op != "matmul" or call is None or len(refs) != 2 or refs[0] not in turned:
        return False
    y = refs[1]
    if y in turned or not row[y] or metas[y].ndim not in (1, 2) or metas[y].shape[0] != rows:
        return False
    _, rounds = matmul_accumulation(call)
    return rounds != rows and call.out().dtype.is_float  # the float64 blocked product


def _summed(node: Node, turned: Mapping[int, int]) -> list[object]:
    """The row values a sum over the rows reads: its argument, or a product's two factors
    (the turned one by the row value it turns)."""
    if node.op != "matmul":
        return [node.args[0]]
    left, right = node.args[0], node.args[1]
    assert isinstance(left, Ref)
    return [Ref(turned[left.index]), right]


def _call(s: Schedule, calls: Sequence[Call | None], i: int, length: int) -> Call:
    """Node ``i``'s call on a block of ``length`` rows: its row arguments and result cut."""
    call = s._calls.get((i, length))
    if call is not None:
        return call
    full = calls[i]
    assert full is not None and full.meta is not None

    def cut(m: Any) -> Any:
        return TensorMeta((length, *m.shape[1:]), m.dtype) if isinstance(m, TensorMeta) else m

    args = [
        cut(m) if isinstance(m, TensorMeta) and m.ndim and m.shape[0] == s.rows else m
        for m in full.args
    ]
    call = Call(full.index, full.op, args, full.attrs)
    call.accurate, call.total = full.accurate, full.total
    call.meta = cut(full.meta)
    s._calls[(i, length)] = call
    return call


def _apply(call: Call, args: list[Any], gen: np.random.Generator | None) -> Array:
    prim = REGISTRY[call.op]
    if prim.random:
        assert gen is not None, "a random prim over the rows is never scheduled"
        call = copy.copy(call)
        call.rng = gen
    try:
        r = np.asarray(prim.kernel(call, args, None))
    except DPNodeError:
        raise
    except (ArithmeticError, ValueError, IndexError, TypeError, MemoryError) as e:
        raise EvaluationError(f"{call.where()}: {type(e).__name__}: {e}") from None
    meta = call.out()
    if r.dtype != meta.dtype.np or r.shape != meta.shape:
        raise EvaluationError(
            f"{call.where()}: internal error: kernel gave {r.dtype}{list(r.shape)}, "
            f"rule said {meta.dtype.name}{list(meta.shape)}"
        )
    return r


#: What one range of rows gives a sum over the rows: its block sums (a float sum: one per
#: whole ``BLOCK`` of terms, in order) or its exact sum (an integer sum), and the sum of the
#: tail of fewer than ``BLOCK`` terms (only the range holding the last row has one).
RangeSums = tuple[list[Array], Array | None]


class _Sum:
    """A sum or mean over the rows, gathered block by block."""

    def __init__(self, call: Call) -> None:
        self.call = call
        x = call.args[0]
        assert isinstance(x, TensorMeta)
        self.x = x
        self.axes = _reduced_axes(call, x)
        res = call.out().dtype
        self.acc = accumulation(res, call.accurate)
        self.blocked = res.is_float  # the accurate kernel's blocked float sum
        self.parts: list[Array] = []
        self.tail: Array | None = None

    def add(self, block: Array) -> None:
        if not self.blocked:  # integers: exact, wrapping alike in any order
            self.merge(([np.asarray(np.sum(block, axis=self.axes, dtype=self.acc.np))], None))
            return
        y = rows_last(block, self.axes)
        m = y.shape[-1] - y.shape[-1] % BLOCK
        tail = np.sum(y[..., m:], axis=-1, dtype=self.acc.np) if m < y.shape[-1] else None
        self.merge(([block_sums(y[..., :m], self.acc.np)] if m else [], tail))

    def merge(self, found: RangeSums) -> None:
        """Add what the next rows gave (:meth:`add`, or another process's :func:`pass_sums`)."""
        parts, tail = found
        if not self.blocked:
            for part in parts:
                self.parts = [np.add(self.parts[0], part) if self.parts else np.asarray(part)]
            return
        # only the rows' last block has a tail: every other is whole BLOCKs
        assert self.tail is None, "rows given after the last block"
        self.parts.extend(parts)
        self.tail = tail

    def found(self) -> RangeSums:
        return self.parts, self.tail

    def result(self) -> Array:
        c = self.call
        keep = bool(c.attrs.get("keepdim"))
        if self.blocked:
            r: Any = total(np.concatenate(self.parts, axis=-1), self.tail, self.acc.np)
        else:
            r = self.parts[0]
        if keep:
            r = np.reshape(r, [1 if d in self.axes else s for d, s in enumerate(self.x.shape)])
        if c.op == "mean":
            r = np.asarray(r) / math.prod(self.x.shape[d] for d in self.axes)
        return np.asarray(r).astype(c.out().dtype.np, copy=False)


class _Product:
    """``x.T @ y`` over the rows, gathered block by block: the accurate kernel's float64
    products of ``BLOCK`` rows at a time (``dpnode.core.engine.prims.linalg``), added in row
    order as the kernel adds them, so the result is the kernel's, bit for bit."""

    def __init__(self, call: Call) -> None:
        self.call = call
        self.acc = matmul_accumulation(call)[0].np
        self.parts: list[Array] = []

    def add(self, x: Array, y: Array) -> None:
        left, right = x.T, (y if y.ndim > 1 else y[:, None])
        for s in range(0, x.shape[0], BLOCK):
            piece = slice(s, s + BLOCK)
            self.parts.append(
                np.matmul(
                    left[..., piece].astype(self.acc, copy=False),
                    right[..., piece, :].astype(self.acc, copy=False),
                )
            )

    def merge(self, found: RangeSums) -> None:
        self.parts.extend(found[0])

    def found(self) -> RangeSums:
        return self.parts, None

    def result(self) -> Array:
        total_: Array | None = None
        for part in self.parts:
            total_ = part if total_ is None else np.add(total_, part, out=total_)
        assert total_ is not None
        y = self.call.args[1]
        assert isinstance(y, TensorMeta)
        r = total_[..., 0] if y.ndim == 1 else total_
        return np.asarray(r).astype(self.call.out().dtype.np, copy=False)


def _gather(call: Call) -> _Sum | _Product:
    return _Product(call) if call.op == "matmul" else _Sum(call)


#: ``rows(i, start, stop)``: rows ``start:stop`` of input node ``i``'s value
Rows = Callable[[int, int, int], Array]

#: Runs pass ``p`` of a schedule given the values it uses (:func:`pass_inputs`): what each
#: range of rows gave each of the pass's sums, the ranges in row order and covering the rows.
PassRunner = Callable[[int, Mapping[int, Any]], Sequence[Mapping[int, RangeSums]]]


def _arg(s: Schedule, a: object, values: Mapping[int, Any], local: Mapping[int, Array]) -> Any:
    if isinstance(a, Ref):
        return local[a.index] if s.row[a.index] else values[a.index]
    return a.value if isinstance(a, Scalar) else None


def pass_inputs(s: Schedule, graph: Graph, p: int, values: Mapping[int, Any]) -> dict[int, Any]:
    """The values computed before pass ``p`` that its row values use."""
    nodes = graph.nodes
    used = {
        a.index
        for i in s.passes[p].nodes
        for a in nodes[i].args
        if isinstance(a, Ref) and not s.row[a.index]
    }
    return {i: values[i] for i in sorted(used)}


def pass_sums(
    s: Schedule,
    graph: Graph,
    calls: Sequence[Call | None],
    p: int,
    values: Mapping[int, Any],
    rows: Rows,
    start: int,
    stop: int,
    elements: int = BLOCK_ELEMENTS,
) -> dict[int, RangeSums]:
    """Pass ``p`` over rows ``start:stop``: what they give each of the pass's sums.

    The one block loop of both :func:`run_blocks` (all the rows) and a node spreading the
    rows over other processes (``dpnode.node.cluster``). ``start`` is a multiple of
    ``s.block_rows(elements)``, so the blocks are those of one run over all the rows, and
    the ranges' sums, merged in row order, are bitwise those of :func:`run_blocks`.
    ``values``: at least :func:`pass_inputs`. Row values are never random: no generator.
    """
    step = s.block_rows(elements)
    assert start % step == 0, "a range starts on a block"
    nodes = graph.nodes
    read = s.passes[p]
    gathered = {i: _gather(c) for i in read.sums if (c := calls[i]) is not None}
    turned = dict(s.turned)
    reads = {i: _summed(nodes[i], turned) for i in gathered}  # what each sum adds up
    with np.errstate(all="ignore"), flushing():  # dpnode.core.engine.subnormals
        for first in range(start, stop, step):
            last = min(first + step, stop)
            local: dict[int, Array] = {}
            for i in read.nodes:
                node = nodes[i]
                if node.op == "input":
                    local[i] = rows(i, first, last)
                    continue
                call = _call(s, calls, i, last - first)
                local[i] = _apply(call, [_arg(s, a, values, local) for a in node.args], None)
            for i, g in gathered.items():
                g.add(*[_arg(s, a, values, local) for a in reads[i]])
    return {i: g.found() for i, g in gathered.items()}


def run_blocks(
    s: Schedule,
    graph: Graph,
    calls: Sequence[Call | None],
    bound: Mapping[int, Array],
    gen: np.random.Generator | None,
    elements: int = BLOCK_ELEMENTS,
    *,
    runner: PassRunner | None = None,
) -> list[Array]:
    """Evaluate a scheduled graph on blocks of about ``elements`` elements.

    ``bound``: the graph's input values by node index, checked against their metadata.
    ``runner``: runs each pass elsewhere (``bound`` then needs no row input); by default
    :func:`pass_sums` over all the rows here. Random prims (never on rows) use ``gen``.
    Returns the outputs, fresh arrays the caller may keep or modify.
    """
    nodes = graph.nodes
    values: dict[int, Any] = {i: v for i, v in bound.items() if not s.row[i]}

    def here(p: int, given: Mapping[int, Any]) -> list[dict[int, RangeSums]]:
        def rows(i: int, start: int, stop: int) -> Array:
            return bound[i][start:stop]

        return [pass_sums(s, graph, calls, p, given, rows, 0, s.rows, elements)]

    def small(indices: Sequence[int]) -> None:
        for i in indices:
            node = nodes[i]
            if node.op == "constant":
                values[i] = node.value
                continue
            call = calls[i]
            assert call is not None
            values[i] = _apply(call, [_arg(s, a, values, {}) for a in node.args], gen)

    with np.errstate(all="ignore"), flushing():
        for p, read in enumerate(s.passes):
            small(s.small[p])
            gathered = {i: _gather(c) for i in read.sums if (c := calls[i]) is not None}
            for found in (runner or here)(p, pass_inputs(s, graph, p, values)):
                for i, g in gathered.items():
                    g.merge(found[i])
            for i, g in gathered.items():
                values[i] = g.result()
        small(s.small[len(s.passes)])
    outputs: list[Array] = []
    for o in graph.outputs:
        outputs.append(np.array(values[o], copy=True))  # never a constant's or another's
    return outputs

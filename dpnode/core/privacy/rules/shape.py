"""Rules of the shape and indexing prims: states move with the elements.

A movement prim is applied, with the engine's own kernel, to ``arange(numel)``; the
result says which input element each output element is, and every state array is
gathered with it (arrays that are constant stay compact). An element copied ``c``
times multiplies a joint L1 bound by ``c`` and an L2 bound by ``sqrt(c)``. Indexing
prims need their indices to be public and known (a private index has no rule).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from dpnode.core.engine.prims import REGISTRY
from dpnode.core.privacy import partitions
from dpnode.core.privacy.arrays import fit, recompact, varying_axes
from dpnode.core.privacy.rules.base import Ctx, finish, rule
from dpnode.core.privacy.state import PUBLIC, Array, State, has_joint, has_t, joint
from dpnode.core.privacy.tables import LazyIds, Table

__all__ = ["move"]


def _gather(a: Array, shape: tuple[int, ...], idx: Array, trailing: tuple[int, ...] = ()) -> Array:
    """``a`` (broadcast to ``shape`` + ``trailing``) gathered by a flat index map, re-compacted."""
    full_shape = (*shape, *trailing)
    comp = fit(a, full_shape)
    if all(n == 1 for n in comp.shape[: len(shape)]):
        return comp.reshape((1,) * idx.ndim + comp.shape[len(shape) :])
    flat = np.broadcast_to(a, full_shape).reshape(-1, *trailing)
    return recompact(flat[idx.reshape(-1)].reshape(*idx.shape, *trailing))


def _gather_rows(
    a: Array, shape: tuple[int, ...], idx1: Array, trailing: tuple[int, ...] = ()
) -> Array:
    """As :func:`_gather` for a map that keeps every row in place and moves elements within
    rows alike: ``idx1`` is the map of one row, so a per-row array stays one value per row
    and an array alike in every row is gathered once."""
    nd, n = len(shape), shape[0]
    comp = fit(a, (*shape, *trailing))
    rest = idx1.shape[1:]
    if all(m == 1 for m in comp.shape[1:nd]):
        return comp.reshape((comp.shape[0],) + (1,) * len(rest) + comp.shape[nd:])
    if comp.shape[0] == 1:
        one = np.broadcast_to(comp, (1, *shape[1:], *trailing)).reshape(-1, *trailing)
        return one[idx1.reshape(-1)].reshape(1, *rest, *trailing)
    inner = math.prod(shape[1:])
    every = (idx1.reshape(1, -1) + inner * np.arange(n).reshape(-1, 1)).reshape(-1)
    flat = np.broadcast_to(comp, (*shape, *trailing)).reshape(-1, *trailing)
    return recompact(flat[every].reshape(n, *rest, *trailing))


def _view_op(c: Ctx, shape: tuple[int, ...]) -> Callable[[Array], Array] | None:
    """The prim as an operation on fitted arrays (size-1 where broadcast), if it has one.

    The returned function keeps any trailing axes (a table's domain axis) untouched.
    """
    op, at = c.node.op, c.call.attrs
    nd = len(shape)
    if op == "permute":
        dims = [d % max(nd, 1) for d in at["dims"]]
        return lambda a: np.transpose(a, dims + list(range(nd, a.ndim))) if nd else a
    if op == "unsqueeze":
        d = at["dim"] % (nd + 1)
        return lambda a: np.expand_dims(a, d)
    if op == "squeeze":
        drop = tuple(
            i
            for i, n in enumerate(shape)
            if n == 1 and (at.get("dims") is None or i in {x % max(nd, 1) for x in at["dims"]})
        )
        return lambda a: np.squeeze(a, axis=drop) if drop else a
    if op == "expand":
        lead = len(c.shape) - nd
        return lambda a: a.reshape((1,) * lead + a.shape)
    if op == "flip":
        flips = {d % max(nd, 1) for d in at["dims"]} if nd else set()
        return lambda a: np.flip(a, axis=tuple(d for d in flips if a.shape[d] > 1)) if flips else a
    if op == "slice":
        d = at["dim"] % nd
        sl = slice(at.get("start"), at.get("end"), at.get("step") or 1)
        return lambda a: a if a.shape[d] == 1 else a[(slice(None),) * d + (sl,)]
    if op == "reshape":
        return _reshape_op(shape, c.shape)
    return None


def _reshape_op(src: tuple[int, ...], dst: tuple[int, ...]) -> Callable[[Array], Array]:
    """Reshape on fitted arrays: the leading dims both shapes share are left as they are
    (a per-row array stays one value per row), only the rest is reshaped, in C order.

    >>> op = _reshape_op((5, 2, 3), (5, 6))
    >>> op(np.zeros((5, 1, 1))).shape, op(np.zeros((1, 2, 3))).shape
    ((5, 1), (1, 6))
    """
    p = 0
    while p < min(len(src), len(dst)) and src[p] == dst[p]:
        p += 1
    nd, tail = len(src), (1,) * (len(dst) - p)

    def op(a: Array) -> Array:
        lead, trailing = a.shape[:p], a.shape[nd:]
        if all(n == 1 for n in a.shape[p:nd]):  # one value across the reshaped dims
            return a.reshape((*lead, *tail, *trailing))
        full = np.broadcast_to(a, (*lead, *src[p:], *trailing))
        return full.reshape((*lead, *dst[p:], *trailing))

    return op


def move(c: Ctx, x: State, idx: Array | None, mult: float, rowwise: bool = False) -> State:
    """The state of ``out.flat[i] = x.flat[idx.flat[i]]`` (inputs used ``mult`` times at most).

    With ``idx`` None the prim is applied directly to the fitted state arrays; with
    ``rowwise``, ``idx`` is the map of the first row, and every row moves alike.
    """
    shape = x.shape
    view = _view_op(c, shape) if idx is None else None

    def mv(a: Array, trailing: tuple[int, ...] = ()) -> Array:
        if view is not None:
            return view(fit(a, (*shape, *trailing)))
        assert idx is not None
        if rowwise:
            return _gather_rows(a, shape, idx, trailing)
        return _gather(a, shape, idx, trailing)

    table = None
    if x.table is not None:
        t = x.table
        table = replace(t, root=mv(t.root), vals=mv(t.vals, (t.size,)))
    lo, hi, owner, L, G = (fit(mv(a), c.shape) for a in (x.lo, x.hi, x.owner, x.L, x.G))
    value = None if x.value is None else np.broadcast_to(mv(x.value), c.shape)
    vid: Array | LazyIds | None = None
    if isinstance(x.vid, LazyIds):  # stays lazy: formed only if a comparison needs it
        before = x.vid
        vid = LazyIds(lambda: fit(mv(before.array()), c.shape))
    elif x.vid is not None:
        vid = fit(mv(x.vid), c.shape)
    part = None
    if x.part is not None and idx is None:  # views only: a gathered map may repeat elements
        part = partitions.moved(c.node.op, c.call.attrs, x.part, shape, c.shape)
    s = State(
        c.shape,
        c.meta.dtype,
        lo,
        hi,
        owner,
        L,
        G,
        value=value,
        table=table,
        vid=vid,
        casts=x.casts if vid is not None else None,
        part=part,
    )
    if has_t(x):  # a table moves along by itself
        t1, t2 = joint(x, c.nsub)
        s = s.with_(t1=t1 * mult, t2=t2 * math.sqrt(mult))
    return s


def _source(x: State) -> Array:
    return np.arange(math.prod(x.shape), dtype=np.int64).reshape(x.shape)


@rule("reshape", "expand", "permute", "squeeze", "unsqueeze", "slice", "flip")
def view(c: Ctx) -> State:
    """View prims: a bijection, a selection, or (expand) uniform copies."""
    x = c.arg(0)
    n_in, n_out = math.prod(x.shape), math.prod(c.shape)
    # reshape/permute/squeeze/unsqueeze/flip are bijections, slice a selection;
    # expand copies every element the same number of times
    mult = float(n_out // n_in) if c.node.op == "expand" and n_in and n_out else 1.0
    if x.shape and c.shape:
        return move(c, x, None, mult)
    idx = np.asarray(REGISTRY[c.node.op].kernel(c.call, [_source(x)], None))
    return move(c, x, idx, mult)


def _mapped(c: Ctx, x: State, extra: list[object]) -> State:
    """Move ``x`` by the prim's own kernel applied to element numbers (copies counted).

    Windows along a dim other than the rows (``unfold``) move every row alike: the map
    is made for one row only.
    """
    rowwise = c.node.op == "unfold" and len(x.shape) > 1 and c.call.attrs["dim"] % len(x.shape) != 0
    row = (1, *x.shape[1:])
    src = np.arange(math.prod(row), dtype=np.int64).reshape(row) if rowwise else _source(x)
    idx = np.asarray(REGISTRY[c.node.op].kernel(c.call, [src, *extra], None))
    counts = np.bincount(idx.reshape(-1), minlength=1)
    return move(c, x, idx, float(counts.max()) if idx.size else 0.0, rowwise)


@rule("gather", "index_select", "index")
def index(c: Ctx) -> State:
    """Indexing with public, known indices; a private index only into a public table."""
    x = c.arg(0)
    extra: list[object] = []
    for st in c.args[1:]:
        if st is not None and (not st.is_public or st.value is None):
            if c.node.op != "index" and x.is_public and x.shape:
                return _lookup(c, x, st)
            raise c.fail(
                "the index must be public and known, or index a public table with "
                "index_select or gather (torch.nn.Embedding, torch.gather)"
            )
        extra.append(None if st is None else st.value)
    return _mapped(c, x, extra)


def _lookup(c: Ctx, table: State, idx: State) -> State:
    """A public table read at private positions (an embedding, a lookup): each output is
    some entry of the table along ``dim`` (a total kernel clamps an index out of range into
    it), so it lies between that dim's least and greatest entry, and it moves, anywhere in
    between, with its index: the index element's owner, and a jump wherever the index's
    ``L`` or ``G`` is not 0."""
    d = c.call.attrs["dim"] % len(table.shape)
    lo_t, hi_t = fit(table.lo, table.shape), fit(table.hi, table.shape)
    if c.node.op == "index_select":  # out[..., j, ...] = table[..., idx[j], ...]
        lo, hi = lo_t.min(axis=d, keepdims=True), hi_t.max(axis=d, keepdims=True)
        along = [1] * len(c.shape)
        along[d] = -1

        def placed(a: Array) -> Array:
            return np.reshape(np.broadcast_to(a, idx.shape).reshape(-1), along)

    else:  # gather: out has the index's shape
        lo, hi = lo_t.min(), hi_t.max()

        def placed(a: Array) -> Array:
            return fit(a, idx.shape)

    jump = np.asarray(np.inf)
    owner = placed(idx.owner)
    L = np.where(placed(idx.L) > 0, jump, 0.0)
    G = np.where(placed(idx.G) > 0, jump, 0.0)
    return finish(c.meta, lo, hi, owner, L, G)


@rule("unfold")
def unfold(c: Ctx) -> State:
    """Sliding windows: overlapping windows copy an element up to ``ceil(size/step)`` times."""
    return _mapped(c, c.arg(0), [])


@rule("cat")
def cat(c: Ctx) -> State:
    """Concatenation: disjoint parts, so joint bounds add (L1) or add in squares (L2)."""
    parts = [s for s in (c.arg(i) for i in range(len(c.args))) if s.shape != (0,)]
    if not parts:
        z = np.zeros(c.shape)
        return State(c.shape, c.meta.dtype, z, z, np.full(c.shape, PUBLIC), z, z)
    d = c.call.attrs["dim"] % len(c.shape)

    def join(arrays: list[Array], trailing: tuple[int, ...] = ()) -> Array:
        fitted = [fit(a, (*p.shape, *trailing)) for a, p in zip(arrays, parts, strict=True)]
        full = (*c.shape, *trailing)
        # an axis other than d stays compact where every part is compact along it
        shape = [1 if all(f.shape[ax] == 1 for f in fitted) else n for ax, n in enumerate(full)]
        if all(f.shape[d] == 1 for f in fitted):  # one value along d in every part:
            shape[d] = 1  # if they agree, the whole concatenation is that value
            first = np.broadcast_to(fitted[0], shape)
            if all(np.array_equal(first, np.broadcast_to(f, shape)) for f in fitted[1:]):
                return first
        joined = np.concatenate(
            [
                np.broadcast_to(f, (*shape[:d], p.shape[d], *shape[d + 1 :]))
                for f, p in zip(fitted, parts, strict=True)
            ],
            axis=d,
        )
        return recompact(joined)  # e.g. columns stacked side by side share their row owners

    s = State(
        c.shape,
        c.meta.dtype,
        join([p.lo for p in parts]),
        join([p.hi for p in parts]),
        join([p.owner for p in parts]),
        join([p.L for p in parts]),
        join([p.G for p in parts]),
    )
    tables = [p.table for p in parts]
    if all(t is not None and t.bps is None for t in tables):
        ts = [t for t in tables if t is not None]
        size = max(t.size for t in ts)
        vals = [
            np.concatenate(
                [t.vals, np.repeat(t.vals[..., -1:], size - t.size, axis=-1)], -1
            ).astype(c.meta.dtype.np)
            for t in ts
        ]
        s = s.with_(table=Table(join([t.root for t in ts]), join(vals, (size,))))
    if any(has_joint(p) for p in parts):
        js = [joint(p, c.nsub) for p in parts]
        s = s.with_(  # per-subject vectors are (1,) or (nsub,): add with broadcasting
            t1=functools.reduce(np.add, [j[0] for j in js]),
            t2=np.sqrt(functools.reduce(np.add, [j[1] ** 2 for j in js])),
        )
    return s


def _pad_map(c: Ctx, shape: tuple[int, ...]) -> Array:
    """Index of the input element at each output position, -1 where padding is filled in."""
    src = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    pad = list(c.call.attrs["pad"])
    widths = [(0, 0)] * len(shape)
    index: list[slice] = [slice(None)] * len(shape)
    for k in range(len(pad) // 2):
        dim = len(shape) - 1 - k
        lo, hi = pad[2 * k], pad[2 * k + 1]
        widths[dim] = (max(lo, 0), max(hi, 0))
        index[dim] = slice(-min(lo, 0), shape[dim] + min(hi, 0))
    return np.pad(src[tuple(index)], widths, constant_values=-1)


def _pads_rows(c: Ctx, x: State) -> bool:
    """Whether the pad adds or removes rows (it pads the first dim)."""
    pad = list(c.call.attrs["pad"])
    k = len(x.shape) - 1  # the pair of widths of dim 0, counted from the last dim
    return len(pad) > 2 * k and (pad[2 * k] != 0 or pad[2 * k + 1] != 0)


@rule("pad")
def pad(c: Ctx) -> State:
    """Constant padding: the filled positions are public constants."""
    x = c.arg(0)
    idx = _pad_map(c, x.shape)
    fill = float(c.call.attrs.get("value") or 0.0)
    inside = idx >= 0
    safe = np.where(inside, idx, 0)

    def take(a: Array, filler: float) -> Array:
        return recompact(np.where(inside, np.broadcast_to(a, x.shape).reshape(-1)[safe], filler))

    owner = fit(x.owner, x.shape)
    if x.shape and not any(varying_axes(owner, x.shape, exact=True)[1:]) and not _pads_rows(c, x):
        # one owner per row (an image per subject): the filled positions, constants that
        # move by L = G = 0, are given the row's owner too, so owners stay one per row
        owner = owner[(slice(None),) + (slice(0, 1),) * (owner.ndim - 1)]
    else:
        owner = take(x.owner, PUBLIC).astype(np.int64)
    s = State(
        c.shape,
        c.meta.dtype,
        take(x.lo, fill),
        take(x.hi, fill),
        owner,
        take(x.L, 0.0),
        take(x.G, 0.0),
    )
    if has_joint(x):
        t1, t2 = joint(x, c.nsub)
        s = s.with_(t1=t1, t2=t2)
    return s

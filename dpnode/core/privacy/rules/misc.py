"""Rules of the random prim and of per-subject clipping (DP-SGD).

``rand`` draws from the node's generator: its values do not depend on any subject,
so it is public (``L = G = 0``) with bounds ``[0, 1]``, but its value is unknown to
the tracker (it never re-draws).

``clip_by_subject_norm`` (the engine's ``dpnode/core/engine/prims/dpsgd.py``; see
docs/sensitivity.md) is DP-SGD's clipping:

    clip_by_subject_norm(x: float[n, *f], groups: int64[n]; max_norm: float) -> float[*f]
    = sum over distinct g in groups of clip(sum_{i: groups[i] = g} x[i])
    where clip(v) = v * min(1, max_norm / ||v||_2)

When subject ``s``'s rows fall into ``k_s`` groups, replacing ``s`` changes at most
``k_s`` clipped vectors, each by at most ``2 * max_norm`` in L2: the output's L2
sensitivity is ``2 * max_norm * max_s k_s``, which is ``2C`` when the groups are the
subjects (or every subject has one row); its L1 sensitivity is ``sqrt(features)`` times
that. With ``ord = 1`` the vectors are clipped to L1 norm ``max_norm`` instead, and the L1
sensitivity is ``2 * max_norm * max_s k_s`` (so is the L2, which is at most the L1).

``groups`` must be public: a constant, or the dataset's subject index, which the node binds
to ``dataset:<id>/@subject`` as a public input with its value; with a public value the
tracker does not know, every row counts as its own group. Private groups (computed from
data) are refused.

A part given by two factors (``outer``: the rows ``g[i] (x) x[i]`` of a linear layer's
per-example weight gradients) is tracked as the part it stands for: its row ``i`` belongs to
the subject that owns row ``i`` of ``g`` or of ``x`` (a public row of either adds no owner),
and its elements lie in the products of the factors' intervals.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpnode.core.engine.prims.dpsgd import part_arguments
from dpnode.core.privacy.arrays import fit, reduce_array, varying_axes
from dpnode.core.privacy.rules.base import Ctx, finish, rule
from dpnode.core.privacy.state import MIXED, PUBLIC, Array, State, mul0

__all__ = ["clip_by_subject_norm", "clip_parts", "outer_state", "quantile", "rand"]


@rule("rand")
def rand(c: Ctx) -> State:
    """Uniform [0, 1) noise from the node's generator: public, value unknown."""
    z = np.zeros(())
    return finish(c.meta, 0.0, 1.0, np.asarray(PUBLIC, dtype=np.int64), z, z)


@rule("quantile")
def quantile(c: Ctx) -> State:
    """A quantile of private values is not bounded by noise: it is selected, by the
    exponential mechanism, when it is a publish's output (``dpnode.core.dp.selection``); as the
    argument of anything else it is refused."""
    raise c.fail(
        "a quantile (median) of private values is released on its own, by the exponential "
        "mechanism: publish it as a result by itself (torch.median(x).publish(epsilon=...)) "
        "and compute with the published value"
    )


def clip_parts(c: Ctx) -> list[State]:
    """The states of a clip's parts, an outer part's as :func:`outer_state` builds it."""
    return [
        outer_state(c, c.arg(at[0]), c.arg(at[1])) if len(at) == 2 else c.arg(at[0])
        for at in part_arguments(c.call)
    ]


def outer_state(c: Ctx, g: State, x: State) -> State:
    """The state of the ``[n, p * q]`` rows ``g[i] (x) x[i]``: interval products, and per
    row the one owner of ``g``'s and ``x``'s rows (refused when both are owned by different
    subjects, or a row depends on several)."""
    for f in (g, x):
        if len(f.shape) != 2:
            raise c.fail("an outer part's factors must be [n, p] and [n, q]")
        if any(varying_axes(f.owner, f.shape, exact=True)[1:]) or not np.all(f.G == 0):
            raise c.fail("every row must depend on one subject only (its owner)")
    (n, p), q = g.shape, x.shape[1]
    gl, gh = fit(g.lo, g.shape)[:, :, None], fit(g.hi, g.shape)[:, :, None]
    xl, xh = fit(x.lo, x.shape)[:, None, :], fit(x.hi, x.shape)[:, None, :]
    # each factor's bounds may be per row or shared, and its low and high ends of different
    # shapes (a scaled column's low end is one number, its high end one per feature): the
    # four corner products broadcast against each other
    ends = [mul0(a, b) for a in (gl, gh) for b in (xl, xh)]
    rows = max(e.shape[0] for e in ends)
    lo = np.broadcast_to(functools.reduce(np.minimum, ends), (rows, p, q)).reshape(rows, p * q)
    hi = np.broadcast_to(functools.reduce(np.maximum, ends), (rows, p, q)).reshape(rows, p * q)
    go, xo = (np.broadcast_to(fit(f.owner, f.shape)[:, :1], (n, 1)) for f in (g, x))
    if bool(np.any((go != PUBLIC) & (xo != PUBLIC) & (go != xo))):
        raise c.fail("the two factors' rows must belong to the same subjects, row by row")
    owner = np.where(go == PUBLIC, xo, go)
    zero = np.zeros((1, 1))
    return State((n, p * q), g.dtype, lo, hi, owner, zero, zero)


@rule("clip_by_subject_norm")
def clip_by_subject_norm(c: Ctx) -> State:
    """Sum of per-group clipped row sums: each subject moves ``2C`` per group it touches.
    With several tensors before the groups, their rows are joined into one vector each:
    every part's row must belong to the same subject (or to none)."""
    parts, groups = clip_parts(c), c.arg(len(c.args) - 1)
    bound = float(c.call.attrs.get("max_norm", math.nan))
    if not (math.isfinite(bound) and bound > 0):
        raise c.fail(f"max_norm must be finite and positive, got {bound}")
    if not all(x.shape for x in parts):
        raise c.fail("needs rows: x must have at least one dim")
    # a part with no values in its rows adds nothing to a row's norm nor to the output
    parts = [x for x in parts if math.prod(x.shape[1:]) > 0]
    rows: Array | None = None
    for x in parts:
        if bool(np.isnan(x.lo).any() or np.isnan(x.hi).any()):
            # a NaN bound says a value may be NaN (an operation may leave its domain), and
            # then which subjects it depends on is not known; infinite bounds are fine: the
            # kernel clips a row whatever its values, an infinite one to 0
            raise c.fail("the rows to clip may be NaN (an operation can leave its domain)")
        if any(varying_axes(x.owner, x.shape, exact=True)[1:]) or not np.all(x.G == 0):
            raise c.fail("every row must depend on one subject only (its owner)")
        # one owner per row (checked above): the first element of each row, without
        # broadcasting the owners to every feature
        owners = fit(x.owner, x.shape)
        mine = np.broadcast_to(owners[(slice(None),) + (0,) * (owners.ndim - 1)], x.shape[:1])
        if (mine == MIXED).any():
            raise c.fail("every row must depend on one subject only (its owner)")
        if rows is None or bool(np.all(rows == PUBLIC)):
            rows = mine
        elif not bool(np.all((mine == rows) | (mine == PUBLIC))):
            raise c.fail("the parts' rows must belong to the same subjects, row by row")
    assert rows is not None
    nsub = max(c.nsub, 1)
    priv = rows >= 0
    n = parts[0].shape[0]
    if groups.is_public and groups.value is not None:
        g = np.asarray(groups.value).reshape(-1)
        pairs = np.unique(np.stack([rows[priv], g[priv]]), axis=1)
        touched = np.bincount(pairs[0], minlength=nsub)[:nsub].astype(np.float64)
        ngroups = len(np.unique(g))
    elif groups.is_public:
        touched = np.bincount(rows[priv], minlength=nsub)[:nsub].astype(np.float64)
        ngroups = n
    else:
        raise c.fail("the grouping of rows must be public")
    feat = math.prod(c.shape)
    per = 2 * bound * float(touched.max(initial=0.0))
    # each output element: a sum over rows of terms within [min(lo, 0), max(hi, 0)]
    ends = []
    for x in parts:
        lo_sum = reduce_array(np.minimum(fit(x.lo, x.shape), 0.0), x.shape, (0,))[0]
        hi_sum = reduce_array(np.maximum(fit(x.hi, x.shape), 0.0), x.shape, (0,))[0]
        ends.append(
            (
                np.broadcast_to(lo_sum, x.shape[1:]).reshape(-1),
                np.broadcast_to(hi_sum, x.shape[1:]).reshape(-1),
            )
        )
    if len(parts) == 1:
        lo_all, hi_all = ends[0]
        lo_all, hi_all = lo_all.reshape(c.shape), hi_all.reshape(c.shape)
    else:
        lo_all = np.concatenate([lo for lo, _ in ends])
        hi_all = np.concatenate([hi for _, hi in ends])
    lo = np.maximum(lo_all, -ngroups * bound)
    hi = np.minimum(hi_all, ngroups * bound)
    owner = np.full(c.shape, MIXED, dtype=np.int64)
    s = finish(c.meta, lo, hi, owner, np.full(c.shape, per), np.full(c.shape, per))
    t2 = 2 * bound * touched
    if c.call.attrs.get("ord", 2) == 1:  # clipped in L1: each vector moves 2C in L1
        return s.with_(t1=t2, t2=t2)
    return s.with_(t1=t2 * math.sqrt(feat), t2=t2)

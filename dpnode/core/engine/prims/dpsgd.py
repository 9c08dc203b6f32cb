"""DP-SGD's per-subject clipping: ``clip_by_subject_norm``.

    clip_by_subject_norm(x: float[n, *f], groups: int[n]; max_norm) -> float[*f]
      = sum over distinct g in groups of clip(sum_{i: groups[i] = g} x[i]),
        clip(v) = v * min(1, max_norm / ||v||)        (v = 0 stays 0)

    clip_by_subject_norm(x1: float[n, *f1], ..., xk: float[n, *fk], groups; max_norm)
      -> float[|f1| + ... + |fk|]: the same, each row of x1 .. xk joined into one vector
         (a model's parameters), without copying them into one tensor

with ``||v||`` the L2 norm, or the L1 norm when ``ord`` is 1 (a Laplace release's: a row of
statistics per group, for instance, whose L1 norm a group-by bounds).

Rows of ``x`` are per-example gradients (flattened and concatenated over all the
parameters of a model, so one subject's whole gradient is clipped jointly); ``groups``
says which rows belong together (the subject index, or one group per row). With the
groups equal to the subjects, replacing one subject moves one clipped vector by at
most ``2 * max_norm`` in that norm, which is what the privacy rule (``node/privacy/rules/
misc.py``) charges. The kernel sorts the rows by group once and sums each group with
``np.add.reduceat``: no Python loop over groups, and nothing to sort when every row is
its own group. It computes in float64 and rounds once to ``x``'s dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from node.engine.prims.registry import Array, AttrSpec, Call, TensorMeta, prim


def _parts(c: Call) -> list[TensorMeta]:
    """The per-example tensors: every argument but the last (the groups)."""
    return [c.tensor(i) for i in range(len(c.args) - 1)]


def _infer(c: Call) -> TensorMeta:
    parts, groups = _parts(c), c.tensor(len(c.args) - 1)
    x = parts[0]
    for i, p in enumerate(parts):
        if not p.dtype.is_float:
            raise c.fail(f"x must be floating point, got {p.dtype.name}", i)
        if p.ndim < 1:
            raise c.fail("x must have a row dimension (shape [n, ...])", i)
        if p.shape[0] != x.shape[0] or p.dtype != x.dtype:
            raise c.fail(
                f"every part needs x's rows ({x.shape[0]}) and dtype ({x.dtype.name}), got "
                f"{p.shape[0]} rows of {p.dtype.name}",
                i,
            )
    last = len(c.args) - 1
    if not groups.dtype.is_int:
        raise c.fail(f"groups must be an integer tensor, got {groups.dtype.name}", last)
    if groups.shape != x.shape[:1]:
        raise c.fail(
            f"groups must have one entry per row of x: shape [{x.shape[0]}], "
            f"got {list(groups.shape)}",
            last,
        )
    bound = c.attr("max_norm")
    if not (math.isfinite(bound) and bound > 0):
        raise c.fail(f"max_norm must be finite and positive, got {bound}", "max_norm")
    if c.attr("ord") not in (1, 2):
        raise c.fail(f"ord must be 1 or 2, got {c.attr('ord')}", "ord")
    if len(parts) == 1:
        return TensorMeta(x.shape[1:], x.dtype)
    return TensorMeta((sum(p.numel // max(p.shape[0], 1) for p in parts),), x.dtype)


def _flops(c: Call) -> int:
    # group sums, squares, norms, scaling and the final sum: a few passes over x; a sort of n
    parts = _parts(c)
    n = max(parts[0].shape[0], 2)
    return 6 * max(sum(p.numel for p in parts), 1) + n * max(int(math.log2(n)), 1)


def _workspace(c: Call) -> int:
    # a block's float64 copy (or the group sums: a float64 copy of x), the int64 sort indices
    parts = _parts(c)
    return 2 * 8 * sum(p.numel for p in parts) + 3 * 8 * parts[0].shape[0]


@prim(
    "clip_by_subject_norm",
    privacy="rule",
    args=(2, None),
    attrs={"max_norm": AttrSpec("float"), "ord": AttrSpec("int", optional=True, default=2)},
    infer=_infer,
    flops=_flops,
    workspace=_workspace,
)
def _clip_by_subject_norm(c: Call, args: list[Any], out: Array | None) -> Array:
    """Sum over groups of each group's row sum, clipped to L2 (or L1) norm ``max_norm``;
    with several tensors before the groups, their rows joined (one vector per row, the
    output their flattened sums one after another), without copying them together."""
    *xs, groups = args
    m = c.out()
    n = xs[0].shape[0]
    if n == 0:
        return np.zeros(m.shape, dtype=m.dtype.np)
    flats = [np.asarray(x).reshape(n, -1) for x in xs]
    order = np.argsort(groups, kind="stable")
    sorted_groups = np.asarray(groups)[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    max_norm, norm_ord = c.attr("max_norm"), c.attr("ord")
    if len(starts) == n:
        # every row its own group (the usual case): the rows are the group sums already.
        # Taken in blocks of rows, so that each float64 copy stays in cache (a sixth of the
        # time of one copy of the whole); the sum's rounding bound holds in any order
        # (node.privacy.rounding._clip_error).
        totals = [np.zeros(f.shape[1]) for f in flats]
        for start in range(0, n, _BLOCK_ROWS):
            blocks = [f[start : start + _BLOCK_ROWS].astype(np.float64) for f in flats]
            for total, part in zip(totals, _clipped_sums(blocks, max_norm, norm_ord), strict=True):
                total += part
    else:
        sums = [np.add.reduceat(f.astype(np.float64)[order], starts, axis=0) for f in flats]
        totals = _clipped_sums(sums, max_norm, norm_ord)
    total = totals[0] if len(totals) == 1 else np.concatenate(totals)
    return np.asarray(total.reshape(m.shape)).astype(m.dtype.np)


#: rows of the per-example gradients clipped at a time
_BLOCK_ROWS = 128


def _clipped_sums(parts: list[Array], max_norm: float, order: int) -> list[Array]:
    """Per part, the sum of its rows (float64), each row of all the parts joined scaled down
    to norm ``max_norm`` (L2, or L1 for ``order`` 1)."""
    if order == 1:
        norms = sum(np.abs(p).sum(axis=1) for p in parts)
    else:
        norms = np.sqrt(sum(np.einsum("ij,ij->i", p, p) for p in parts))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(norms > max_norm, max_norm / norms, 1.0)
    return [np.asarray(scale @ p) for p in parts]

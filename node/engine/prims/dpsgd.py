"""DP-SGD's per-subject clipping: ``clip_by_subject_norm``.

    clip_by_subject_norm(x: float[n, *f], groups: int[n]; max_norm) -> float[*f]
      = sum over distinct g in groups of clip(sum_{i: groups[i] = g} x[i]),
        clip(v) = v * min(1, max_norm / ||v||)        (v = 0 stays 0)

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


def _infer(c: Call) -> TensorMeta:
    x, groups = c.tensor(0), c.tensor(1)
    if not x.dtype.is_float:
        raise c.fail(f"x must be floating point, got {x.dtype.name}", 0)
    if x.ndim < 1:
        raise c.fail("x must have a row dimension (shape [n, ...])", 0)
    if not groups.dtype.is_int:
        raise c.fail(f"groups must be an integer tensor, got {groups.dtype.name}", 1)
    if groups.shape != x.shape[:1]:
        raise c.fail(
            f"groups must have one entry per row of x: shape [{x.shape[0]}], "
            f"got {list(groups.shape)}",
            1,
        )
    bound = c.attr("max_norm")
    if not (math.isfinite(bound) and bound > 0):
        raise c.fail(f"max_norm must be finite and positive, got {bound}", "max_norm")
    if c.attr("ord") not in (1, 2):
        raise c.fail(f"ord must be 1 or 2, got {c.attr('ord')}", "ord")
    return TensorMeta(x.shape[1:], x.dtype)


def _flops(c: Call) -> int:
    # group sums, squares, norms, scaling and the final sum: a few passes over x; a sort of n
    x = c.tensor(0)
    n = max(x.shape[0], 2)
    return 6 * max(x.numel, 1) + n * max(int(math.log2(n)), 1)


def _workspace(c: Call) -> int:
    # a float64 copy of x, its sorted copy (or the group sums), and the int64 sort indices
    x = c.tensor(0)
    return 2 * 8 * x.numel + 3 * 8 * x.shape[0]


@prim(
    "clip_by_subject_norm",
    privacy="rule",
    args=2,
    attrs={"max_norm": AttrSpec("float"), "ord": AttrSpec("int", optional=True, default=2)},
    infer=_infer,
    flops=_flops,
    workspace=_workspace,
)
def _clip_by_subject_norm(c: Call, args: list[Any], out: Array | None) -> Array:
    """Sum over groups of each group's row sum, clipped to L2 (or L1) norm ``max_norm``."""
    x, groups = args
    m = c.out()
    n = x.shape[0]
    if n == 0:
        return np.zeros(m.shape, dtype=m.dtype.np)
    flat = np.asarray(x).reshape(n, -1)
    order = np.argsort(groups, kind="stable")
    sorted_groups = np.asarray(groups)[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    max_norm, norm_ord = c.attr("max_norm"), c.attr("ord")
    if len(starts) == n:
        # every row its own group (the usual case): the rows are the group sums already.
        # Taken in blocks of rows, so that each float64 copy stays in cache (a sixth of the
        # time of one copy of the whole); the sum's rounding bound holds in any order
        # (node.privacy.rounding._clip_error).
        total = np.zeros(flat.shape[1])
        for start in range(0, n, _BLOCK_ROWS):
            block = flat[start : start + _BLOCK_ROWS].astype(np.float64)
            total += _clipped_sum(block, max_norm, norm_ord)
    else:
        rows = flat.astype(np.float64)
        total = _clipped_sum(np.add.reduceat(rows[order], starts, axis=0), max_norm, norm_ord)
    return np.asarray(total.reshape(m.shape)).astype(m.dtype.np)


#: rows of the per-example gradients clipped at a time
_BLOCK_ROWS = 128


def _clipped_sum(sums: Array, max_norm: float, order: int) -> Array:
    """The sum of the rows of ``sums`` (float64), each scaled down to norm ``max_norm``
    (L2, or L1 for ``order`` 1)."""
    l1 = order == 1
    norms = np.abs(sums).sum(axis=1) if l1 else np.sqrt(np.einsum("ij,ij->i", sums, sums))
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(norms > max_norm, max_norm / norms, 1.0)
    return np.asarray(scale @ sums)

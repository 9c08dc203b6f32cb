"""DP-SGD's per-subject clipping: ``clip_by_subject_norm``.

    clip_by_subject_norm(x: float[n, *f], groups: int[n]; max_norm) -> float[*f]
      = sum over distinct g in groups of clip(sum_{i: groups[i] = g} x[i]),
        clip(v) = v * min(1, max_norm / ||v||)        (v = 0 stays 0)

    clip_by_subject_norm(x1: float[n, *f1], ..., xk: float[n, *fk], groups; max_norm)
      -> float[|f1| + ... + |fk|]: the same, each row of x1 .. xk joined into one vector
         (a model's parameters), without copying them into one tensor

    clip_by_subject_norm(g1, x1, x2, ..., groups; max_norm, outer=[1, 0, ...])
      -> the same, with a part flagged in ``outer`` given by two arguments ``g: [n, p]``
         and ``x: [n, q]`` that stand for the ``[n, p * q]`` part whose row ``i`` is the
         outer product ``g[i] (x) x[i]`` (a linear layer's per-example weight gradient)

with ``||v||`` the L2 norm, or the L1 norm when ``ord`` is 1 (a Laplace release's: a row of
statistics per group, for instance, whose L1 norm a group-by bounds).

Rows of ``x`` are per-example gradients (flattened and concatenated over all the
parameters of a model, so one subject's whole gradient is clipped jointly); ``groups``
says which rows belong together (the subject index, or one group per row). With the
groups equal to the subjects, replacing one subject moves one clipped vector by at
most ``2 * max_norm`` in that norm, which is what the privacy rule (``dpnode/core/privacy/rules/
misc.py``) charges. The kernel sorts the rows by group once and sums each group with
``np.add.reduceat``: no Python loop over groups, and nothing to sort when every row is
its own group. It computes in float64 and rounds once to ``x``'s dtype.

An outer part is never built when every row is its own group and the norm is L2 (the
usual DP-SGD step), as in Opacus's fast gradient clipping: the norm of ``g[i] (x) x[i]``
is ``||g[i]|| ||x[i]||``, and the clipped sum is ``(s * g)^T x`` for the rows' scales ``s``,
one product over the rows instead of ``n * p * q`` numbers written and read. Otherwise its
rows are built: block by block for the L1 norm, whole to sum groups of rows (the memory
quotas count an outer part as built).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from dpnode.core.engine.constant_time import select
from dpnode.core.engine.prims.registry import Array, AttrSpec, Call, TensorMeta, prim


def part_arguments(c: Call) -> list[tuple[int, ...]]:
    """Each part's argument indices: ``(i,)`` for a part given whole, ``(i, i + 1)`` for an
    outer part given by its two factors (``outer``); the groups are the last argument. The
    privacy rule and its rounding bound read the parts the same way."""
    flags = list(c.attr("outer") or ())
    given = len(c.args) - 1
    if not flags:
        return [(i,) for i in range(given)]
    if any(f not in (0, 1) for f in flags) or len(flags) + sum(flags) != given:
        raise c.fail(
            f"outer must flag each part 0 (one argument) or 1 (two factors): {len(flags)} "
            f"flags for {given} arguments before the groups",
            "outer",
        )
    layout: list[tuple[int, ...]] = []
    i = 0
    for f in flags:
        layout.append((i, i + 1) if f else (i,))
        i += 1 + f
    return layout


def _parts(c: Call) -> list[TensorMeta]:
    """The per-example tensors (an outer part's as if built): ``[n, ...]`` each."""
    parts = []
    for at in part_arguments(c):
        if len(at) == 1:
            parts.append(c.tensor(at[0]))
            continue
        g, x = c.tensor(at[0]), c.tensor(at[1])
        if g.ndim != 2 or x.ndim != 2 or g.shape[0] != x.shape[0] or g.dtype != x.dtype:
            raise c.fail(
                "an outer part's factors must be [n, p] and [n, q] of one dtype, got "
                f"{list(g.shape)} {g.dtype.name} and {list(x.shape)} {x.dtype.name}",
                at[1],
            )
        parts.append(TensorMeta((g.shape[0], g.shape[1] * x.shape[1]), g.dtype))
    return parts


def _infer(c: Call) -> TensorMeta:
    parts, groups = _parts(c), c.tensor(len(c.args) - 1)
    x = parts[0]
    for (i, *_), p in zip(part_arguments(c), parts, strict=True):
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
    attrs={
        "max_norm": AttrSpec("float"),
        "ord": AttrSpec("int", optional=True, default=2),
        "outer": AttrSpec("ints", optional=True, default=()),
    },
    infer=_infer,
    flops=_flops,
    workspace=_workspace,
)
def _clip_by_subject_norm(c: Call, args: list[Any], out: Array | None) -> Array:
    """Sum over groups of each group's row sum, clipped to L2 (or L1) norm ``max_norm``;
    with several tensors before the groups, their rows joined (one vector per row, the
    output their flattened sums one after another), without copying them together; an
    outer part (``outer``) given by its two factors."""
    groups = args[-1]
    m = c.out()
    layout = part_arguments(c)
    n = args[0].shape[0]
    if n == 0:
        return np.zeros(m.shape, dtype=m.dtype.np)
    parts = [tuple(np.asarray(args[i]).reshape(n, -1) for i in at) for at in layout]
    g = np.asarray(groups)
    # rows numbered in order (the SDK's ``arange``): every row its own group, nothing to
    # sort (the groups are public: this branch shows nothing of the data)
    alone = bool((g[1:] > g[:-1]).all())
    if not alone:
        order = np.argsort(g, kind="stable")
        sorted_groups = g[order]
        starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
        alone = len(starts) == n
    max_norm, norm_ord = c.attr("max_norm"), c.attr("ord")
    wide = m.dtype.np == np.float64  # a float32's squares and their products fit a float64
    if alone:
        # every row its own group (the usual case): the rows are the group sums already.
        # Taken in blocks of rows, so that each float64 copy stays in cache (a sixth of the
        # time of one copy of the whole); the sum's rounding bound holds in any order
        # (dpnode.core.privacy.rounding._clip_error).
        totals = [np.zeros(math.prod(f.shape[1] for f in part)) for part in parts]
        rows = _block_rows(parts, norm_ord)
        for start in range(0, n, rows):
            blocks = [
                tuple(f[start : start + rows].astype(np.float64) for f in part) for part in parts
            ]
            if norm_ord == 1:  # an L1 norm does not factor: outer parts built
                blocks = [(_outer(*b) if len(b) == 2 else b[0],) for b in blocks]
            for total, part in zip(
                totals, _clipped_sums(blocks, max_norm, norm_ord, wide), strict=True
            ):
                total += part
    else:
        sums = [
            np.add.reduceat(
                _outer(*(f.astype(np.float64) for f in part))[order]
                if len(part) == 2
                else part[0].astype(np.float64)[order],
                starts,
                axis=0,
            )
            for part in parts
        ]
        totals = _clipped_sums([(s,) for s in sums], max_norm, norm_ord, wide)
    total = totals[0] if len(totals) == 1 else np.concatenate(totals)
    return np.asarray(total.reshape(m.shape)).astype(m.dtype.np)


#: the exponent of a zero row of a part, below any a float64 can have
_NO_EXPONENT = -(1 << 20)

#: the smallest normal float64: a clip's scale below it is taken as 0
_SMALLEST_NORMAL = float(np.finfo(np.float64).tiny)

#: the exponent bits of a float64, all set in an infinity or a NaN
_EXPONENT = np.uint64(0x7FF0000000000000)


def _zero_nonfinite(f: Array) -> None:
    """Set the NaN and infinite elements of the float64 array ``f`` to +0, in place, by
    integer arithmetic on their bits: the same three passes whatever the values."""
    bits = f.view(np.uint64)
    np.multiply(bits, (bits & _EXPONENT) != _EXPONENT, out=bits)


def _outer(g: Array, x: Array) -> Array:
    """Each row's outer product ``g[i] (x) x[i]``, flattened: ``[n, p * q]``."""
    return (g[:, :, None] * x[:, None, :]).reshape(g.shape[0], -1)


#: rows of the per-example gradients clipped at a time, at least
_BLOCK_ROWS = 128

#: float64 elements of one block's copy, at most, where rows are narrow enough (256 KiB)
_BLOCK_ELEMENTS = 1 << 15


def _block_rows(parts: list[tuple[Array, ...]], order: int) -> int:
    """Rows of a block: ``_BLOCK_ROWS``, or more where a row is narrow, as many as keep the
    block's float64 copy within ``_BLOCK_ELEMENTS`` (each block costs a dozen NumPy calls,
    which on a row of a few moments took 20 times the arithmetic). An outer part counts
    its factors, or its product where an L1 norm builds it.

    >>> _block_rows([(np.zeros((5, 3)),)], 2), _block_rows([(np.zeros((5, 4096)),)], 2)
    (10922, 128)
    >>> g, x = np.zeros((5, 8)), np.zeros((5, 16))
    >>> _block_rows([(g, x)], 2), _block_rows([(g, x)], 1)
    (1365, 256)
    """
    width = sum(
        math.prod(f.shape[1] for f in p) if order == 1 else sum(f.shape[1] for f in p)
        for p in parts
    )
    return max(_BLOCK_ROWS, _BLOCK_ELEMENTS // max(width, 1))


def _clipped_sums(
    parts: list[tuple[Array, ...]], max_norm: float, order: int, wide: bool
) -> list[Array]:
    """Per part, the sum of its rows (float64), each row of all the parts joined scaled down
    to norm ``max_norm`` (L2, or L1 for ``order`` 1). A part is ``(rows,)``, or ``(g, x)``
    for rows ``g[i] (x) x[i]`` (L2 only), whose norm is ``|g[i]| |x[i]|`` and whose scaled
    sum is ``(scale * g)^T x``: never built.

    The arrays are the caller's float64 copies: a NaN or infinite element is set to 0 in
    them first, so each row's clipped vector is a function of that row alone with norm at
    most ``max_norm`` whatever its values, which is all the privacy rule assumes. It is
    done on every row, whatever the values, so that the work does not depend on them
    (``np.copyto(where=)`` skips what it need not write, and ``np.where`` branches:
    :mod:`dpnode.core.engine.constant_time`).

    ``wide``: the values are float64's. An L2 norm of narrower values (float32, float16,
    bfloat16: magnitudes within ``[2^-149, 2^128]``) is computed from their squares, which,
    summed and multiplied by a factor's, stay within float64's normal range. A float64's
    norm is computed on each row divided by a power of two near its largest element
    (:func:`_l2_scales`): from plain squares, a factor ``g`` of ``1e-170`` squared to 0 and
    an ``x`` of ``1e170`` to infinity, their product was NaN, and the row was not clipped.
    Which way is taken depends on the dtype alone."""
    for part in parts:
        for f in part:
            _zero_nonfinite(f)
    if order == 2 and wide:
        scale = _l2_scales(parts, max_norm)
    else:
        if order == 1:
            # einsum: a row's few elements summed in one loop (.sum(axis=1) took 4 times as
            # long on rows of a few moments)
            norms = sum(np.einsum("ij->i", np.abs(p[0])) for p in parts)
        else:
            squares = sum(math.prod(np.einsum("ij,ij->i", f, f) for f in p) for p in parts)
            norms = np.sqrt(squares)
        with np.errstate(divide="ignore", invalid="ignore"):
            # min(1, C / norm) without a branch: an overflowed norm scales its row to 0,
            # and fmin takes 1 over a zero row's C / 0
            scale = np.fmin(max_norm / norms, 1.0)
    # a subnormal scale may have been rounded up by far more than a relative unit (where the
    # CPU does not flush it to zero): a row of norm beyond C * 2^1022 scales to 0 instead
    np.multiply(scale, scale >= _SMALLEST_NORMAL, out=scale)
    return [
        np.asarray(scale @ p[0]) if len(p) == 1 else ((scale[:, None] * p[0]).T @ p[1]).reshape(-1)
        for p in parts
    ]


def _l2_scales(parts: list[tuple[Array, ...]], max_norm: float) -> Array:
    """Each row's ``min(1, max_norm / |row|)``, the row's parts joined (an outer part's
    norm the product of its factors' norms), with no square that underflows or overflows:
    each factor's rows are divided by ``2^e``, ``e`` the exponent of their largest
    magnitude (exact, but for elements below ``2^(e - 1022)``), so that their squares sum
    to between 1/4 and the row's width, and the exponents are added as integers. The same
    passes whatever the values: no branch."""
    exponents, squares = [], []
    for part in parts:
        e_part = np.zeros(part[0].shape[0], dtype=np.int64)
        s_part = np.ones(part[0].shape[0])
        for f in part:
            largest = np.maximum(f.max(axis=1, initial=0.0), -f.min(axis=1, initial=0.0))
            e = np.frexp(largest)[1].astype(np.int64)  # largest < 2^e (0 for a zero row)
            scaled = np.ldexp(f, -e[:, None])
            e_part += e
            s_part *= np.einsum("ij,ij->i", scaled, scaled)
        # a zero row of a part takes no part in the row's exponent: its factor's exponent
        # is 0 (a zero g times an x of 1e300 gave 997, every other part's squares then
        # underflowed next to it and the row was not clipped)
        exponents.append(select(s_part > 0, e_part, _NO_EXPONENT, np.int64))
        squares.append(s_part)
    top = functools.reduce(np.maximum, exponents)
    total = sum(np.ldexp(s, 2 * (e - top)) for e, s in zip(exponents, squares, strict=True))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # |row| = 2^top sqrt(total): min(1, (max_norm 2^-top) / sqrt(total)); fmin takes 1
        # over a zero row's 0 / 0, and an underflowed numerator scales a row of norm beyond
        # max_norm 2^1074 to 0
        return np.asarray(np.fmin(np.ldexp(max_norm, -top) / np.sqrt(total), 1.0))

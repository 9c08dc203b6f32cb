"""Counting distinct values: ``count_distinct(x[, index]; groups)``.

How many distinct values ``x``'s elements hold (``np.unique(x).size``), or with a group index
per element and ``groups`` G, how many each group's elements hold (one count per group; an
index outside ``[0, G)`` is in no group). Values are equal as ``==`` says (``0.0`` and
``-0.0`` are one value), except that every NaN is the same value, as ``np.unique`` counts
them (pandas' ``nunique()`` drops NaN, ``nunique(dropna=False)`` counts it once, as here;
``torch.unique`` keeps every NaN apart). The result is int64 whatever ``x``'s dtype.

``torch.unique(x)`` has a shape that depends on the values, so the SDK cannot record it;
``sdk.count_distinct(x)`` and the query builder's ``count_distinct(column)`` record this prim.
One subject can move the count by at most the number of elements it changes
(``dpnode.core.privacy.rules.distinct``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpnode.core.engine.dtypes import INT64
from dpnode.core.engine.prims.registry import Array, AttrSpec, Call, TensorMeta, prim

#: most groups counted at once (as many as a grouped quantile selects for)
MAX_GROUPS = 1000


def _infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    groups = c.attr("groups")
    has_index = len(c.args) > 1 and c.args[1] is not None
    if groups < 0 or groups > MAX_GROUPS:
        raise c.fail(f"groups must be in [0, {MAX_GROUPS}], got {groups}", "groups")
    if has_index != (groups > 0):
        raise c.fail("a group index (argument 1) goes with groups > 0, and only then", "groups")
    if not has_index:
        return TensorMeta((), INT64)
    index = c.tensor(1)
    if not index.dtype.is_int or index.numel != x.numel:
        raise c.fail(
            f"the group index must be integers, one per element ({x.numel}), got "
            f"{index.dtype.name} with {index.numel}",
            1,
        )
    return TensorMeta((groups,), INT64)


def _flops(c: Call) -> int:
    n = c.tensor(0).numel
    return n * max(int(math.log2(max(n, 2))), 1) + c.out().numel + 1


def _workspace(c: Call) -> int:
    # the order, the sorted values and groups, the masks (8 bytes each, at most)
    return 5 * 8 * c.tensor(0).numel


@prim(
    "count_distinct",
    privacy="rule",
    args=(1, 2),
    optional_args=frozenset({1}),
    attrs={"groups": AttrSpec("int", optional=True, default=0)},
    infer=_infer,
    flops=_flops,
    workspace=_workspace,
)
def _count_distinct(c: Call, args: list[Any], out: Array | None) -> Array:
    """The number of distinct values of all of ``x``'s elements (NaN: one value); with
    ``groups`` G and a group index per element, of each group's elements."""
    flat = np.asarray(args[0]).reshape(-1)
    if flat.dtype.kind == "V":  # bfloat16: float32 holds it exactly
        flat = flat.astype(np.float32)
    groups = c.attr("groups")
    if not groups:
        return np.asarray(distinct_per_group(flat, np.zeros(flat.size, np.int64), 1)[0])
    index = np.asarray(args[1]).reshape(-1).astype(np.int64)
    return distinct_per_group(flat, index, groups)


def distinct_per_group(values: Array, groups: Array, count: int) -> Array:
    """Distinct values per group ``0 .. count - 1`` (other groups count nowhere), int64.

    >>> distinct_per_group(np.array([1.0, 1.0, np.nan, np.nan, -0.0, 0.0]), np.zeros(6, int), 1)
    array([3])
    >>> distinct_per_group(np.array([5, 5, 5, 7]), np.array([0, 1, 1, 9]), 3)
    array([1, 1, 0])
    """
    inside = (groups >= 0) & (groups < count)
    v, g = values[inside], groups[inside]
    order = np.lexsort((v, g))  # by group, then value (NaN last within a group)
    v, g = v[order], g[order]
    same = v[1:] == v[:-1]
    if v.dtype.kind == "f":
        same |= np.isnan(v[1:]) & np.isnan(v[:-1])
    first = np.ones(v.size, dtype=bool)
    first[1:] = (g[1:] != g[:-1]) | ~same
    return np.bincount(g[first], minlength=count).astype(np.int64)


def _key_counts_infer(c: Call) -> TensorMeta:
    x = c.tensor(0)
    if len(x.shape) != 1:
        raise c.fail(f"key_counts takes one key per row, a 1-D tensor, got shape {x.shape}", 0)
    return TensorMeta((x.shape[0], 2), INT64)


@prim(
    "key_counts",
    privacy="rule",
    args=1,
    infer=_key_counts_infer,
    flops=_flops,
    workspace=_workspace,
)
def _key_counts(c: Call, args: list[Any], out: Array | None) -> Array:
    """The distinct values of ``x`` (one key per row) with how many rows hold each, sorted by
    key, one ``(key, count)`` row each, then ``(0, 0)`` rows up to ``x``'s length: a shape
    that does not depend on the values.

    On private data it is only ever a publish's output, released above a noisy threshold
    (``dpnode.core.dp.keysets``), of integer keys only.
    """
    x = np.asarray(args[0]).reshape(-1)
    result = np.zeros((x.size, 2), dtype=np.int64)
    keys, counts = np.unique(x, return_counts=True)
    result[: keys.size, 0] = keys
    result[: keys.size, 1] = counts
    return result

"""dpnode's side: each statistic as an analyst writes it, one publish a release.

The one-key rows are torch code on remote tensors (``(age > 50).sum()``, ``bmi.var()``,
``torch.quantile``, ``torch.cov``, ``torch.corrcoef``); the group-by, filter, share,
distinct-count, top-k and describe rows use the query builder (``ds.query()...``,
``ds.describe``). Each function returns a release: a call that publishes once and gives the
row's value as a NumPy array, in the order of the keys the table declares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dpnode import sdk

Release = Callable[[], np.ndarray]
#: a filter: (column, operator, public constant); "isin" takes a list
Predicate = tuple[str, str, Any]


def key(value: Any) -> str:
    """A group key as text, whether it came back as a name, an integer or an integral float.

    >>> key(3), key(3.0), key(np.int64(3)), key("male")
    ('3', '3', '3', 'male')
    """
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    return str(value)


def torch_release(
    ds: Any, make: Callable[[Any], torch.Tensor], epsilon: float, delta: float | None = None
) -> Release:
    """``make(ds)`` published: the torch code runs again for every release (recording its
    graph is part of a release's time)."""
    return lambda: make(ds).publish(epsilon=epsilon, delta=delta).numpy()


def stacked(ds: Any, columns: Sequence[str]) -> torch.Tensor:
    """The columns as the rows of one ``(k, n)`` float tensor, as ``torch.cov`` takes them."""
    return torch.stack([ds[c].double() for c in columns])


def group_means(ds: Any, key_column: str, column: str, keys: list[Any], epsilon: float) -> Release:
    def release() -> np.ndarray:
        means = ds.groupby(key_column).mean(column, epsilon=epsilon)
        by_key = {key(k): v for k, v in means.items()}
        return np.array([by_key[key(k)] for k in keys])

    return release


def regression(
    ds: Any,
    features: Sequence[str],
    target: str,
    bounds: dict[str, tuple[float, float]],
    epsilon: float,
    delta: float,
) -> Release:
    """``sdk.linear_regression`` of the target on the features, all scaled by their upper
    bounds: ``(coefficients, intercept)``."""

    def release() -> np.ndarray:
        x = torch.stack([ds[c] / bounds[c][1] for c in features], dim=1)
        y = ds[target] / bounds[target][1]
        model = sdk.linear_regression(x, y, epsilon=epsilon, delta=delta)
        return np.r_[model.coef.numpy(), model.intercept]

    return release


def _condition(predicate: Predicate) -> Any:
    from dpnode.sdk.query import col

    column, op, value = predicate
    c = col(column)
    conditions = {
        ">": lambda: c > value,
        ">=": lambda: c >= value,
        "<": lambda: c < value,
        "<=": lambda: c <= value,
        "==": lambda: c == value,
        "isin": lambda: c.isin(list(value)),
    }
    return conditions[op]()


def aggregate(
    ds: Any, make: Callable[[], Any], epsilon: float, where: Predicate | None = None
) -> Release:
    """``ds.query()[.filter(where)].agg(make())``: its one value."""

    def release() -> np.ndarray:
        query = ds.query() if where is None else ds.query().filter(_condition(where))
        frame = query.agg(make().alias("value")).publish(epsilon=epsilon).frame
        return np.array(float(frame["value"].iloc[0]))

    return release


def share(ds: Any, predicate: Predicate, epsilon: float) -> Release:
    """The share of rows that satisfy the predicate: their count over the public row count."""
    from dpnode.sdk.query import count

    counted = aggregate(ds, count, epsilon, where=predicate)
    return lambda: counted() / ds.row_count


def grouped(
    ds: Any,
    by: Sequence[str],
    aggregates: Callable[[], list[Any]],
    names: Sequence[str],
    keys: list[tuple[Any, ...]],
    epsilon: float,
) -> Release:
    """``ds.query().group_by(*by).agg(*aggregates())``: each output named in ``names``, in the
    order of ``keys`` (one tuple of key values a group), concatenated output after output."""

    def release() -> np.ndarray:
        frame = ds.query().group_by(*by).agg(*aggregates()).publish(epsilon=epsilon).frame
        rows = {tuple(key(frame[b].iloc[i]) for b in by): i for i in range(len(frame))}
        at = [rows[tuple(key(v) for v in k)] for k in keys]
        return np.concatenate([frame[name].to_numpy(dtype=float)[at] for name in names])

    return release


def top_k(ds: Any, by: str, k: int, keys: list[Any], epsilon: float) -> Release:
    """The ``k`` commonest groups as indices into ``keys``, commonest first (by the released
    counts when the result carries them, else in the result's order)."""
    codes = {key(v): i for i, v in enumerate(keys)}

    def release() -> np.ndarray:
        frame = ds.query().group_by(by).top_k(k).publish(epsilon=epsilon).frame
        if "count" in frame:
            frame = frame.sort_values("count", ascending=False, kind="stable")
        return np.array([codes[key(v)] for v in frame[by]])

    return release


#: describe's statistics after its count, in pandas' order (OpenDP's side matches it)
DESCRIBE = ("mean", "std", "min", "25%", "50%", "75%", "max")


def describe(ds: Any, columns: Sequence[str], epsilon: float) -> Release:
    """``ds.describe(epsilon=, columns=)`` as a ``(statistics, columns)`` array in
    :data:`DESCRIBE`'s order (the result has a row per column, named in its first column);
    the same columns as OpenDP's side describes, so that both share epsilon among as many."""

    def release() -> np.ndarray:
        frame = ds.describe(epsilon=epsilon, columns=list(columns)).frame
        frame = frame.set_index(frame.columns[0])
        return np.array([[float(frame.loc[c, s]) for c in columns] for s in DESCRIBE])

    return release


def discovered_keys(ds: Any, column: str, epsilon: float, delta: float) -> Release:
    """``ds.query().group_by(column).discover_keys(epsilon=, delta=)``: the keys released
    above the threshold as ``(key, noisy count)`` rows, sorted by key."""

    def release() -> np.ndarray:
        found = ds.query().group_by(column).discover_keys(epsilon=epsilon, delta=delta)
        pairs = [(float(k[0]), float(c)) for k, c in zip(found.keys, found.counts, strict=True)]
        return np.array(pairs, dtype=np.float64).reshape(-1, 2)

    return release

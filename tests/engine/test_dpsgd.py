"""The ``clip_by_subject_norm`` prim: kernel against a per-group loop, shapes, dtypes, refusals."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpnode.core.engine import GraphBuilder, Quotas, evaluate, plan
from dpnode.core.errors import GraphError, QuotaExceededError


def reference(x: Any, groups: Any, bound: float) -> Any:
    """The contract, written as plainly as possible: one Python loop over the groups."""
    x = np.asarray(x, dtype=np.float64)
    total = np.zeros(x.shape[1:])
    for g in np.unique(groups):
        v = x[groups == g].sum(axis=0)
        norm = np.sqrt((v**2).sum())
        total += v * min(1.0, bound / norm) if norm > 0 else v
    return total


def clip(x: Any, groups: Any, bound: float, *, x_dtype: str | None = None) -> Any:
    b = GraphBuilder()
    xi = b.input("x", x_dtype or str(x.dtype), x.shape)
    gi = b.input("g", str(groups.dtype), groups.shape)
    graph = b.build([b.op("clip_by_subject_norm", xi, gi, max_norm=bound)])
    return evaluate(graph, {"x": x, "g": groups})[0]


@pytest.mark.parametrize(
    "shape", [(40, 7), (25, 3, 4), (9,), (1, 5), (300, 6)]
)  # 300: blocks of rows
@pytest.mark.parametrize("groups_of", ["rows", "few", "shuffled", "one"])
def test_kernel_matches_the_per_group_loop(
    rng: np.random.Generator, shape: tuple[int, ...], groups_of: str
) -> None:
    n = shape[0]
    x = rng.normal(0, 1, shape)
    groups = {
        "rows": np.arange(n),
        "few": np.repeat(np.arange(n), 3)[:n],
        "shuffled": rng.integers(0, max(n // 3, 1), n),
        "one": np.zeros(n, dtype=np.int64),
    }[groups_of].astype(np.int64)
    for bound in (0.1, 1.0, 1e6):  # mostly clipped, mixed, never clipped
        out = clip(x, groups, bound)
        assert out.shape == shape[1:] and out.dtype == np.float64
        np.testing.assert_allclose(out, reference(x, groups, bound), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("width", [2, 24, 300])  # a block: 16384, 1365 and 128 rows
@pytest.mark.parametrize("order", [1, 2])
def test_rows_of_any_width_over_several_blocks_are_each_clipped_once(
    rng: np.random.Generator, width: int, order: int
) -> None:
    """Every row its own group, more rows than a block holds (a narrow row's blocks hold
    more rows than a wide one's): each row clipped once, the clipped rows summed."""
    n = 40_000 if width == 2 else 3_000
    x = rng.normal(0, 1, (n, width))
    norms = np.linalg.norm(x, ord=order, axis=1, keepdims=True)
    b = GraphBuilder()
    xi, gi = b.input("x", "float64", x.shape), b.input("g", "int64", (n,))
    for bound in (0.1, 1e6):
        graph = b.build([b.op("clip_by_subject_norm", xi, gi, max_norm=bound, ord=order)])
        out = evaluate(graph, {"x": x, "g": np.arange(n, dtype=np.int64)})[0]
        want = (x * np.minimum(1.0, bound / norms)).sum(axis=0)
        np.testing.assert_allclose(out, want, rtol=1e-9, atol=1e-9 * bound)


def test_each_clipped_group_has_norm_at_most_the_bound(rng: np.random.Generator) -> None:
    x = rng.normal(0, 10, (30, 6))
    for i in range(30):  # one group at a time: the output is that group's clipped sum
        groups = np.where(np.arange(30) == i, 0, -1).astype(np.int64)
        only = clip(x * (groups == 0)[:, None], groups, 0.5)
        assert np.linalg.norm(only) <= 0.5 * (1 + 1e-12)


def test_zero_rows_stay_zero_and_small_rows_are_untouched() -> None:
    x = np.array([[0.0, 0.0], [0.3, 0.4], [3.0, 4.0]])
    out = clip(x, np.arange(3, dtype=np.int64), 1.0)
    np.testing.assert_allclose(out, [0.3 + 0.6, 0.4 + 0.8])


def test_dtypes_follow_x(rng: np.random.Generator) -> None:
    x = rng.normal(0, 1, (12, 3))
    groups = np.arange(12, dtype=np.int32)
    for name, rtol in [("float32", 1e-6), ("float16", 2e-3), ("bfloat16", 2e-2), ("float64", 0)]:
        xd = x.astype(ml_dtypes.bfloat16 if name == "bfloat16" else name)
        out = clip(xd, groups, 1.0)
        assert str(out.dtype) == name
        want = reference(xd.astype(np.float64), groups, 1.0)
        np.testing.assert_allclose(out.astype(np.float64), want, rtol=rtol, atol=1e-12)


def test_empty_input_gives_zeros() -> None:
    out = clip(np.zeros((0, 4)), np.zeros(0, dtype=np.int64), 1.0)
    assert out.shape == (4,) and not out.any()


@pytest.mark.parametrize(
    ("x_dtype", "x_shape", "g_dtype", "g_shape", "bound", "message"),
    [
        ("float64", (5, 2), "int64", (5,), 0.0, "max_norm must be finite and positive"),
        ("float64", (5, 2), "int64", (5,), -1.0, "max_norm must be finite and positive"),
        ("int64", (5, 2), "int64", (5,), 1.0, "x must be floating point"),
        ("float64", (), "int64", (1,), 1.0, "row dimension"),
        ("float64", (5, 2), "float64", (5,), 1.0, "groups must be an integer tensor"),
        ("float64", (5, 2), "bool", (5,), 1.0, "groups must be an integer tensor"),
        ("float64", (5, 2), "int64", (4,), 1.0, "one entry per row"),
        ("float64", (5, 2), "int64", (5, 1), 1.0, "one entry per row"),
    ],
)
def test_bad_calls_are_refused_before_running(
    x_dtype: str,
    x_shape: tuple[int, ...],
    g_dtype: str,
    g_shape: tuple[int, ...],
    bound: float,
    message: str,
) -> None:
    b = GraphBuilder()
    x = b.input("x", x_dtype, x_shape)
    g = b.input("g", g_dtype, g_shape)
    with pytest.raises(GraphError, match=message):
        plan(b.build([b.op("clip_by_subject_norm", x, g, max_norm=bound)]))


def test_non_finite_max_norm_and_missing_attr_are_refused() -> None:
    for attrs in ({"max_norm": float("inf")}, {}):
        b = GraphBuilder()
        x = b.input("x", "float64", (3, 2))
        g = b.input("g", "int64", (3,))
        with pytest.raises(GraphError, match="max_norm"):
            plan(b.build([b.op("clip_by_subject_norm", x, g, **attrs)]))


def test_cost_counts_in_the_quotas() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (1000, 100))
    g = b.input("g", "int64", (1000,))
    graph = b.build([b.op("clip_by_subject_norm", x, g, max_norm=1.0)])
    assert plan(graph, Quotas(max_flops=10**6)) is not None
    with pytest.raises(QuotaExceededError, match="clip_by_subject_norm"):
        plan(graph, Quotas(max_flops=10**5))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 30),
    f=st.integers(1, 6),
    labels=st.integers(1, 10),
    bound=st.floats(1e-3, 10.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_kernel_matches_the_loop_for_any_grouping(
    n: int, f: int, labels: int, bound: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 3, (n, f))
    groups = rng.integers(-labels, labels, n).astype(np.int64)  # negative ids are fine too
    np.testing.assert_allclose(
        clip(x, groups, bound), reference(x, groups, bound), rtol=1e-10, atol=1e-10
    )


def clip_outer(g: Any, x: Any, bias: Any, groups: Any, bound: float, **attrs: Any) -> Any:
    """``clip_by_subject_norm`` of an outer part given by its factors and a plain part."""
    b = GraphBuilder()
    gi, xi, bi = (b.input(k, str(v.dtype), v.shape) for k, v in (("g", g), ("x", x), ("b", bias)))
    si = b.input("s", "int64", groups.shape)
    out = b.op("clip_by_subject_norm", gi, xi, bi, si, max_norm=bound, outer=[1, 0], **attrs)
    return evaluate(b.build([out]), {"g": g, "x": x, "b": bias, "s": groups})[0]


@pytest.mark.parametrize("n", [1, 40, 300])  # 300: blocks of rows
@pytest.mark.parametrize("groups_of", ["rows", "few", "one"])
@pytest.mark.parametrize("order", [2, 1])
def test_an_outer_part_is_clipped_as_the_rows_it_stands_for(
    rng: np.random.Generator, n: int, groups_of: str, order: int
) -> None:
    """Factors ``g [n, p]``, ``x [n, q]`` flagged ``outer`` give what the built rows
    ``g[i] (x) x[i]`` (flattened, then the plain part joined) give, as the plain loop says."""
    g, x, bias = rng.normal(0, 1, (n, 3)), rng.normal(0, 2, (n, 4)), rng.normal(0, 1, (n, 2))
    groups = {
        "rows": np.arange(n),
        "few": np.repeat(np.arange(n), 3)[:n],
        "one": np.zeros(n),
    }[groups_of].astype(np.int64)
    rows = np.concatenate([(g[:, :, None] * x[:, None, :]).reshape(n, 12), bias], axis=1)
    for bound in (0.1, 1.0, 1e6):
        got = clip_outer(g, x, bias, groups, bound, ord=order)
        if order == 2:
            want = reference(rows, groups, bound)
        else:
            sums = np.stack([rows[groups == s].sum(0) for s in np.unique(groups)])
            want = (sums * np.minimum(1.0, bound / np.abs(sums).sum(1, keepdims=True))).sum(0)
        assert got.shape == (14,)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("shapes", "outer", "message"),
    [
        (((5, 3), (5, 4)), [1, 1], "outer must flag each part"),
        (((5, 3), (5, 4)), [2], "outer must flag each part"),
        (((5, 3), (5, 4)), [1, 0], "outer must flag each part"),
        (((5, 3, 1), (5, 4)), [1], r"factors must be \[n, p\] and \[n, q\]"),
        (((5, 3), (4, 4)), [1], r"factors must be \[n, p\] and \[n, q\]"),
    ],
)
def test_bad_outer_parts_are_refused_before_running(
    shapes: tuple[tuple[int, ...], ...], outer: list[int], message: str
) -> None:
    b = GraphBuilder()
    args = [b.input(f"a{i}", "float64", s) for i, s in enumerate(shapes)]
    groups = b.input("s", "int64", (5,))
    with pytest.raises(GraphError, match=message):
        plan(b.build([b.op("clip_by_subject_norm", *args, groups, max_norm=1.0, outer=outer)]))


def _norm(v: Any) -> Fraction:
    """The Euclidean norm of ``v``'s float64 values, to a relative 1e-15 whatever their
    magnitudes (``math.hypot`` scales; no square underflows or overflows)."""
    return Fraction(math.hypot(*np.asarray(v, dtype=np.float64).ravel().tolist()))


@settings(max_examples=300, deadline=None)
@given(
    dtype=st.sampled_from(["float64", "float32"]),
    exponents=st.tuples(*[st.floats(0, 1)] * 3),
    zeros=st.tuples(*[st.booleans()] * 3),
    e_c=st.integers(-290, 300),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_row_is_clipped_to_the_bound_at_any_magnitude(
    dtype: str, exponents: tuple[float, ...], zeros: tuple[bool, ...], e_c: int, seed: int
) -> None:
    """One row (its own group) of an outer part ``g (x) x`` and a plain part, each factor at
    its own magnitude (anywhere in its dtype's range), and a bound at another: the clipped
    row's norm is at most the bound. Its norm came from squares: a float64 ``g`` of 1e-170
    squared to 0 and an ``x`` of 1e170 to infinity, their product was NaN, and the row (one
    subject's data) was not clipped. A factor may be zero: a zero g's exponent was taken as
    0, so a zero g times an x of 1e300 outweighed the other parts, which went unclipped."""
    rng = np.random.default_rng(seed)
    low, high = (-300, 300) if dtype == "float64" else (-44, 38)
    e_g, e_x, e_b = (round(low + f * (high - low)) for f in exponents)
    g, x, bias = (
        (rng.uniform(-1, 1, (1, k)) * 10.0**e * (not zero)).astype(dtype)
        for k, e, zero in zip((3, 4, 2), (e_g, e_x, e_b), zeros, strict=True)
    )
    bound = 10.0 ** (e_c if dtype == "float64" else min(e_c, 37))  # (a float32 output's range)
    got = clip_outer(g, x, bias, np.zeros(1, dtype=np.int64), bound)
    assert np.isfinite(got).all()
    norm = _norm(got)
    assert norm <= Fraction(bound) * (1 + Fraction(1, 10**6)) + Fraction(1e-290), (norm, bound)
    row = _norm(g) * _norm(x), _norm(bias)
    whole = row[0] ** 2 + row[1] ** 2
    if dtype == "float64" and max(abs(e_g), abs(e_x), abs(e_b), abs(e_c)) <= 100:
        if whole <= Fraction(bound) ** 2 * (1 - Fraction(1, 10**6)):  # untouched
            want = np.concatenate([(g[0][:, None] * x[0][None, :]).ravel(), bias[0]])
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
        elif whole >= Fraction(bound) ** 2 * (1 + Fraction(1, 10**6)):  # on the sphere
            assert norm >= Fraction(bound) * (1 - Fraction(1, 10**9)) - Fraction(1e-290)

"""Subnormal numbers never reach the engine's arithmetic on private values, where they would
make an answered publish's time count the rows a private predicate holds for.

Results that would be subnormal are flushed to zero while the engine evaluates (and only
then), constants arrive flushed, and the tracker's rounding model counts the flush. The time
itself is measured by ``bench/side_channels.py`` (tests assert behaviour, not time).
"""

from __future__ import annotations

import platform
import threading

import numpy as np
import pytest

from dpnode.core.engine import GraphBuilder, encode, evaluate, plan, run, subnormals
from dpnode.core.engine.wire import decode
from dpnode.core.privacy import InputSpec, track

TINY = np.finfo(np.float64).smallest_normal


def _subnormal_product() -> np.ndarray:
    return np.full(8, 1e-300) * 1e-20  # 1e-320: subnormal under IEEE gradual underflow


def test_the_mode_is_available_on_the_platforms_the_node_ships_for() -> None:
    if platform.system() == "Linux" and platform.machine() == "x86_64":
        assert subnormals.SUPPORTED
    if not subnormals.SUPPORTED:
        pytest.skip("this platform cannot flush subnormal results")


@pytest.mark.skipif(not subnormals.SUPPORTED, reason="no flush-to-zero mode here")
def test_results_flush_inside_only_on_the_thread_and_nested_exits_restore() -> None:
    assert np.all(_subnormal_product() > 0)
    seen_elsewhere: list[bool] = []
    go, done = threading.Event(), threading.Event()

    def elsewhere() -> None:  # a thread already running, as a server's are
        go.wait()
        seen_elsewhere.append(bool(np.all(_subnormal_product() > 0)))
        done.set()

    other = threading.Thread(target=elsewhere)
    other.start()
    with subnormals.flushing():
        assert np.all(_subnormal_product() == 0)
        go.set()
        done.wait(10)
        with subnormals.flushing():
            assert np.all(_subnormal_product() == 0)
        assert np.all(_subnormal_product() == 0)  # the inner exit keeps the outer mode
    other.join()
    assert seen_elsewhere == [True]  # another thread computes as before
    assert np.all(_subnormal_product() > 0)
    with pytest.raises(RuntimeError), subnormals.flushing():
        raise RuntimeError("an evaluation failed")
    assert np.all(_subnormal_product() > 0)


def _chain(rows: int) -> tuple[object, dict[str, np.ndarray]]:
    b = GraphBuilder()
    x = b.input("x", "float64", (rows,))
    tiny = b.op("mul", b.op("mul", x, 1e-300), 1e-15)
    return b.build([tiny, b.op("sum", tiny)]), {"x": np.full(rows, 0.5)}


@pytest.mark.skipif(not subnormals.SUPPORTED, reason="no flush-to-zero mode here")
def test_the_engine_never_computes_a_subnormal_and_leaves_the_mode_as_it_found_it() -> None:
    graph, inputs = _chain(64)
    values, total = evaluate(graph, inputs)
    assert np.all(values == 0) and total == 0
    assert np.all(_subnormal_product() > 0)  # not left on for the noise or the tracker


@pytest.mark.skipif(not subnormals.SUPPORTED, reason="no flush-to-zero mode here")
def test_block_evaluation_flushes_too() -> None:
    """A plan that only sums over its rows runs block by block (the node's path for large
    columns, and a Dask worker's): its kernels run in the mode as well."""
    b = GraphBuilder()
    x = b.input("x", "float64", (10_000,))
    graph = b.build([b.op("sum", b.op("mul", b.op("mul", x, 1e-300), 1e-15))])
    planned = plan(graph, accurate=True)
    assert planned.blocks is not None
    out = run(planned, {"x": np.full(10_000, 0.5)}, block_elements=512).outputs
    assert out[0] == 0
    assert np.all(_subnormal_product() > 0)


def test_constants_arrive_flushed_and_read_only() -> None:
    b = GraphBuilder()
    x = b.input("x", "float64", (3,))
    c = b.constant(np.array([1e-310, -5e-324, 0.25]))
    c32 = b.constant(np.array([1e-40, 3.0], dtype=np.float32))
    graph = decode(encode(b.build([b.op("mul", x, c), c32])))
    values = [n.value for n in graph.nodes if n.op == "constant"]
    assert values[0].tolist() == [0.0, 0.0, 0.25] and values[1].tolist() == [0.0, 3.0]
    assert not values[0].flags.writeable and not values[1].flags.writeable
    b = GraphBuilder()
    plain = b.constant(np.array([0.5, 2.0]))  # nothing to flush: the buffer's own view
    kept = [n.value for n in decode(encode(b.build([plain]))).nodes if n.op == "constant"]
    assert kept[0].tolist() == [0.5, 2.0] and not kept[0].flags.writeable


def test_flush_keeps_other_values_and_dtypes() -> None:
    a = np.array([1e-310, -1e-310, 1e-300, -2.0, 0.0, np.inf, np.nan])
    out = subnormals.flush(a)
    assert out is not a and a[0] == 1e-310  # a copy: the caller's array is kept
    assert out[:2].tolist() == [0.0, 0.0] and np.signbit(out[1])
    np.testing.assert_array_equal(out[2:], a[2:])
    normal = np.array([1.0, 2.0])
    assert subnormals.flush(normal) is normal
    ints = np.array([0, 1], dtype=np.int64)
    assert subnormals.flush(ints) is ints
    scalar = np.array(-1e-310)  # a 0-d constant, as a graph's scalars are
    assert subnormals.flush(scalar).tolist() == 0.0 and subnormals.flush(np.array(3.0)) == 3.0


@pytest.mark.skipif(not subnormals.SUPPORTED, reason="no flush-to-zero mode here")
def test_the_tracked_bounds_hold_for_flushed_results() -> None:
    """``(x * 2^-1023) * 2^1023`` is ``x`` in exact arithmetic and under gradual underflow,
    and 0 when the first product flushes. The tracker's bounds of the computed value must
    hold 0: a rounding may err by the smallest normal, not the smallest subnormal (with
    which the bounds were [0.5, 1] and the computed 0 lay outside them)."""
    b = GraphBuilder()
    x = b.input("x", "float64", (4,))
    y = b.op("mul", b.op("mul", x, 2.0**-1023), 2.0**1023)
    graph = b.build([y])
    out = track(graph, {"x": InputSpec.private(0.5, 1.0)}).outputs[0]
    (computed,) = evaluate(graph, {"x": np.array([0.5, 0.6, 0.9, 1.0])})
    assert np.all(computed == 0)
    assert np.all(out.lower <= computed) and np.all(computed <= out.upper)
    assert float(np.min(out.lower)) <= 0.0 < TINY


@pytest.mark.skipif(not subnormals.SUPPORTED, reason="no flush-to-zero mode here")
def test_the_tracker_computes_public_values_as_the_engine_does() -> None:
    """``(1e-300 * 1e-20) * 1e300`` is public: the tracker computes it itself and treats it
    as exact. Under gradual underflow it is 1e-20, in the engine 0: the tracker must compute
    it in the engine's mode, or ``x * p`` is bounded in [5e-21, 1e-20] and computed as 0."""
    b = GraphBuilder()
    x = b.input("x", "float64", (4,))
    p = b.op("mul", b.op("mul", b.constant(np.array(1e-300)), 1e-20), 1e300)
    graph = b.build([b.op("mul", x, p)])
    out = track(graph, {"x": InputSpec.private(0.5, 1.0)}).outputs[0]
    (computed,) = evaluate(graph, {"x": np.array([0.5, 0.6, 0.9, 1.0])})
    assert np.all(computed == 0)
    assert np.all(out.lower <= computed) and np.all(computed <= out.upper)


@pytest.mark.skipif(not subnormals.SUPPORTED, reason="no flush-to-zero mode here")
def test_a_sum_whose_partial_sums_flush_is_covered_by_its_sensitivity() -> None:
    """Adding subnormal values is exact under gradual underflow; flushed, every partial sum
    below the smallest normal is lost. Replacing one row of ``[2^-1023] * 3`` by 0 moves
    the exact sum by 2^-1023 and the computed one by three times that (the rest flushes):
    each addition may err by the smallest normal, and an L2 rounding that small must not
    vanish in its square (it was reported as 0, found by the attack test)."""
    b = GraphBuilder()
    x = b.input("x", "float64", (3, 1))
    graph = b.build([b.op("sum", x)])
    half = 2.0**-1023
    out = track(graph, {"x": InputSpec.private(0.0, half)}).outputs[0]
    (one,) = evaluate(graph, {"x": np.full((3, 1), half)})
    (two,) = evaluate(graph, {"x": np.array([[0.0], [half], [half]])})
    moved = abs(float(one) - float(two))
    assert moved > half  # the flush made it move further than in exact arithmetic
    assert moved <= out.l2 and moved <= out.l1

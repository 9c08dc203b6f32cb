"""Best-of timings shared by the benchmarks (the box is shared: the best run is the signal)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


def best(fn: Callable[[], Any], repeat: int, number: int = 1) -> float:
    """Best of ``repeat`` timings in seconds per call, each of ``number`` calls, after a warm-up."""
    fn()  # plans, tables and caches are built by the first call
    fastest = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        fastest = min(fastest, (time.perf_counter() - start) / number)
    return fastest


def interleaved_best(fns: Sequence[Callable[[], Any]], repeat: int) -> list[float]:
    """Best time of each function, taking turns so that load drift hits them alike."""
    for fn in fns:
        fn()
    fastest = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            fastest[i] = min(fastest[i], time.perf_counter() - start)
    return fastest

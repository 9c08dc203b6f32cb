"""Noised values per second: dpnode's mechanisms against NumPy's (unsafe) Laplace and OpenDP.

    python -m bench.noise [--n 1000000] [--opendp-n 10000] [--repeat 9]

Every number is measured in this run and printed as a ratio against NumPy's own
``Generator.laplace`` plus the addition (a float-based mechanism that Mironov 2012 shows leaks
through its low-order bits: the speed baseline, not a safe choice). OpenDP's vector Laplace is
timed on fewer values (it takes about a hundred microseconds per value) and reported per value.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import best, interleaved_best
from dpnode.core.dp import gaussian, laplace


def opendp_seconds_per_value(n: int) -> float | None:
    try:
        import opendp.prelude as dp
    except ImportError:
        return None
    dp.enable_features("contrib")
    measurement = dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float), scale=1.0
    )
    x = np.random.default_rng(1).random(n).tolist()
    return best(lambda: measurement(x), 1) / n


def report(n: int = 1_000_000, opendp_n: int = 10_000, repeat: int = 9) -> None:
    """Print noised values per second against NumPy's laplace and OpenDP (also bench/publish)."""
    x = np.random.default_rng(0).random(n) * 100.0
    rng = np.random.default_rng()

    cases: list[tuple[str, Callable[[], object]]] = [
        ("numpy laplace + add (unsafe)", lambda: x + rng.laplace(0.0, 1.0, n)),
        ("dpnode laplace, L1 vector", lambda: laplace(x, sensitivity_l1=1.0, epsilon=1.0)),
        ("dpnode gaussian, L2 vector", lambda: gaussian(x, sensitivity_l2=1.0, rho=0.5)),
        (
            "dpnode laplace, os.urandom words",
            lambda: laplace(x, sensitivity_l1=1.0, epsilon=1.0, source="os"),
        ),
        ("numpy normal + add (unsafe)", lambda: x + rng.normal(0.0, 1.0, n)),
    ]
    print(f"n = {n:,} values per release, best of {repeat}, cases interleaved")
    timings = interleaved_best([fn for _, fn in cases], repeat)
    baseline = timings[0]
    for (name, _), seconds in zip(cases, timings, strict=True):
        print(
            f"  {name:34s} {seconds * 1e3:9.1f} ms  {n / seconds / 1e6:8.2f} M values/s"
            f"  {seconds / baseline:6.2f}x numpy laplace"
        )
    per_value = opendp_seconds_per_value(opendp_n)
    if per_value is None:
        print("  opendp: not installed")
        return
    dpnode = timings[1]
    print(
        f"  {'opendp vector laplace':34s} {per_value * n * 1e3:9.1f} ms* "
        f"{1 / per_value / 1e6:8.2f} M values/s  {per_value * n / baseline:6.2f}x numpy laplace"
        f"  (* from {opendp_n:,} values)"
    )
    print(f"  dpnode laplace is {per_value * n / dpnode:.0f}x faster than opendp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="values per release")
    parser.add_argument("--opendp-n", type=int, default=10_000, help="values for OpenDP")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    report(args.n, args.opendp_n, args.repeat)


if __name__ == "__main__":
    main()

"""What an answered publish's time shows about a private predicate, before and after.

    python -m bench.side_channels [--rows 2000000] [--chain 40] [--repeat 7] [--node]
    python -m bench.side_channels --kernels [--rows 1000000]

Two graphs an analyst could send to learn how many rows lie above ``t`` from the time of a
publish alone (its released mean is noised as any other):

- *subnormals*: ``mean(where(x > t, x * 1e-309, x) / c / c / ...)`` (``--chain``
  divisions), slower the more rows hold a subnormal value, unless results are flushed to zero
  (``dpnode.core.engine.subnormals``);
- *a choice*: ``mean(where(x > t, x, 0))``, whose ``np.where`` branches on each element and
  is slowest when the condition is a random half, unless the choice blends bits
  (``dpnode.core.engine.constant_time``).

For thresholds with no row, half the rows and every row above them (the rows in random
order), the best evaluation time of ``--repeat`` runs, interleaved: by the engine as the
node evaluates a publish, and as it did before (gradual underflow, ``np.where``); with
``--node``, the whole publish as an analyst sees it, against a ``dpnode serve`` process
(epsilon 0.001 each, the time of the HTTP request). The ratio of the slowest to the fastest
threshold is what the time shows: 1.0x is nothing.

``--kernels`` surveys the elementwise kernels that have a privacy rule instead: each one
evaluated by the engine (flush-to-zero included) on ``--rows`` values all near one magnitude,
for several magnitudes, best of ``--repeat`` interleaved. A kernel whose time moves with the
magnitude lets a graph that steers private values into its slow range (``sinh(700 * x)``,
clamped afterwards to keep the sensitivity small) count rows from the clock.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import interleaved_best
from dpnode.core.engine import GraphBuilder, encode, evaluate, subnormals
from dpnode.core.engine.graph import Graph
from dpnode.core.engine.prims import elementwise
from dpnode.core.engine.prims.elementwise import FLAT_EXPONENTS
from dpnode.core.privacy.rules.unary import TIMING_FLAT

THRESHOLDS = (1.0, 0.5, 0.0)


def tiny_values(name: str, rows: int, t: float, chain: int) -> Graph:
    b = GraphBuilder()
    x = b.input(name, "float64", (rows,))
    y = b.op("where", b.op("gt", x, t), b.op("mul", x, 1e-309), x)
    for _ in range(chain):
        y = b.op("div", y, 1.0000001)
    return b.build([b.op("mean", y)])


def choice(name: str, rows: int, t: float, chain: int) -> Graph:
    b = GraphBuilder()
    x = b.input(name, "float64", (rows,))
    return b.build([b.op("mean", b.op("where", b.op("gt", x, t), x, 0.0))])


ATTACKS = {"subnormals": tiny_values, "a choice": choice}


def _before(cond: Any, a: Any, b: Any, dtype: Any = None, **_: Any) -> Any:
    return np.asarray(np.where(cond, a, b), dtype=dtype)


def _row(label: str, times: list[float]) -> None:
    cells = " | ".join(f"{t * 1e3:.1f}" for t in times)
    print(f"| {label} | {cells} | {max(times) / min(times):.2f}x |")


def engine(args: argparse.Namespace, x: np.ndarray[Any, Any]) -> None:
    for label, attack in ATTACKS.items():
        graphs = [attack("x", args.rows, t, args.chain) for t in THRESHOLDS]

        def timed(graph: Graph, now: bool) -> Callable[[], object]:
            def go() -> object:
                saved = subnormals.SUPPORTED, elementwise.select
                if not now:
                    subnormals.SUPPORTED, elementwise.select = False, _before  # type: ignore[assignment]
                try:
                    return evaluate(graph, {"x": x})
                finally:
                    subnormals.SUPPORTED, elementwise.select = saved

            return go

        fns = [timed(g, now) for now in (True, False) for g in graphs]
        best = interleaved_best(fns, args.repeat)
        k = len(graphs)
        _row(f"{label}: the engine", best[:k])
        _row(f"{label}: the engine before", best[k:])
    if not subnormals.SUPPORTED:
        print("\n(this platform cannot flush subnormal results: both rows are before)")


def node(args: argparse.Namespace, x: np.ndarray[Any, Any]) -> None:
    import httpx

    from bench import publish_scale as ps
    from bench.publish import _prepare, server

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        _prepare(data_dir).close()
        with server(data_dir) as (url, _process):
            token = ps._token(url, "d@x.org")
            dataset, _ = ps._store_column(data_dir, "private", x)
            client = httpx.Client(base_url=url, timeout=600)
            headers = {
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/octet-stream",
            }
            name = f"dataset:{dataset}/x"

            def publisher(frame: bytes) -> Callable[[], object]:
                def go() -> object:
                    key = {"Idempotency-Key": uuid.uuid4().hex}
                    r = client.post(
                        "/api/v1/publish",
                        params={"epsilon": 0.001},
                        content=frame,
                        headers=headers | key,
                    )
                    r.raise_for_status()
                    return r

                return go

            for label, attack in ATTACKS.items():
                frames = [encode(attack(name, args.rows, t, args.chain)) for t in THRESHOLDS]
                best = interleaved_best([publisher(f) for f in frames], args.repeat)
                _row(f"{label}: a publish through `dpnode serve`", best)


#: Kernel, second operand (None: unary), the magnitudes its first operand is evaluated at.
KERNELS: tuple[tuple[str, float | None, tuple[float, ...]], ...] = (
    ("exp", None, (-1000, -740, -720, -100, 0, 100, 700, 709.5, 720)),
    ("expm1", None, (-100, 0, 100, 709.5, 720)),
    ("sinh", None, (1, 30, 300, 700, 709.5, 720)),
    ("cosh", None, (1, 300, 700, 710, 720)),
    ("log", None, (0, 1e-300, 1, 1e300)),
    # the engine's own below 2^19 (dpnode.core.engine.flat_math); beyond, NumPy's
    ("sin", None, (-500, 0, 0.1, 3, 100, 1000, 1e5, 5e5, 1e22)),
    ("cos", None, (-500, 0, 0.1, 3, 100, 1000, 1e5, 5e5, 1e22)),
    ("tanh", None, (0, 1, 30, 1000)),
    ("erf", None, (-3, 0, 0.5, 1, 3, 5, 10)),
    ("erfc", None, (-5, 0, 0.5, 1, 3, 10, 26, 30)),
    ("sqrt", None, (0, 1, 1e300)),
    ("hypot", 1.0, (0, 1e-300, 1, 1e150, 1e300)),
    # quotients below the cap a private dividend is held to (2^25); beyond, NumPy's kernels
    ("fmod", 1.0, (-64, 0, 0.5, 2, 64, 2.0**20, 2.0**25)),
    ("remainder", 1.0, (-64, 0, 0.5, 2, 64, 2.0**20, 2.0**25)),
    ("floor_divide", 1.0, (-64, 0, 0.5, 2, 64, 2.0**20, 2.0**25)),
    ("pow", 2.5, (0, 1e-300, 1e-10, 1, 1e100, 1e200, 1e300)),
    ("pow", 3.0, (-3, 0, 1e-300, 3, 1e300)),
)


def _private_may_reach(name: str, other: float | None, m: float) -> bool:
    """Whether a private float64 argument may lie at ``m`` (the mix is drawn from those)."""
    flat = TIMING_FLAT.get(name, (None, None))[0]
    if flat is not None:
        return flat[0] <= m * 1.001 and m <= flat[1]
    if name == "pow" and other is not None and other not in FLAT_EXPONENTS:
        return m > 0 and abs(math.log(m)) * abs(other) < 700
    return True


def kernels(args: argparse.Namespace) -> None:
    """The time of each kernel on values near each magnitude, and on a random mix of them
    (where a kernel that branches on its argument mispredicts), as the engine evaluates them."""
    rng = np.random.default_rng(0)
    wobble = 1 + rng.uniform(0, 1e-3, args.rows)
    print(f"\n# Elementwise kernels on {args.rows:,} values: best of {args.repeat}, ms\n")
    print("| kernel | time at each magnitude | a random mix | slowest / fastest |")
    print("|---|---|---|---|")
    for name, other, magnitudes in KERNELS:
        b = GraphBuilder()
        x = b.input("x", "float64", (args.rows,))
        y = b.op(name, x) if other is None else b.op(name, x, other)
        graph = b.build([b.op("sum", y)])

        def timed(column: np.ndarray[Any, Any], graph: Graph = graph) -> Callable[[], object]:
            return lambda: evaluate(graph, {"x": column})

        columns = [m * wobble for m in magnitudes]
        mixed = [m for m in magnitudes if _private_may_reach(name, other, m)]
        columns.append(rng.choice(np.asarray(mixed, dtype=np.float64), args.rows) * wobble)
        with np.errstate(all="ignore"):
            best = interleaved_best([timed(c) for c in columns], args.repeat)
        cells = ", ".join(f"{m:g}: {t * 1e3:.1f}" for m, t in zip(magnitudes, best, strict=False))
        ratio = max(best) / min(best)
        label = name if other is None else f"{name} {other:g}"
        print(f"| {label} | {cells} | {best[-1] * 1e3:.1f} | {ratio:.1f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--chain", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--node", action="store_true", help="also through a served node")
    parser.add_argument("--kernels", action="store_true", help="survey the kernels instead")
    args = parser.parse_args()
    if args.kernels:
        kernels(args)
        return
    x = np.random.default_rng(0).uniform(0, 1, args.rows)
    shares = " | ".join(f"{np.mean(x > t):.0%} of rows above t" for t in THRESHOLDS)
    print(f"# {args.rows:,} rows, {args.chain} divisions: best of {args.repeat}, ms\n")
    print(f"| evaluation | {shares} | slowest / fastest |")
    print("|---|---|---|---|---|")
    engine(args, x)
    if args.node:
        started = time.perf_counter()
        node(args, x)
        print(f"\n(the node's runs took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()

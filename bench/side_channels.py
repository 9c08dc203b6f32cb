"""What an answered publish's time shows about a private predicate, before and after.

    python -m bench.side_channels [--rows 2000000] [--chain 40] [--repeat 7] [--node]

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
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--chain", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--node", action="store_true", help="also through a served node")
    args = parser.parse_args()
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

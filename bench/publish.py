"""End-to-end publish latency against hand-written NumPy, measured in the same run.

    python bench/publish.py [--rows 1000000] [--lr-rows 100000] [--repeat 5]

Each case runs through the whole node in process — the SDK encodes the graph, the HTTP
API reads it, the engine evaluates and tracks sensitivity, the mechanism noises, the
ledger row is committed in SQLite — and is compared with what a person would write in
NumPy without any of that: the same computation plus ``Generator.laplace`` noise.
Noise throughput alone (against NumPy and OpenDP) is ``bench/noise.py``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from starlette.testclient import TestClient

import sdk
from node.app import create_app
from node.context import NodeContext
from node.db.migrate import upgrade
from node.engine import GraphBuilder, encode
from node.services import users
from node.settings import Settings


def best(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--lr-rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp),
            default_epsilon_budget=30,
            max_upload_bytes=1 << 30,
            argon2_memory_kib=8192,
            argon2_time_cost=1,
        )
        upgrade(settings.resolved_database_url)
        context = NodeContext.from_settings(settings)
        with context.sessions() as session:
            for email, role in (("o@x.org", "data_owner"), ("d@x.org", "data_scientist")):
                users.create_user(
                    session, context.hasher, None, email=email, password="bench password", role=role
                )
        with TestClient(create_app(context=context)) as http:
            owner = sdk.login(
                "http://bench",
                email="o@x.org",
                password="bench password",
                transport=http._transport,
            )
            ds = sdk.login(
                "http://bench",
                email="d@x.org",
                password="bench password",
                transport=http._transport,
            )
            x = rng.uniform(0, 1, args.rows)
            big = owner.upload_dataset("big", {"x": x}, bounds={"x": (0, 1)})
            n, k = args.lr_rows, args.features
            features = rng.uniform(-1, 1, (n, k)).astype(np.float32)
            labels = (rng.random(n) < 0.5).astype(np.float32)
            lr = owner.upload_dataset(
                "lr", {"X": features, "y": labels}, bounds={"X": (-1, 1), "y": (0, 1)}
            )
            w = rng.standard_normal(k).astype(np.float32)

            b = GraphBuilder()
            xi = b.input(f"dataset:{big.id}/x", "float64", (args.rows,))
            mean_frame = encode(b.build([b.op("mean", xi)]))

            b = GraphBuilder()
            xs = b.input(f"dataset:{lr.id}/X", "float32", (n, k))
            ys = b.input(f"dataset:{lr.id}/y", "float32", (n,))
            z = b.op("matmul", xs, b.constant(w))
            p = b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", z)), 1.0))
            residual = b.op("sub", p, ys)
            grad = b.op("div", b.op("matmul", b.op("permute", xs, dims=[1, 0]), residual), float(n))
            grad_frame = encode(b.build([grad]))

            noise = np.random.default_rng(1)

            def numpy_mean() -> Any:
                return x.mean() + noise.laplace(0, 1 / args.rows)

            def numpy_grad() -> Any:
                pv = 1.0 / (1.0 + np.exp(-(features @ w)))
                return features.T @ (pv - labels) / n + noise.laplace(0, 1e-3, k)

            rows = [
                (
                    f"publish mean of {args.rows:,} rows",
                    lambda: ds.publish_frame(mean_frame, epsilon=1.0),
                    numpy_mean,
                ),
                (
                    f"publish logistic-regression gradient {n:,} x {k}",
                    lambda: ds.publish_frame(grad_frame, epsilon=1.0),
                    numpy_grad,
                ),
            ]
            print("| case | dpnode ms | numpy ms | ratio |")
            print("|---|---|---|---|")
            for name, ours, theirs in rows:
                t_ours, t_theirs = best(ours, args.repeat), best(theirs, args.repeat)
                print(
                    f"| {name} | {t_ours * 1e3:.1f} | {t_theirs * 1e3:.1f} | "
                    f"{t_ours / t_theirs:.2f}x |"
                )
            _, receipt = ds.publish_frame(grad_frame, epsilon=1.0)
            print(
                f"\ngradient sensitivity (L1) {receipt['sensitivity_l1']:.4g}, "
                f"noise scale {receipt['noise_scale']:.4g}"
            )
        context.close()


if __name__ == "__main__":
    main()

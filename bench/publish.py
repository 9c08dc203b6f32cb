"""End-to-end publish latency against hand-written NumPy, measured in the same run.

    python -m bench.publish [--rows 1000000] [--lr-rows 100000] [--repeat 15] [--stages]
                            [--server] [--compare REV]
    python -m bench.publish --fixed [--big 10000000 [100000000]]   (bench/publish_scale.py)
    python -m bench.publish --dask [10000000 100000000]   (bench/dask_publish.py)

Each case runs through the whole node in process — the SDK encodes the graph, the HTTP
API reads it, the engine evaluates and tracks sensitivity, the mechanism noises, the
ledger row is committed in SQLite (``--server``: a real ``dpnode serve`` process on
loopback, so HTTP is uvicorn's over TCP rather than starlette's in-process test
transport) — and is compared with what a person would write in
NumPy without any of that: the same computation plus ``Generator.laplace`` noise. Two
baselines are printed:

- *NumPy, in memory*: the data are already NumPy arrays in the process;
- *NumPy, from file*: a script that loads the columns from ``.npy`` files (in the OS
  page cache after the first run) and computes, as a script run per query would.

Cases are interleaved and each time is the best of ``--repeat`` runs (the dev box is
shared; single runs move by tens of percent). ``--stages`` also prints where a publish's
time goes: each stage of ``dpnode.node.services.publish.publish`` timed by wrapping it, and
the rest of the request (HTTP, authentication, SDK encoding and decoding) as the
difference. Noise throughput alone (against NumPy and OpenDP) is ``bench/noise.py``.

``--compare REV`` also serves the same publishes from a ``git worktree`` of commit ``REV``
(a second ``dpnode serve`` process, the current one serving this tree), interleaved in
the same run, and prints this tree's time over REV's: the regression check of a change.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI
from starlette.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import noise as noise_bench
from bench.timing import interleaved_best
from dpnode import sdk
from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.migrate import upgrade
from dpnode.node.services import budget, users
from dpnode.node.services import publish as service
from dpnode.node.settings import Settings

REPO = Path(__file__).resolve().parents[1]
Case = tuple[str, Callable[[], Any], Callable[[], Any], Callable[[], Any]]


@contextmanager
def stage_timers() -> Iterator[dict[str, list[float]]]:
    """Time the stages of a publish by wrapping them (restored on exit)."""
    spans: dict[str, list[float]] = defaultdict(list)
    targets: list[tuple[object, str, str]] = [
        (service, "publish", "service total"),
        (service, "_decode", "decode + plan graph"),
        (service, "_resolve", "resolve inputs (DB + blobs)"),
        (service, "plan_release", "track sensitivity + plan noise"),
        (budget, "charge", "budget check + ledger commit"),
        (service, "run_release", "read columns, evaluate, clip, noise"),
        (users, "active", "read the account"),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets]
    saved.append((FastAPI, "__call__", FastAPI.__call__))

    def timed(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spans[label].append(time.perf_counter() - start)

        return wrapper

    app_call = FastAPI.__call__

    async def app(self: FastAPI, scope: Any, receive: Any, send: Any) -> None:
        start = time.perf_counter()
        try:
            await app_call(self, scope, receive, send)
        finally:
            spans["app"].append(time.perf_counter() - start)

    for owner, name, label in targets:
        setattr(owner, name, timed(getattr(owner, name), label))
    setattr(FastAPI, "__call__", app)  # noqa: B010 (a dunder: looked up on the class)
    try:
        yield spans
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def print_stages(name: str, run: Callable[[], Any], repeat: int) -> None:
    with stage_timers() as spans:
        totals = []
        for _ in range(repeat):
            start = time.perf_counter()
            run()
            totals.append(time.perf_counter() - start)
    med = {label: float(np.median(v)) * 1e3 for label, v in spans.items()}
    total = float(np.median(totals)) * 1e3
    print(f"\n{name}: median of {repeat} publishes, {total:.1f} ms end to end")
    print("| stage | ms | share |")
    print("|---|---|---|")
    outside = ("service total", "app")

    def row(label: str, ms: float) -> None:
        print(f"| {label} | {ms:.2f} | {ms / total:.0%} |")

    inner = 0.0
    for label, ms in med.items():
        if label not in outside:
            inner += ms
            row(label, ms)
    row("rest of the service (receipt, hashes)", med["service total"] - inner)
    http = med["app"] - med["service total"]
    row("HTTP in the node (routing, token, body, thread hand-off)", http)
    row("SDK and in-process transport (httpx, starlette)", total - med["app"])


SETTINGS = {
    "DPNODE_DEFAULT_EPSILON_BUDGET": "30",
    "DPNODE_MAX_UPLOAD_BYTES": str(1 << 30),
    "DPNODE_ARGON2_MEMORY_KIB": "8192",
    "DPNODE_ARGON2_TIME_COST": "1",
}


def _prepare(data_dir: Path) -> NodeContext:
    """A node's database with the bench's owner and data scientist."""
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(data_dir=data_dir, **{k[7:].lower(): v for k, v in SETTINGS.items()})
    upgrade(settings.resolved_database_url)
    context = NodeContext.from_settings(settings)
    with context.sessions() as session:
        for email, role in (("o@x.org", "data_owner"), ("d@x.org", "data_scientist")):
            users.create_user(
                session, context.hasher, None, email=email, password="bench password", role=role
            )
    return context


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """A checkout of ``rev`` in a temporary directory (removed on exit)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tree"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(path), rev],
            check=True,
        )
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=True
            )


@contextmanager
def server(data_dir: Path, repo: Path = REPO) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real ``dpnode serve`` process on loopback serving ``data_dir`` (prepared) with the
    code of ``repo``: its URL and process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = os.environ | SETTINGS | {"DPNODE_DATA_DIR": str(data_dir), "PYTHONPATH": str(repo)}
    command = [
        sys.executable,
        "-m",
        "dpnode",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    # run from the served tree, so that its `node` package is the one imported
    cwd = str(repo)
    url = f"http://127.0.0.1:{port}"
    log = data_dir / "server.log"
    with (
        log.open("wb") as out,
        subprocess.Popen(command, env=env, stdout=out, stderr=out, cwd=cwd) as p,
    ):
        try:
            for _ in range(300):
                if p.poll() is not None:
                    raise RuntimeError(f"the node exited:\n{log.read_text()}")
                try:
                    if httpx.get(url + "/api/v1/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            yield url, p
        finally:
            p.terminate()
            p.wait(timeout=30)


@contextmanager
def node(data_dir: Path, server_: bool, repo: Path = REPO) -> Iterator[Callable[[str], Any]]:
    """Log in to a node: in process (the app behind starlette's TestClient) or a real server
    (serving the code of ``repo``)."""
    context = _prepare(data_dir)
    if not server_:
        with TestClient(create_app(context=context)) as http:
            yield lambda email: sdk.login(
                "http://bench", email=email, password="bench password", transport=http._transport
            )
        context.close()
        return
    context.close()
    with server(data_dir, repo) as (url, _):
        yield lambda email: sdk.login(url, email=email, password="bench password")


@dataclass(frozen=True)
class Data:
    x: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    w: np.ndarray


def publishes(login: Callable[[str], Any], data: Data) -> list[Callable[[], Any]]:
    """Upload the bench's datasets to a node and return its two publishes (mean, gradient)."""
    owner, ds = login("o@x.org"), login("d@x.org")
    rows, (n, k) = data.x.shape[0], data.features.shape
    big = owner.upload_dataset("big", {"x": data.x}, bounds={"x": (0, 1)})
    lr = owner.upload_dataset(
        "lr", {"X": data.features, "y": data.labels}, bounds={"X": (-1, 1), "y": (0, 1)}
    )
    b = GraphBuilder()
    xi = b.input(f"dataset:{big.id}/x", "float64", (rows,))
    mean_frame = encode(b.build([b.op("mean", xi)]))
    b = GraphBuilder()
    xs = b.input(f"dataset:{lr.id}/X", "float32", (n, k))
    ys = b.input(f"dataset:{lr.id}/y", "float32", (n,))
    z = b.op("matmul", xs, b.constant(data.w))
    p = b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", z)), 1.0))
    residual = b.op("sub", p, ys)
    grad = b.op("div", b.op("matmul", b.op("permute", xs, dims=[1, 0]), residual), float(n))
    grad_frame = encode(b.build([grad]))
    return [
        lambda: ds.publish_frame(mean_frame, epsilon=0.01),
        lambda: ds.publish_frame(grad_frame, epsilon=0.01),
    ]


def compare(args: argparse.Namespace, data: Data) -> None:
    """This tree's publishes against REV's, two servers, interleaved in one run."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        worktree(args.compare) as old_tree,
        node(Path(tmp) / "new", True) as new_login,
        node(Path(tmp) / "old", True, repo=old_tree) as old_login,
    ):
        new, old = publishes(new_login, data), publishes(old_login, data)
        # each tree goes first in half the rounds: whichever server ran just before (its
        # BLAS threads still spinning, its garbage) should weigh on both alike
        ahead = interleaved_best(
            [fn for pair in zip(new, old, strict=True) for fn in pair], args.repeat
        )
        behind = interleaved_best(
            [fn for pair in zip(old, new, strict=True) for fn in pair], args.repeat
        )
        swapped = [behind[i + 1 - 2 * (i % 2)] for i in range(len(behind))]
        times = [min(a, b) for a, b in zip(ahead, swapped, strict=True)]
    names = [f"mean of {data.x.shape[0]:,} rows", "logistic-regression gradient"]
    print(f"\n## This tree against {args.compare}, `dpnode serve` each, best of {args.repeat}\n")
    print(f"| case | this tree ms | {args.compare} ms | ratio |")
    print("|---|---|---|---|")
    for i, name in enumerate(names):
        ours, theirs = times[2 * i] * 1e3, times[2 * i + 1] * 1e3
        print(f"| {name} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--lr-rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--stages", action="store_true", help="print a per-stage breakdown")
    parser.add_argument("--no-noise", action="store_true", help="skip the noise throughput")
    parser.add_argument(
        "--server",
        action="store_true",
        help="publish to a real `dpnode serve` process on loopback instead of in process",
    )
    parser.add_argument(
        "--compare",
        metavar="REV",
        help="also time the same publishes served by commit REV (a git worktree)",
    )
    parser.add_argument(
        "--fixed",
        action="store_true",
        help="only the fixed cost: a tiny publish against an authenticated FastAPI POST "
        "writing one durable row, two real servers (bench/publish_scale.py)",
    )
    parser.add_argument(
        "--big",
        type=int,
        nargs="+",
        metavar="ROWS",
        help="only the cost per row: the mean of float64 columns of these many rows against "
        "NumPy reading the same stored file, and the node's peak memory; e.g. --big "
        "10000000 100000000 (100M: about 3 GB while the column is written)",
    )
    parser.add_argument("--requests", type=int, default=300, help="requests per --fixed case")
    parser.add_argument(
        "--dask",
        type=int,
        nargs="*",
        metavar="ROWS",
        help="only a mean evaluated by blocks in the node and on a 2-worker Dask LocalCluster "
        "(default 10000000 100000000; bench/dask_publish.py)",
    )
    args = parser.parse_args()
    if args.dask is not None:
        from bench import dask_publish

        rows = [str(r) for r in args.dask or (10_000_000, 100_000_000)]
        dask_publish.main(["--rows", *rows, "--repeat", str(min(args.repeat, 3))])
        return
    if args.fixed or args.big:
        from bench import publish_scale

        publish_scale.run(args)
        return
    if not args.no_noise:
        print("## Noise: values per second\n")
        noise_bench.report(repeat=min(args.repeat, 9))
        print("\n## Publish, end to end\n")
    rng = np.random.default_rng(0)
    n, k = args.lr_rows, args.features
    data = Data(
        x=rng.uniform(0, 1, args.rows),
        features=rng.uniform(-1, 1, (n, k)).astype(np.float32),
        labels=(rng.random(n) < 0.5).astype(np.float32),
        w=rng.standard_normal(k).astype(np.float32),
    )
    if args.compare:
        compare(args, data)
        return
    x, features, labels, w = data.x, data.features, data.labels, data.w
    with tempfile.TemporaryDirectory() as tmp, node(Path(tmp), args.server) as login:
        publish_mean, publish_grad = publishes(login, data)
        files = Path(tmp) / "npy"
        files.mkdir()
        np.save(files / "x.npy", x)
        np.save(files / "X.npy", features)
        np.save(files / "y.npy", labels)
        noise = np.random.default_rng(1)

        def numpy_mean(xv: np.ndarray) -> Any:
            return xv.mean() + noise.laplace(0, 1 / args.rows)

        def numpy_grad(fv: np.ndarray, yv: np.ndarray) -> Any:
            pv = 1.0 / (1.0 + np.exp(-(fv @ w)))
            return fv.T @ (pv - yv) / n + noise.laplace(0, 1e-3, k)

        cases: list[Case] = [
            (
                f"publish the mean of {args.rows:,} rows",
                publish_mean,
                lambda: numpy_mean(x),
                lambda: numpy_mean(np.load(files / "x.npy")),
            ),
            (
                f"publish a logistic-regression gradient, {n:,} x {k}",
                publish_grad,
                lambda: numpy_grad(features, labels),
                lambda: numpy_grad(np.load(files / "X.npy"), np.load(files / "y.npy")),
            ),
        ]
        fns = [fn for case in cases for fn in case[1:]]
        times = interleaved_best(fns, args.repeat)
        print("| case | dpnode ms | NumPy in memory ms | ratio | NumPy from file ms | ratio |")
        print("|---|---|---|---|---|---|")
        for i, (name, *_) in enumerate(cases):
            ours, mem, disk = (t * 1e3 for t in times[3 * i : 3 * i + 3])
            print(
                f"| {name} | {ours:.1f} | {mem:.2f} | {ours / mem:.1f}x | {disk:.2f} | "
                f"{ours / disk:.1f}x |"
            )
        if args.stages and not args.server:
            for name, run, *_ in cases:
                print_stages(name, run, args.repeat)
        _, receipt = publish_grad()
        print(
            f"\ngradient sensitivity (L1) {receipt['sensitivity_l1']:.4g}, "
            f"noise scale {receipt['noise_scale']:.4g}"
        )


if __name__ == "__main__":
    main()

"""A publish's fixed cost against a plain FastAPI write, and its cost per row against NumPy.

    python -m bench.publish --fixed [--requests 300]
    python -m bench.publish --big 10000000 [100000000] [--repeat 7]

Both run a real ``dpnode serve`` process on loopback (``bench.publish.node``), in one run
with their baselines:

- **fixed cost** (``--fixed``): the median time of a tiny publish (the mean of 1,000 rows)
  posted over HTTP with a fresh idempotency key (as the SDK sends each publish), against an
  authenticated FastAPI POST that writes one durable row to the node's own database: a
  second server process (this module's ``--serve-baseline``, uvicorn with the node's
  settings) that checks the same bearer token, reads the account,
  inserts a row and commits (SQLite with the node's pragmas: WAL, ``synchronous=FULL``).
  Requests alternate between the two servers, each over its own kept-alive connection.
- **cost per row** (``--big ROWS``): a float64 column of ROWS rows is written through the
  node's own store (as an upload would; its SHA-256 first), then the mean is published and
  timed against hand-written NumPy reading the same stored file: ``np.memmap(...).mean()``
  and ``np.fromfile(...).mean()``, interleaved. The variable cost is the publish's time
  less the tiny publish's (both the best of the same interleaved rounds). The node's peak
  resident memory (``VmHWM``, reset before each size through ``/proc/<pid>/clear_refs``)
  is printed against the column's size.

100M rows need about 3 GB in the bench process while the column is written (the array,
the bytes and their copy), and the node's first publish of a column hashes it (about a
second at 800 MB: ``dpnode.node.storage``); the times are of later publishes.
"""

import argparse
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import httpx
import numpy as np
from fastapi import Depends, FastAPI
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from sqlalchemy import Column, Float, Integer, MetaData, Table, insert, select
from starlette.concurrency import run_in_threadpool

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dpnode.core.engine import GraphBuilder, encode  # noqa: E402
from dpnode.node.context import NodeContext  # noqa: E402
from dpnode.node.db.models import User  # noqa: E402
from dpnode.node.services import datasets, users  # noqa: E402
from dpnode.node.services.datasets import DatasetUpload  # noqa: E402
from dpnode.node.services.security import read_token  # noqa: E402
from dpnode.node.services.tabular import ColumnSpec  # noqa: E402
from dpnode.node.settings import Settings  # noqa: E402
from dpnode.node.storage import RECENT_NS  # noqa: E402

PASSWORD = "bench password"


class Row(BaseModel):
    value: float


_bearer = HTTPBearer()


def baseline_app(settings: Settings) -> FastAPI:
    """An authenticated FastAPI POST that writes one durable row to the node's database."""
    context = NodeContext.from_settings(settings)  # the node's engine, pragmas and secret
    rows = Table(
        "bench_rows",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("user_id", Integer, nullable=False),
        Column("value", Float, nullable=False),
    )
    rows.create(context.engine, checkfirst=True)
    app = FastAPI()

    async def user_id(
        credentials: Annotated[HTTPAuthorizationCredentials, Depends(_bearer)],
    ) -> int:
        return read_token(context.settings, credentials.credentials)

    def write(uid: int, value: float) -> int:
        with context.sessions() as session:
            users.active(session, uid)  # the account, as a publish reads it
            new = session.execute(insert(rows).values(user_id=uid, value=value))
            session.commit()
            key = new.inserted_primary_key
            assert key is not None
            return int(key[0])

    @app.post("/rows")
    async def post_row(row: Row, uid: Annotated[int, Depends(user_id)]) -> dict[str, int]:
        return {"id": await run_in_threadpool(write, uid, row.value)}

    return app


def serve_baseline(data_dir: Path, port: int) -> None:
    import uvicorn

    from bench.publish import SETTINGS

    values = {k[7:].lower(): v for k, v in SETTINGS.items()}
    app = baseline_app(Settings(data_dir=data_dir, **values))  # type: ignore[arg-type]
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")  # as `dpnode serve`


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _token(url: str, email: str) -> str:
    response = httpx.post(f"{url}/api/v1/auth/login", json={"email": email, "password": PASSWORD})
    response.raise_for_status()
    return str(response.json()["access_token"])


def _store_column(data_dir: Path, name: str, x: np.ndarray[Any, Any]) -> tuple[int, Path]:
    """Write a dataset through the node's own service and store (the node keeps serving)."""
    from bench.publish import SETTINGS

    values = {k[7:].lower(): v for k, v in SETTINGS.items()}
    context = NodeContext.from_settings(Settings(data_dir=data_dir, **values))  # type: ignore[arg-type]
    upload = DatasetUpload(
        name=name,
        description="",
        tags=[],
        spec=ColumnSpec(bounds={"x": (0.0, 1.0)}, categories={}),
        order=["x"],
        columns={"x": x},
    )
    try:
        with context.sessions() as session:
            owner = session.scalars(select(User).where(User.email == "o@x.org")).one()
            dataset = datasets.create_dataset(
                session, context.store, owner, upload, max_elements=x.size
            )
            digest = dataset.columns[0].blob
        path = context.settings.blob_dir / digest[:2] / digest
    finally:
        context.close()
    return dataset.id, path


def _mean_frame(dataset_id: int, rows: int) -> bytes:
    b = GraphBuilder()
    x = b.input(f"dataset:{dataset_id}/x", "float64", (rows,))
    return encode(b.build([b.op("mean", x)]))


def _poster(url: str, token: str, frame: bytes) -> Callable[[], Any]:
    client = httpx.Client(base_url=url, timeout=600)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}

    def post() -> Any:
        key = {"Idempotency-Key": uuid.uuid4().hex}  # as the SDK sends every publish
        r = client.post(
            "/api/v1/publish", params={"epsilon": 0.001}, content=frame, headers=headers | key
        )
        r.raise_for_status()
        return r

    return post


def _status(pid: int) -> dict[str, int]:
    """The kB fields of ``/proc/<pid>/status`` (VmRSS, VmHWM, RssAnon, RssFile)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            out[key] = int(rest.split()[0])
    return out


def _median_interleaved(fns: list[Callable[[], Any]], count: int) -> list[float]:
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(count):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def run(args: argparse.Namespace) -> None:
    import tempfile

    from bench.publish import SETTINGS, _prepare, server

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        _prepare(data_dir).close()
        with server(data_dir) as (url, process):
            measure(args, data_dir, url, process.pid, SETTINGS)


def measure(
    args: argparse.Namespace, data_dir: Path, url: str, pid: int, settings: dict[str, str]
) -> None:
    """(a) and (b) against the node serving ``data_dir`` at ``url`` (process ``pid``)."""

    if True:
        token = _token(url, "d@x.org")
        tiny_id, _ = _store_column(data_dir, "tiny", np.random.default_rng(0).uniform(0, 1, 1000))
        tiny = _poster(url, token, _mean_frame(tiny_id, 1000))
        if args.fixed:
            port = _free_port()
            env = os.environ | settings | {"PYTHONPATH": str(REPO)}
            command = [
                sys.executable,
                "-m",
                "bench.publish_scale",
                "--serve-baseline",
                str(data_dir),
                str(port),
            ]
            log = (data_dir / "baseline.log").open("wb")
            with subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=log) as p:
                try:
                    base = f"http://127.0.0.1:{port}"
                    _wait(base + "/docs", p, data_dir / "baseline.log")
                    client = httpx.Client(base_url=base, timeout=60)
                    headers = {"Authorization": f"Bearer {token}"}

                    def write_row() -> Any:
                        r = client.post("/rows", json={"value": 1.0}, headers=headers)
                        r.raise_for_status()
                        return r

                    t_pub, t_row = _median_interleaved([tiny, write_row], args.requests)
                finally:
                    p.terminate()
                    p.wait(timeout=30)
            print(f"\n## Fixed cost: median of {args.requests} requests each, interleaved\n")
            print("| request | median ms |")
            print("|---|---|")
            print(f"| publish the mean of 1,000 rows (HTTP, one ledger row) | {t_pub * 1e3:.2f} |")
            print(f"| FastAPI POST: token, account read, one row committed | {t_row * 1e3:.2f} |")
            print(f"\n(a) fixed cost ratio: {t_pub / t_row:.2f}x (target <= 1.5x)")
        if not args.big:
            return
        print(f"\n## Cost per row: mean of a float64 column, best of {args.repeat}\n")
        print(
            "| rows | column MB | publish ms | variable ms | NumPy memmap ms | ratio | "
            "NumPy fromfile ms | ratio | node peak RSS MB over idle | over column |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        for rows in args.big:
            x = np.random.default_rng(rows).uniform(0, 1, rows)
            dataset_id, path = _store_column(data_dir, f"x{rows}", x)
            del x
            publish = _poster(url, token, _mean_frame(dataset_id, rows))
            # A file changed less than RECENT_NS ago is hashed on every publish (its times
            # may not show a change yet); then the first publish hashes it once: neither is
            # what is timed.
            time.sleep(RECENT_NS / 1e9 + 0.5)
            publish()
            os.sync()
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak (VmHWM)
            idle = _status(pid)["VmRSS"]

            def memmap(path: Path = path) -> Any:
                return np.memmap(path, dtype=np.float64, mode="r").mean()

            def fromfile(path: Path = path) -> Any:
                return np.fromfile(path, dtype=np.float64).mean()

            from bench.timing import interleaved_best

            t_pub, t_tiny, t_map, t_file = interleaved_best(
                [publish, tiny, memmap, fromfile], args.repeat
            )
            peak = _status(pid)["VmHWM"] - idle
            column = rows * 8 / 1e6
            variable = t_pub - t_tiny  # both the best of the same interleaved rounds
            print(
                f"| {rows:,} | {column:.0f} | {t_pub * 1e3:.1f} | {variable * 1e3:.1f} | "
                f"{t_map * 1e3:.1f} | {variable / t_map:.2f}x | {t_file * 1e3:.1f} | "
                f"{variable / t_file:.2f}x | {peak / 1e3:.0f} | {peak / 1e3 / column:.2f}x |"
            )
        print("\n(b) ratio: the publish's variable cost over NumPy's time (target <= 1.5x)")


def _wait(url: str, p: Any, log: Path) -> None:
    for _ in range(300):
        if p.poll() is not None:
            raise RuntimeError(f"the baseline server exited:\n{log.read_text()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError("the baseline server did not start")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-baseline":
        serve_baseline(Path(sys.argv[2]), int(sys.argv[3]))

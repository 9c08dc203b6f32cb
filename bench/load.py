"""A node under load: N concurrent clients, each logging in and looping publish + search.

    python -m bench.load [--levels 8,32,64,256] [--seconds 10] [--backends sqlite,pg1,pg4]
                         [--in-flight N] [--no-retry]

Each backend gets a real ``python -m dpnode serve`` process on loopback (``pg4``: ``--workers 4``)
with an admin, a data owner, a dataset and one data scientist per client made first. Then,
for each level, that many clients (asyncio tasks on one ``httpx.AsyncClient``, plain HTTP
frames as ``bench/publish.py`` sends them) log in and loop: publish the mean of a column
(epsilon 0.01, a fresh ``Idempotency-Key``), then search by tag, until the level's time is up.

Printed per level: publishes/s and searches/s answered 200, p50/p99 latency of a publish
(200 only), the cores the node's processes and the clients used (100%: one core), how busy
the whole machine was (100%: every core, whoever used it), and every other answer by
status (``reset``: the connection failed, ``timeout``: no answer in 60 s). A ``503`` is the
node's back-pressure: the client waits ``Retry-After`` and sends the same request again (a
publish with the same key), as the SDK does (``--no-retry``: it moves on). Afterwards the
ledger is read straight from the database: every publish answered 200 has exactly one
ledger row (its receipt's ``ledger_id``), every row was answered (or its answer was lost on
a failed connection, counted apart), and nobody spent more than their budget.

On PostgreSQL the ratio of the 4-worker to the 1-worker throughput is printed per level: how
far more processes help, on the cores this machine has (``os.cpu_count()``, printed too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import create_engine, func, select, text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dpnode import sdk
from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.context import NodeContext
from dpnode.node.db.migrate import upgrade
from dpnode.node.db.models import LedgerEntry, User
from dpnode.node.services import users
from dpnode.node.services.costs import EPSILON_UNIT
from dpnode.node.settings import Settings
from tests.postgres import postgres_server

REPO = Path(__file__).resolve().parents[1]
API = "/api/v1"
PASSWORD = "bench password"
EPSILON = 0.01
BUDGET = 700.0  # the largest default budget: the clients never run out
ROWS = 1000
SETTINGS = {
    "DPNODE_DEFAULT_EPSILON_BUDGET": str(BUDGET),
    "DPNODE_ARGON2_MEMORY_KIB": "8192",
    "DPNODE_ARGON2_TIME_COST": "1",
    # every client logs in from 127.0.0.1: the per-address login limit would refuse them
    "DPNODE_LOGIN_MAX_ATTEMPTS_PER_ADDRESS": "1000000",
}


@dataclass
class Level:
    clients: int
    seconds: float = 0.0
    publish_latency: list[float] = field(default_factory=list)
    searches: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    #: ledger ids of the publishes answered 200, per user
    received: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))
    #: cores the clients themselves used (they share the machine with the node)
    client_cpu: float = 0.0
    #: cores the node's processes used
    node_cpu: float = 0.0
    #: share of all the machine's cores busy (with anything: node, database, clients, others)
    machine_busy: float = 0.0
    #: publishes whose connection failed: charged or not, nobody knows (their key tells)
    unanswered: int = 0

    @property
    def publishes(self) -> int:
        return len(self.publish_latency)


def _prepare(settings: Settings, clients: int) -> list[int]:
    """The accounts; the ids of the data scientists."""
    upgrade(settings.resolved_database_url)
    context = NodeContext.from_settings(settings)
    try:
        with context.sessions() as session:
            users.create_user(
                session, context.hasher, None, email="admin@x.org", password=PASSWORD, role="admin"
            )
            users.create_user(
                session, context.hasher, None, email="o@x.org", password=PASSWORD,
                role="data_owner",
            )  # fmt: skip
            ids = [
                users.create_user(
                    session, context.hasher, None, email=f"ds{i}@x.org", password=PASSWORD,
                    role="data_scientist",
                ).id
                for i in range(clients)
            ]  # fmt: skip
        return ids
    finally:
        context.close()


@contextmanager
def serve(
    data_dir: Path, database_url: str, workers: int, extra: dict[str, str]
) -> Iterator[tuple[str, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = (
        os.environ
        | SETTINGS
        | extra
        | {"DPNODE_DATA_DIR": str(data_dir), "DPNODE_DATABASE_URL": database_url}
        | {"PYTHONPATH": str(REPO)}
    )
    command = [sys.executable, "-m", "dpnode", "serve", "--port", str(port)]
    command += ["--log-level", "warning"]
    if workers != 1:
        command += ["--workers", str(workers)]
    url = f"http://127.0.0.1:{port}"
    log = data_dir / "server.log"
    with (
        log.open("wb") as out,
        subprocess.Popen(command, env=env, stdout=out, stderr=out, cwd=REPO) as p,
    ):
        try:
            for _ in range(600):
                if p.poll() is not None:
                    raise RuntimeError(f"the node exited:\n{log.read_text()}")
                try:
                    if httpx.get(url + API + "/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            yield url, p.pid
        finally:
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:  # requests stuck in it: do not wait for them
                print("  (the node did not stop within 30 s of SIGTERM: killed)")
                p.kill()
                p.wait()
            if os.environ.get("LOAD_BENCH_DIR"):
                import shutil

                shutil.copy(log, Path(os.environ["LOAD_BENCH_DIR"]) / f"{data_dir.name}.log")
            errors = [
                line
                for line in log.read_text().splitlines()
                if "Traceback" in line or "Error" in line
            ]
            if errors:
                print(f"  (server log: {len(errors)} error lines, e.g. {errors[-1][:160]!r})")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and its descendants alive now (Linux)."""
    total, pending = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        pending.extend(int(c) for c in children)
    return total


def machine_times() -> tuple[float, float]:
    """(busy, total) CPU time of the whole machine so far, every core, in ticks (Linux)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return float(sum(values) - idle), float(sum(values))


def _retry_after(response: httpx.Response) -> float:
    value = response.headers.get("Retry-After", "1")
    return float(value) if value.isdigit() else 1.0


async def _client(
    http: httpx.AsyncClient, level: Level, index: int, frame: bytes, deadline: float, retry: bool
) -> None:
    while True:  # as the SDK does: wait out a 503, give up on anything else
        try:
            r = await http.post(
                API + "/auth/login", json={"email": f"ds{index}@x.org", "password": PASSWORD}
            )
        except httpx.TransportError as exc:
            level.statuses["login " + _transport(exc)] += 1
            return
        if r.status_code == 200:
            break
        level.statuses[f"login {r.status_code}"] += 1
        if r.status_code != 503 or not retry or time.monotonic() > deadline:
            return
        await asyncio.sleep(_retry_after(r))
    auth = {"Authorization": f"Bearer {r.json()['access_token']}"}
    publish = {**auth, "Content-Type": "application/octet-stream"}
    while time.monotonic() < deadline:
        key = uuid.uuid4().hex
        while True:  # the same publish, with the same key, while the node says 503
            start = time.perf_counter()
            try:
                r = await http.post(
                    API + "/publish",
                    content=frame,
                    params={"epsilon": EPSILON},
                    headers={**publish, "Idempotency-Key": key},
                )
            except httpx.TransportError as exc:
                level.statuses["publish " + _transport(exc)] += 1
                level.unanswered += 1
                break
            if r.status_code == 200:
                level.publish_latency.append(time.perf_counter() - start)
                level.received[index].add(_ledger_id(r.content))
                break
            level.statuses[f"publish {r.status_code}"] += 1
            if r.status_code != 503 or not retry or time.monotonic() > deadline:
                break
            await asyncio.sleep(_retry_after(r))
        if time.monotonic() >= deadline:
            break
        try:
            r = await http.get(API + "/search", params={"tags": "load"}, headers=auth)
        except httpx.TransportError as exc:
            level.statuses["search " + _transport(exc)] += 1
            continue
        if r.status_code == 200:
            level.searches += 1
        else:
            level.statuses[f"search {r.status_code}"] += 1
            if r.status_code == 503:
                await asyncio.sleep(_retry_after(r))


def _transport(exc: httpx.TransportError) -> str:
    return "timeout" if isinstance(exc, httpx.TimeoutException) else "reset"


def _ledger_id(content: bytes) -> int:
    """The receipt's ledger id, from a tensor frame's manifest (safetensors metadata)."""
    (length,) = struct.unpack("<Q", content[:8])
    manifest = json.loads(json.loads(content[8 : 8 + length])["__metadata__"]["dpnode"])
    return int(manifest["receipt"]["ledger_id"])


async def _run_level(url: str, level: Level, frame: bytes, seconds: float, retry: bool) -> None:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        deadline = time.monotonic() + seconds
        start, cpu = time.monotonic(), time.process_time()
        await asyncio.gather(
            *(_client(http, level, i, frame, deadline, retry) for i in range(level.clients))
        )
        level.seconds = time.monotonic() - start
        level.client_cpu = (time.process_time() - cpu) / level.seconds


def _frame(dataset_id: int) -> bytes:
    b = GraphBuilder()
    x = b.input(f"dataset:{dataset_id}/x", "float64", (ROWS,))
    return encode(b.build([b.op("mean", x)]))


def check_ledger(database_url: str, user_ids: list[int], levels: list[Level]) -> list[str]:
    """Problems with the ledger: a 200 without its row, a row nobody was answered, overspend."""
    received: dict[int, set[int]] = defaultdict(set)
    for level in levels:
        for index, ids in level.received.items():
            received[user_ids[index]] |= ids
    unanswered = sum(level.unanswered for level in levels)
    engine = create_engine(database_url)
    problems = []
    try:
        with engine.connect() as conn:
            rows: dict[int, set[int]] = defaultdict(set)
            for entry_id, user_id in conn.execute(select(LedgerEntry.id, LedgerEntry.user_id)):
                rows[user_id].add(entry_id)
            sums = select(LedgerEntry.user_id, func.sum(LedgerEntry.epsilon_units))
            # PostgreSQL sums bigints as numeric (Decimal): whole units either way
            spent = {u: int(s) for u, s in conn.execute(sums.group_by(LedgerEntry.user_id))}
            scientists = set(
                conn.execute(select(User.id).where(User.role == "data_scientist")).scalars()
            )
    finally:
        engine.dispose()
    missing = sum(len(received[u] - rows[u]) for u in received)
    unseen = sum(len(rows[u] - received[u]) for u in rows)
    budget_units = int(BUDGET / EPSILON_UNIT)
    over = [u for u, s in spent.items() if s > budget_units]
    if missing:
        problems.append(f"{missing} publishes answered 200 have no ledger row")
    if unseen > unanswered:
        problems.append(f"{unseen} ledger rows were never answered ({unanswered} lost answers)")
    if over:
        problems.append(f"{len(over)} users spent more than their budget")
    if set(rows) - scientists:
        problems.append("ledger rows of users who are not the clients")
    total = sum(len(ids) for ids in received.values())
    print(
        f"  ledger: {sum(len(r) for r in rows.values())} rows, {total} publishes answered 200, "
        f"{unseen} rows unanswered (of {unanswered} lost answers), most spent "
        f"{max(spent.values(), default=0) * float(EPSILON_UNIT):.2f} of {BUDGET:g}: "
        + ("; ".join(problems) if problems else "OK")
    )
    return problems


def run_backend(
    name: str,
    database_url: str,
    data_dir: Path,
    workers: int,
    args: argparse.Namespace,
) -> dict[int, Level]:
    settings = Settings(
        data_dir=data_dir, database_url=database_url, argon2_memory_kib=8192, argon2_time_cost=1
    )
    user_ids = _prepare(settings, max(args.levels))
    extra = {} if args.in_flight is None else {"DPNODE_MAX_REQUESTS_IN_FLIGHT": str(args.in_flight)}
    print(f"\n## {name} ({workers} worker{'s' * (workers > 1)})\n")
    print(
        "| clients | publishes/s | searches/s | p50 ms | p99 ms | node CPU | client CPU "
        "| machine busy | other answers |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    results: dict[int, Level] = {}
    with serve(data_dir, settings.resolved_database_url, workers, extra) as (url, pid):
        owner = sdk.login(url, email="o@x.org", password=PASSWORD)
        x = np.random.default_rng(0).uniform(0, 1, ROWS)
        dataset = owner.upload_dataset("load", {"x": x}, bounds={"x": (0, 1)}, tags=["load"])
        frame = _frame(dataset.id)
        for clients in args.levels:
            level = Level(clients)
            node_cpu, (busy, total) = cpu_seconds(pid), machine_times()
            asyncio.run(_run_level(url, level, frame, args.seconds, not args.no_retry))
            level.node_cpu = (cpu_seconds(pid) - node_cpu) / level.seconds
            busy_after, total_after = machine_times()
            level.machine_busy = (busy_after - busy) / max(1.0, total_after - total)
            results[clients] = level
            lat = np.array(level.publish_latency or [float("nan")]) * 1e3
            other = ", ".join(f"{k}: {v}" for k, v in sorted(level.statuses.items())) or "none"
            print(
                f"| {clients} | {level.publishes / level.seconds:.1f} | "
                f"{level.searches / level.seconds:.1f} | {np.percentile(lat, 50):.0f} | "
                f"{np.percentile(lat, 99):.0f} | {level.node_cpu:.0%} | {level.client_cpu:.0%} "
                f"| {level.machine_busy:.0%} | {other} |",
                flush=True,
            )
    check_ledger(settings.resolved_database_url, user_ids, list(results.values()))
    return results


@contextmanager
def postgres_database(server: str, name: str) -> Iterator[str]:
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="8,32,64,256", help="clients per level (commas)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each level")
    parser.add_argument("--backends", default="sqlite,pg1,pg4", help="sqlite, pg1, pg4 (commas)")
    parser.add_argument("--in-flight", type=int, default=None, help="DPNODE_MAX_REQUESTS_IN_FLIGHT")
    parser.add_argument("--no-retry", action="store_true", help="do not resend a publish on 503")
    args = parser.parse_args()
    args.levels = [int(n) for n in args.levels.split(",")]
    backends = args.backends.split(",")
    print(f"# bench/load.py: {os.cpu_count()} cores, {args.seconds:g} s per level")
    throughput: dict[str, dict[int, float]] = {}
    keep = os.environ.get("LOAD_BENCH_DIR")
    with (
        tempfile.TemporaryDirectory(dir=keep) as tmp,
        ExitStack() as stack,
    ):
        pg = None
        for backend in backends:
            data_dir = Path(tmp) / backend
            data_dir.mkdir()
            if backend == "sqlite":
                url, workers = "", 1
            elif backend.startswith("pg"):
                if pg is None:
                    pg = stack.enter_context(postgres_server())
                url = stack.enter_context(postgres_database(pg, f"load_{backend}"))
                workers = int(backend[2:] or 1)
            else:
                parser.error(f"unknown backend {backend!r}")
            name = "SQLite" if backend == "sqlite" else "PostgreSQL"
            levels = run_backend(name, url, data_dir, workers, args)
            throughput[backend] = {n: lv.publishes / lv.seconds for n, lv in levels.items()}
    if "pg1" in throughput and "pg4" in throughput:
        print("\n## PostgreSQL, 4 workers over 1 worker (publishes/s)\n")
        for n in args.levels:
            one, four = throughput["pg1"][n], throughput["pg4"][n]
            ratio = four / one if one else float("inf")
            print(f"- {n} clients: {four:.1f} / {one:.1f} = {ratio:.2f}x")
        print(f"\n({os.cpu_count()} cores on this machine, shared with the clients)")


if __name__ == "__main__":
    main()

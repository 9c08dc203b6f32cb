"""A node under load: back-pressure (503, never 500), node processes sharing one PostgreSQL,
and a worker killed in the middle of a burst."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, func, select

from dpnode.node.db.models import LedgerEntry, PublishKey
from dpnode.sdk._client import _read_frame
from tests.e2e.conftest import Server
from tests.e2e.test_publish_server import _setup

API = "/api/v1"
postgres_only = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


def _post_publish(
    url: str, token: str, frame: bytes, key: str, epsilon: float, timeout: float = 60
) -> httpx.Response:
    return httpx.post(
        url + API + "/publish",
        params={"epsilon": epsilon},
        content=frame,
        timeout=timeout,
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": key},
    )


def _ledger_id(response: httpx.Response) -> int:
    manifest, _ = _read_frame(response.content)
    return int(manifest["receipt"]["ledger_id"])


def _rows(database_url: str) -> tuple[set[int], dict[str, int]]:
    """The ledger's ids, and the ledger id each idempotency key was charged under."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            ids = set(conn.execute(select(LedgerEntry.id)).scalars())
            keys = {k: i for k, i in conn.execute(select(PublishKey.key, PublishKey.ledger_id))}
            total = conn.execute(select(func.count()).select_from(LedgerEntry)).scalar_one()
    finally:
        engine.dispose()
    assert total == len(ids)
    return ids, keys


@pytest.fixture
def limited_server(server: Server) -> Server:
    server.stop()
    server.env["DPNODE_MAX_REQUESTS_IN_FLIGHT"] = "2"
    server.start()
    return server


def test_a_flood_over_the_in_flight_limit_gets_200_or_503_never_500_and_recovers(
    limited_server: Server, database_url: str
) -> None:
    client, frame = _setup(limited_server)
    token = client.token or ""
    url = limited_server.url
    answers: list[httpx.Response] = []
    charged: dict[str, int] = {}
    lock = threading.Lock()

    def flood(_: int) -> None:
        for _ in range(3):
            key = uuid.uuid4().hex
            published = _post_publish(url, token, frame, key, 0.01)
            searched = httpx.get(
                url + API + "/search", headers={"Authorization": f"Bearer {token}"}, timeout=60
            )
            with lock:
                answers.extend([published, searched])
                if published.status_code == 200:
                    charged[key] = _ledger_id(published)

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(flood, range(32)))
    statuses = [r.status_code for r in answers]
    assert set(statuses) == {200, 503}, sorted(set(statuses))
    for refused in (r for r in answers if r.status_code == 503):
        assert refused.json()["error"] == "overloaded"
        assert refused.headers["Retry-After"] == "1"
    # Nothing was done for a 503: the charged publishes are exactly those answered 200.
    ids, keys = _rows(database_url)
    assert ids == set(charged.values()) and keys == charged
    # The node recovers by itself once the flood is over.
    receipt = client.publish_frame(frame, epsilon=0.01)[1]
    assert receipt["ledger_id"] not in ids
    assert len(client.search()) == 1


def test_the_sdk_waits_out_a_503_and_its_publish_is_charged_once(
    server: Server, database_url: str
) -> None:
    server.stop()
    server.env["DPNODE_MAX_REQUESTS_IN_FLIGHT"] = "1"
    server.start()
    client, frame = _setup(server)
    auth = {"Authorization": f"Bearer {client.token}"}

    def slow_body() -> Iterator[bytes]:
        for _ in range(40):  # 4 s in flight, reading its body; not a frame: answered 422
            time.sleep(0.1)
            yield b"x" * 64

    holder = threading.Thread(
        target=lambda: httpx.post(
            server.url + API + "/publish",
            params={"epsilon": 0.01},
            content=slow_body(),
            headers=auth,
            timeout=60,
        )
    )
    holder.start()
    try:
        time.sleep(0.5)  # nothing else in flight: the slow request takes the only slot
        probe = httpx.get(server.url + API + "/search", headers=auth)
        assert probe.status_code == 503 and probe.json()["error"] == "overloaded"
        # a busy node is still healthy: the health check is never refused
        assert httpx.get(server.url + API + "/health").status_code == 200
        start = time.monotonic()
        _, receipt = client.publish_frame(frame, epsilon=0.01)
        waited = time.monotonic() - start
    finally:
        holder.join()
    assert waited >= 1.0  # refused at least once, then resent after Retry-After
    ids, keys = _rows(database_url)
    assert ids == {receipt["ledger_id"]} and list(keys.values()) == [receipt["ledger_id"]]
    assert client.budget().spent_epsilon == pytest.approx(0.01)


@postgres_only
def test_two_node_processes_on_one_postgresql_charge_a_budget_for_20_exactly(
    tmp_path: Path, database_url: str
) -> None:
    first = Server(tmp_path / "data", database_url)
    first.env["DPNODE_DEFAULT_EPSILON_BUDGET"] = "2.0"  # 20 publishes of 0.1
    first.start()
    second = Server(tmp_path / "data", database_url)  # the same blob folder and secret
    second.env = first.env
    try:
        second.start()
        client, frame = _setup(first)
        token = client.token or ""
        urls = [first.url, second.url]

        def publish(i: int) -> tuple[str, httpx.Response]:
            key = uuid.uuid4().hex
            return key, _post_publish(urls[i % 2], token, frame, key, 0.1)

        with ThreadPoolExecutor(max_workers=64) as pool:
            answers = list(pool.map(publish, range(64)))
    finally:
        second.stop()
        first.stop()
    released = {key: _ledger_id(r) for key, r in answers if r.status_code == 200}
    refused = [r for _, r in answers if r.status_code != 200]
    assert len(released) == 20
    assert {r.status_code for r in refused} == {403}
    assert {r.json()["error"] for r in refused} == {"budget_exceeded"}
    ids, keys = _rows(database_url)
    assert ids == set(released.values()) and keys == released


def _workers(pid: int) -> list[int]:
    """The worker processes uvicorn started (its children that serve, not its helpers)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = []
    for child in map(int, children):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"multiprocessing" in command and b"resource_tracker" not in command:
            found.append(child)
    return found


@postgres_only
def test_a_worker_killed_mid_burst_loses_no_charge_and_a_retry_is_charged_once(
    tmp_path: Path, database_url: str
) -> None:
    node = Server(tmp_path / "data", database_url, "--workers", "2")
    node.start()
    try:
        assert node.process is not None
        deadline = time.monotonic() + 20
        while len(workers := _workers(node.process.pid)) < 2:
            assert time.monotonic() < deadline, "uvicorn did not start 2 workers"
            time.sleep(0.1)
        client, frame = _setup(node)
        token = client.token or ""
        answers: dict[str, httpx.Response | None] = {}
        lock = threading.Lock()

        def burst(_: int) -> None:
            for _ in range(15):
                key = uuid.uuid4().hex
                try:
                    response: httpx.Response | None = _post_publish(
                        node.url, token, frame, key, 0.01
                    )
                except httpx.TransportError:  # the worker died with the request
                    response = None
                with lock:
                    answers[key] = response

        threads = [threading.Thread(target=burst, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while sum(r is not None for r in list(answers.values())) < 20:
            assert time.monotonic() < deadline, "the burst did not get going"
            time.sleep(0.01)
        os.kill(workers[0], signal.SIGKILL)
        for t in threads:
            t.join(timeout=60)
        # uvicorn starts a new worker in its place; the node serves on.
        deadline = time.monotonic() + 20
        while len(_workers(node.process.pid)) < 2 or workers[0] in _workers(node.process.pid):
            assert time.monotonic() < deadline, "the killed worker was not replaced"
            time.sleep(0.1)
        lost = [key for key, r in answers.items() if r is None]
        # Retried with their keys after the restart: each is charged at most once.
        retried = {key: _post_publish(node.url, token, frame, key, 0.01) for key in lost}
        replayed = {k: _post_publish(node.url, token, frame, k, 0.01) for k in list(answers)[:5]}
    finally:
        node.stop()

    statuses = {r.status_code for r in answers.values() if r is not None}
    assert statuses == {200}, statuses
    released = {k: _ledger_id(r) for k, r in answers.items() if r is not None}
    for key, response in retried.items():
        if response.status_code == 200:
            released[key] = _ledger_id(response)
        else:  # charged by the killed worker, whose answer was lost with it
            assert response.json()["error"] == "publish_in_progress", response.text
    ids, keys = _rows(database_url)
    # Every result released is charged, under its own key, and nothing is charged twice.
    assert {k: keys[k] for k in released} == released
    assert set(keys.values()) == ids and len(keys) == len(ids)
    assert set(keys) <= set(answers)
    for key, response in replayed.items():  # a retry of an answered publish: its answer
        if answers[key] is not None:
            assert response.status_code == 200 and _ledger_id(response) == released[key]

"""A network of nodes as real processes on loopback: one network and three members, each with
its own SQLite database. The members join, a search by tag finds datasets on all three, a
stopped member drops out of searches within the documented interval, and comes back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from dpnode import sdk
from tests.e2e.conftest import Server

#: heartbeats every half second; a member silent for two seconds is unreachable
FAST = {"DPNODE_NETWORK_HEARTBEAT_SECONDS": "0.5", "DPNODE_NETWORK_UNREACHABLE_AFTER_SECONDS": "2"}
SITES = ("site-a", "site-b", "site-c")
PASSWORD = "a long password"


def _server(root: Path, name: str, *args: str) -> Server:
    server = Server(root / name / "data", f"sqlite:///{root / name / 'dpnode.sqlite3'}", *args)
    server.env |= FAST | {"DPNODE_NODE_NAME": name}
    return server


@pytest.fixture
def network(tmp_path: Path) -> Iterator[tuple[Server, list[Server]]]:
    for name in ("net", *SITES):
        (tmp_path / name).mkdir()
    net = _server(tmp_path, "net", "--network")
    members = [_server(tmp_path, name) for name in SITES]
    try:
        for server in (net, *members):
            server.start()
        yield net, members
    finally:
        for server in (net, *members):
            server.stop()  # those that started


def _found(net: Server, tag: str) -> set[str]:
    body = httpx.get(net.url + "/api/v1/network/search", params={"tags": [tag]}).json()
    return {item["node"] for item in body["datasets"]}


def _wait_for(condition: object, seconds: float) -> float:
    """Poll ``condition`` until it holds; how long it took."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if condition():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s")


def test_members_join_are_found_drop_out_when_stopped_and_come_back(
    network: tuple[Server, list[Server]],
) -> None:
    net, members = network
    net.add_users(("admin@net.org", "admin", PASSWORD))
    admin = httpx.post(
        net.url + "/api/v1/auth/login", json={"email": "admin@net.org", "password": PASSWORD}
    ).json()["access_token"]
    rng = np.random.default_rng(3)
    for site, server in zip(SITES, members, strict=True):
        server.add_users((f"owner@{site}.org", "data_owner", PASSWORD))
        server.add_users((f"ds@{site}.org", "data_scientist", PASSWORD))
        owner = sdk.login(server.url, email=f"owner@{site}.org", password=PASSWORD)
        owner.upload_dataset(
            f"{site}-cohort",
            {"age": rng.integers(18, 90, 200).astype(float)},
            bounds={"age": (0, 120)},
            tags=["health", site],
        )
        token = httpx.post(
            net.url + "/api/v1/network/tokens",
            json={"note": site},
            headers={"Authorization": f"Bearer {admin}"},
        ).json()["token"]
        out = server.cli_here("network", "join", net.url, "--token", token, "--url", server.url)
        assert f"as {site!r}" in out
    assert _found(net, "health") == set(SITES)

    listed = sdk.search(tags=["health"], network=net.url)
    assert {d.node.name for d in listed} == set(SITES)
    assert all(isinstance(d, sdk.DatasetListing) for d in listed)
    net_client = sdk.network(net.url).login("site-b", email="ds@site-b.org", password=PASSWORD)
    found = {d.node.name: d for d in sdk.search(tags=["health"], network=net.url)}
    assert isinstance(found["site-b"], sdk.DatasetHandle)
    assert found["site-b"].node == sdk.NodeRef("site-b", members[1].url)
    assert isinstance(found["site-a"], sdk.DatasetListing)
    assert net_client.clients["site-b"].url == members[1].url

    stopped = members[2]
    stopped.stop()
    took = _wait_for(lambda: _found(net, "health") == {"site-a", "site-b"}, 8)
    assert took < 4  # the documented 2 s interval, and a poll's and a beat's slack
    nodes = {n.name: n.reachable for n in sdk.network(net.url).nodes()}
    assert nodes == {"site-a": True, "site-b": True, "site-c": False}

    stopped.start()
    _wait_for(lambda: _found(net, "health") == set(SITES), 10)
    status = stopped.cli("network", "status")  # as a process, as an admin runs it
    assert net.url in status and ": ok" in status


def test_the_sdk_waits_out_a_busy_network_and_a_search_flood_is_refused_not_failed(
    tmp_path: Path,
) -> None:
    (tmp_path / "net").mkdir()
    net = _server(tmp_path, "net", "--network")
    net.env |= {
        "DPNODE_MAX_REQUESTS_IN_FLIGHT": "1",
        "DPNODE_NETWORK_SEARCH_MAX_PER_ADDRESS": "5",
    }
    net.start()
    try:

        def slow_body() -> Iterator[bytes]:
            for _ in range(30):  # 3 s in flight, reading its body; not a join: refused
                time.sleep(0.1)
                yield b"x" * 64

        holder = threading.Thread(
            target=lambda: httpx.post(
                net.url + "/api/v1/network/join", content=slow_body(), timeout=60
            )
        )
        holder.start()
        try:
            time.sleep(0.5)  # the slow request holds the only slot
            probe = httpx.get(net.url + "/api/v1/network/nodes")
            assert probe.status_code == 503 and probe.json()["error"] == "overloaded"
            start = time.monotonic()
            assert sdk.Network(net.url).nodes() == []  # asked again after Retry-After
            assert time.monotonic() - start >= 1.0
        finally:
            holder.join()
        # only the answered request counted (a 503 is refused before the limit is asked):
        # four more fit, then 429, never 500
        statuses = [httpx.get(net.url + "/api/v1/network/search").status_code for _ in range(6)]
        assert statuses == [200, 200, 200, 200, 429, 429]
        with pytest.raises(sdk.RateLimitedError) as caught:
            sdk.search(tags=["health"], network=net.url)
        assert caught.value.retry_after is not None and 0 < caught.value.retry_after <= 60
    finally:
        net.stop()

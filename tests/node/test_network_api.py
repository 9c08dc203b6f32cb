"""A network's directory through its real app: join tokens, joining, catalogs, heartbeats,
removal, leaving, and search; the member's side through its real database."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.core.errors import DPNodeError as NodeError
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.models import AuditEvent, NetworkJoinToken, NetworkMember, NetworkMembership
from dpnode.node.network import membership
from dpnode.node.services.security import secret_digest
from dpnode.node.services.throttle import RequestLimit
from dpnode.node.settings import Settings
from tests.conftest import PASSWORD, login, make_user
from tests.statuses import RecordStatuses, Seen, spec_of, undocumented

NET = "http://testserver"


@pytest.fixture
def net_context(settings: Settings) -> Iterator[NodeContext]:
    ctx = NodeContext.from_settings(
        settings.model_copy(update={"role": "network", "network_max_datasets": 3})
    )
    yield ctx
    ctx.close()


@pytest.fixture
def net(net_context: NodeContext) -> Iterator[TestClient]:
    app = create_app(context=net_context)
    seen: set[Seen] = set()
    app.add_middleware(RecordStatuses, seen=seen)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    assert not undocumented(spec_of(app), seen)


@pytest.fixture
def net_admin(net: TestClient, net_context: NodeContext) -> dict[str, str]:
    make_user(net_context, "netadmin@example.org", "admin")
    return login(net, "netadmin@example.org")


@pytest.fixture
def member(tmp_path: Path, sqlite_template: Path) -> Iterator[tuple[NodeContext, TestClient]]:
    """A member node of its own (SQLite), with an owner and one dataset tagged health."""
    shutil.copy(sqlite_template, tmp_path / "member.sqlite3")
    settings = Settings(
        data_dir=tmp_path / "member",
        database_url=f"sqlite:///{tmp_path / 'member.sqlite3'}",
        argon2_memory_kib=8 * 1024,
        argon2_time_cost=1,
        network_heartbeat_seconds=3600,  # the tests beat by hand
    )
    ctx = NodeContext.from_settings(settings)
    make_user(ctx, "owner@site-a.org", "data_owner")
    with TestClient(create_app(context=ctx)) as client:
        owner = sdk.login(
            NET, email="owner@site-a.org", password=PASSWORD, transport=client._transport
        )
        owner.upload_dataset(
            "cohort-a",
            {"age": np.arange(50.0), "sex": np.array(["f", "m"] * 25)},
            bounds={"age": (0, 120)},
            categories={"sex": ["f", "m"]},
            tags=["health", "site-a"],
        )
        yield ctx, client
    ctx.close()


def _token(net: TestClient, headers: dict[str, str], note: str = "site a") -> str:
    answer = net.post("/api/v1/network/tokens", json={"note": note}, headers=headers)
    assert answer.status_code == 201, answer.text
    token: str = answer.json()["token"]
    return token


def _join(ctx: NodeContext, net: TestClient, token: str, name: str = "site-a") -> NetworkMembership:
    return membership.join(
        ctx.sessions, NET, token, name=name, url="http://site-a:8000", transport=net._transport
    )


def _actions(ctx: NodeContext) -> list[str]:
    with ctx.sessions() as session:
        return list(session.scalars(select(AuditEvent.action).order_by(AuditEvent.id)))


def test_join_tokens_are_hashed_at_rest_used_once_and_revocable(
    net: TestClient,
    net_context: NodeContext,
    net_admin: dict[str, str],
    member: tuple[NodeContext, TestClient],
) -> None:
    ctx, _ = member
    token = _token(net, net_admin)
    with net_context.sessions() as session:
        row = session.scalars(select(NetworkJoinToken)).one()
        assert row.digest == secret_digest(token) and token not in repr(row.__dict__)
    listed = net.get("/api/v1/network/tokens", headers=net_admin).json()
    assert [t["note"] for t in listed] == ["site a"] and "token" not in listed[0]

    joined = _join(ctx, net, token)
    assert joined.credential.startswith("dpm_")
    with net_context.sessions() as session:
        stored = session.scalars(select(NetworkMember)).one()
        assert stored.credential_digest == secret_digest(joined.credential)
        assert joined.credential not in repr(stored.__dict__)
    with pytest.raises(NodeError, match="already joined"):
        _join(ctx, net, token, name="site-b")
    reuse = {"token": token, "name": "site-b", "url": "http://b", "catalog": {"datasets": []}}
    answer = net.post("/api/v1/network/join", json=reuse)
    assert answer.status_code == 401 and "already used" in answer.json()["detail"]

    revoked = _token(net, net_admin, "never used")
    ident = net.get("/api/v1/network/tokens", headers=net_admin).json()[0]["id"]
    assert net.delete(f"/api/v1/network/tokens/{ident}", headers=net_admin).status_code == 204
    body = {"token": revoked, "name": "site-c", "url": "http://c", "catalog": {"datasets": []}}
    refused = net.post("/api/v1/network/join", json=body)
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    assert net.delete("/api/v1/network/tokens/999", headers=net_admin).status_code == 404
    assert [m["name"] for m in net.get("/api/v1/network/members", headers=net_admin).json()] == [
        "site-a"
    ]
    assert _actions(net_context).count("network.token.issue") == 2
    assert "network.token.revoke" in _actions(net_context) and "network.join" in _actions(ctx)


def test_only_the_network_admin_issues_tokens_and_members_prove_who_they_are(
    net: TestClient, net_context: NodeContext, net_admin: dict[str, str]
) -> None:
    make_user(net_context, "ds@example.org", "data_scientist")
    scientist = login(net, "ds@example.org")
    assert net.post("/api/v1/network/tokens", json={}, headers=scientist).status_code == 403
    assert net.post("/api/v1/network/tokens", json={}).status_code == 401
    beat = {"catalog_digest": "0" * 64}
    assert net.post("/api/v1/network/heartbeat", json=beat).status_code == 401
    forged = {"Authorization": "Bearer dpm_forged"}
    answer = net.post("/api/v1/network/heartbeat", json=beat, headers=forged)
    assert answer.status_code == 401 and "not a member" in answer.json()["detail"]
    # a network holds no data: the node's data routes are not served
    assert net.get("/api/v1/datasets", headers=net_admin).status_code == 404


def test_search_finds_member_datasets_with_their_node_and_a_login_gives_handles(
    net: TestClient, net_admin: dict[str, str], member: tuple[NodeContext, TestClient]
) -> None:
    ctx, node = member
    _join(ctx, net, _token(net, net_admin))
    found = net.get("/api/v1/network/search", params={"tags": ["health"]}).json()["datasets"]
    assert [(f["node"], f["node_url"], f["dataset"]["name"]) for f in found] == [
        ("site-a", "http://site-a:8000", "cohort-a")
    ]
    columns = {c["name"]: c for c in found[0]["dataset"]["columns"]}
    assert columns["age"]["bounds"] == [0, 120] and columns["sex"]["categories"] == ["f", "m"]
    assert "owner" not in found[0]["dataset"]  # no member's accounts on the network
    assert net.get("/api/v1/network/search", params={"tags": ["genomics"]}).json() == {
        "datasets": []
    }

    network = sdk.Network(NET, transport=net._transport)
    [listing] = network.search(tags=["health"])
    assert isinstance(listing, sdk.DatasetListing)
    assert listing.node == sdk.NodeRef("site-a", "http://site-a:8000")
    assert listing.shape == (50, 2) and listing.bounds["age"] == (0, 120)
    make_user(ctx, "ds@site-a.org", "data_scientist")
    with pytest.raises(sdk.NotFoundError, match="no node 'site-z'"):
        network.login("site-z", email="ds@site-a.org", password=PASSWORD)
    network.login({"site-a": ("ds@site-a.org", PASSWORD)}, transport=node._transport)
    [handle] = network.search(tags=["health"])
    assert isinstance(handle, sdk.DatasetHandle) and handle.name == "cohort-a"
    assert handle.node == sdk.NodeRef("site-a", "http://site-a:8000")
    assert handle["age"].float().mean().publish(epsilon=1.0).shape == ()  # a real handle


def test_a_heartbeat_pushes_a_changed_catalog_and_keeps_a_member_reachable(
    net: TestClient,
    net_context: NodeContext,
    net_admin: dict[str, str],
    member: tuple[NodeContext, TestClient],
) -> None:
    ctx, node = member
    row = _join(ctx, net, _token(net, net_admin))
    owner = sdk.login(NET, email="owner@site-a.org", password=PASSWORD, transport=node._transport)
    owner.upload_dataset("cohort-b", {"x": np.ones(10)}, bounds={"x": (0, 1)}, tags=["health"])
    assert (
        len(net.get("/api/v1/network/search", params={"tags": ["health"]}).json()["datasets"]) == 1
    )
    assert membership.beat(ctx.sessions, row.id, transport=net._transport) == "ok"
    found = net.get("/api/v1/network/search", params={"tags": ["health"]}).json()["datasets"]
    assert [f["dataset"]["name"] for f in found] == ["cohort-a", "cohort-b"]
    assert _actions(net_context).count("network.catalog") == 1
    assert membership.beat(ctx.sessions, row.id, transport=net._transport) == "ok"
    assert _actions(net_context).count("network.catalog") == 1  # unchanged: not sent again

    # silent past the interval: unreachable and out of searches; a heartbeat brings it back
    net_context.settings = net_context.settings.model_copy(
        update={"network_unreachable_after_seconds": 1.0}
    )
    time.sleep(1.1)
    [state] = net.get("/api/v1/network/nodes").json()
    assert state["name"] == "site-a" and state["reachable"] is False
    assert net.get("/api/v1/network/search").json() == {"datasets": []}
    assert membership.beat(ctx.sessions, row.id, transport=net._transport) == "ok"
    # (a longer interval again, so that a slow machine cannot make it lapse before the checks)
    net_context.settings = net_context.settings.model_copy(
        update={"network_unreachable_after_seconds": 60}
    )
    assert net.get("/api/v1/network/nodes").json()[0]["reachable"] is True
    assert len(net.get("/api/v1/network/search").json()["datasets"]) == 2


def test_an_invalid_catalog_is_refused_whole_and_nothing_is_stored(
    net: TestClient,
    net_context: NodeContext,
    net_admin: dict[str, str],
    member: tuple[NodeContext, TestClient],
) -> None:
    ctx, _ = member
    row = _join(ctx, net, _token(net, net_admin))
    auth = {"Authorization": f"Bearer {row.credential}"}
    good = net.get("/api/v1/network/search").json()["datasets"][0]["dataset"]
    column = good["columns"][0]
    cases = {
        "row_count: Input should be a valid integer": {**good, "row_count": "50"},
        "Extra inputs are not permitted": {**good, "owner": "owner@site-a.org"},
        "String should match pattern": {**good, "tags": ["Health!"]},
        "at most 8 items": {**good, "columns": [{**column, "shape": [1] * 9}]},
        "at most 200 characters": {**good, "name": "x" * 201},
    }
    for why, dataset in cases.items():
        answer = net.put("/api/v1/network/catalog", json={"datasets": [dataset]}, headers=auth)
        assert answer.status_code == 422 and why in answer.json()["detail"], (why, answer.text)
    infinite = json.dumps({"datasets": [good]}).replace("[0.0, 120.0]", "[0, 1e999]")
    answer = net.put("/api/v1/network/catalog", content=infinite.encode(), headers=auth)
    assert answer.status_code == 422 and "finite number" in answer.json()["detail"]
    too_many = {"datasets": [{**good, "name": f"d{i}"} for i in range(4)]}
    answer = net.put("/api/v1/network/catalog", json=too_many, headers=auth)
    assert answer.status_code == 422 and "limit of 3" in answer.json()["detail"]
    answer = net.put(
        "/api/v1/network/catalog", content=b"{" + b" " * 5_000_000 + b"}", headers=auth
    )
    assert answer.status_code == 413
    answer = net.put("/api/v1/network/catalog", content=b"not json", headers=auth)
    assert answer.status_code == 422
    with net_context.sessions() as session:
        stored = session.scalars(select(NetworkMember)).one()
        assert [d["name"] for d in stored.catalog] == ["cohort-a"]
    assert _actions(net_context).count("network.catalog") == 0


def test_a_removed_member_is_told_and_a_member_can_leave(
    net: TestClient,
    net_context: NodeContext,
    net_admin: dict[str, str],
    member: tuple[NodeContext, TestClient],
) -> None:
    ctx, _ = member
    row = _join(ctx, net, _token(net, net_admin))
    assert net.delete("/api/v1/network/members/site-a", headers=net_admin).status_code == 204
    assert net.delete("/api/v1/network/members/site-a", headers=net_admin).status_code == 404
    assert net.get("/api/v1/network/search").json() == {"datasets": []}
    result = membership.beat(ctx.sessions, row.id, transport=net._transport)
    assert result.startswith("removed by the network")
    with ctx.sessions() as session:
        assert session.get(NetworkMembership, row.id).last_result == result  # type: ignore[union-attr]
    membership.leave(ctx.sessions, NET, transport=net._transport)  # already removed: forgets it

    again = _join(ctx, net, _token(net, net_admin))
    membership.leave(ctx.sessions, NET, transport=net._transport)
    assert net.get("/api/v1/network/members", headers=net_admin).json() == []
    with ctx.sessions() as session:
        assert session.get(NetworkMembership, again.id) is None
    with pytest.raises(NodeError, match="not a member"):
        membership.leave(ctx.sessions, NET, transport=net._transport)
    assert {"network.remove", "network.leave"} <= set(_actions(net_context))
    assert _actions(ctx).count("network.leave") == 2


def test_a_catalog_change_wakes_the_heartbeat_and_a_network_down_is_only_noted(
    net: TestClient, net_admin: dict[str, str], member: tuple[NodeContext, TestClient]
) -> None:
    ctx, node = member
    row = _join(ctx, net, _token(net, net_admin))
    beats = membership.Heartbeats(ctx.sessions, 3600, transport=net._transport)
    beats.watch(ctx.sessions)
    beats.start()  # beats once now, then only when woken (the interval is an hour)
    try:
        owner = sdk.login(
            NET, email="owner@site-a.org", password=PASSWORD, transport=node._transport
        )
        owner.upload_dataset("cohort-b", {"x": np.ones(10)}, bounds={"x": (0, 1)}, tags=["health"])
        deadline = time.monotonic() + 30
        names: list[str] = []
        while time.monotonic() < deadline and "cohort-b" not in names:
            time.sleep(0.1)
            found = net.get("/api/v1/network/search", params={"tags": ["health"]}).json()
            names = [f["dataset"]["name"] for f in found["datasets"]]
        assert names == ["cohort-a", "cohort-b"]
    finally:
        beats.stop()
    # no network answers there (no transport: a real connection to a name that does not
    # resolve): the beat says so, and raises nothing
    result = membership.beat(ctx.sessions, row.id, timeout=2)
    assert result.startswith("cannot reach the network at http://testserver")
    with ctx.sessions() as session:
        kept = session.get(NetworkMembership, row.id)
        assert kept is not None and kept.last_result == result and kept.last_ok_at is not None


def test_public_routes_are_limited_per_address_and_recover_and_members_are_not(
    net: TestClient,
    net_context: NodeContext,
    net_admin: dict[str, str],
    member: tuple[NodeContext, TestClient],
) -> None:
    ctx, node = member
    row = _join(ctx, net, _token(net, net_admin))
    small = {"network_search_max_per_address": 6, "network_search_window_seconds": 1}
    net_context.network_searches = RequestLimit.network_searches(
        net_context.settings.model_copy(update=small)
    )
    # a burst of twenty searches and member lists at once from one address: six are
    # answered, the others refused with 429 and Retry-After, none fails
    paths = ["/api/v1/network/search", "/api/v1/network/nodes"] * 10
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(net.get, paths))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 6 + [429] * 14
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.headers["Retry-After"] == "1"
    assert refused.json() == {
        "error": "rate_limited",
        "detail": "too many network searches from your address; try again in 1 second",
    }
    network = sdk.Network(NET, transport=net._transport)
    with pytest.raises(sdk.RateLimitedError) as caught:
        network.search(tags=["health"])
    assert caught.value.retry_after == 1 and "network searches" in str(caught.value)

    # the member (from the same address here) and the admin are not counted nor refused
    owner = sdk.login(NET, email="owner@site-a.org", password=PASSWORD, transport=node._transport)
    owner.upload_dataset("cohort-b", {"x": np.ones(10)}, bounds={"x": (0, 1)}, tags=["health"])
    for _ in range(3):  # heartbeats, the first pushing the changed catalog
        assert membership.beat(ctx.sessions, row.id, transport=net._transport) == "ok"
    assert _actions(net_context).count("network.catalog") == 1
    assert net.get("/api/v1/network/members", headers=net_admin).status_code == 200
    other = TestClient(net.app, client=("192.0.2.7", 50000))  # another address: its own count
    assert other.get("/api/v1/network/nodes").status_code == 200

    time.sleep(1.05)  # the window has passed: searches are answered again
    found = network.search(tags=["health"])
    assert sorted(d.name for d in found) == ["cohort-a", "cohort-b"]

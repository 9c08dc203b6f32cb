"""Idempotency keys: a retried publish gets its first answer, and is charged once."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from httpx import Response
from sqlalchemy import func, select, update
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.context import NodeContext
from dpnode.node.db.base import utcnow
from dpnode.node.db.models import AuditEvent, LedgerEntry, PublishKey, User
from dpnode.node.services import budget, idempotency
from dpnode.node.services import publish as service
from dpnode.node.services.budget import EPSILON_UNIT, Cost, units_down
from dpnode.node.services.leases import LeaseKeeper
from tests.conftest import login, make_user
from tests.node.conftest import upload_ok
from tests.node.frames import read_frame


def _mean_frame(dataset_id: int, n: int = 50, scale: float = 1.0) -> bytes:
    b = GraphBuilder()
    x = b.input(f"dataset:{dataset_id}/x", "float64", (n,))
    out = b.op("mean", x) if scale == 1.0 else b.op("mul", b.op("mean", x), scale)
    return encode(b.build([out]))


@pytest.fixture
def dataset_id(http: TestClient, owner_h: dict[str, str]) -> int:
    data = {"x": np.random.default_rng(0).uniform(0, 10, 50)}
    body = upload_ok(http, owner_h, "xs", data, bounds={"x": (0, 10)})
    return int(body["id"])


def _publish(
    http: TestClient,
    headers: dict[str, str],
    frame: bytes,
    key: str | bytes | None,
    epsilon: float = 0.5,
    **params: Any,
) -> Response:
    extra: dict[str, Any] = {"Content-Type": "application/octet-stream"}
    if key is not None:
        extra["Idempotency-Key"] = key
    return http.post(
        "/api/v1/publish",
        params={"epsilon": epsilon, **params},
        content=frame,
        headers=headers | extra,
    )


def _ledger_rows(context: NodeContext, user_id: int) -> int:
    with context.sessions() as session:
        count = session.scalar(
            select(func.count()).select_from(LedgerEntry).where(LedgerEntry.user_id == user_id)
        )
    return int(count or 0)


def test_a_retry_with_the_same_key_gets_the_first_answer_charged_once(
    http: TestClient, context: NodeContext, ds_h: dict[str, str], scientist: User, dataset_id: int
) -> None:
    frame = _mean_frame(dataset_id)
    first = _publish(http, ds_h, frame, "key-1")
    assert first.status_code == 200, first.text
    again = _publish(http, ds_h, frame, "key-1")
    assert again.status_code == 200, again.text
    assert again.content == first.content  # values and receipt, byte for byte
    manifest, _ = read_frame(again.content)
    assert _ledger_rows(context, scientist.id) == 1
    budget_now = http.get("/api/v1/budget", headers=ds_h).json()
    assert budget_now["spent_epsilon"] == 0.5
    (entry,) = http.get("/api/v1/ledger", headers=ds_h).json()
    assert entry["id"] == manifest["receipt"]["ledger_id"]
    with context.sessions() as session:  # the operator sees which key the charge claimed
        (charged,) = session.scalars(
            select(AuditEvent).where(AuditEvent.action == "privacy.charge")
        )
    assert charged.target_id == entry["id"] and charged.detail["idempotency_key"] == "key-1"
    # without a key, or with a new one, the same graph is a new publish
    assert _publish(http, ds_h, frame, None).status_code == 200
    assert _publish(http, ds_h, frame, "key-2").content != first.content
    assert _ledger_rows(context, scientist.id) == 3


def test_a_stored_answer_is_replayed_without_reading_anything(
    http: TestClient,
    context: NodeContext,
    owner_h: dict[str, str],
    ds_h: dict[str, str],
    scientist: User,
    dataset_id: int,
) -> None:
    frame = _mean_frame(dataset_id)
    first = _publish(http, ds_h, frame, "k")
    assert first.status_code == 200, first.text
    deleted = http.delete(f"/api/v1/datasets/{dataset_id}", headers=owner_h)
    assert deleted.status_code == 204, deleted.text
    # the graph names a dataset that is gone: only the stored answer can answer it
    again = _publish(http, ds_h, frame, "k")
    assert again.status_code == 200, again.text
    assert again.content == first.content
    assert _publish(http, ds_h, frame, "other").status_code == 404
    assert _ledger_rows(context, scientist.id) == 1


def test_the_same_key_with_another_request_is_refused(
    http: TestClient, context: NodeContext, ds_h: dict[str, str], scientist: User, dataset_id: int
) -> None:
    frame = _mean_frame(dataset_id)
    assert _publish(http, ds_h, frame, "k").status_code == 200
    for response in (
        _publish(http, ds_h, _mean_frame(dataset_id, scale=2.0), "k"),  # another graph
        _publish(http, ds_h, frame, "k", epsilon=0.25),  # another epsilon
        _publish(http, ds_h, frame, "k", delta=1e-7),  # another mechanism
    ):
        assert response.status_code == 409, response.text
        body = response.json()
        assert body["error"] == "conflict"
        assert "already names another publish" in body["detail"]
    assert _ledger_rows(context, scientist.id) == 1


def test_keys_are_per_user(
    http: TestClient,
    context: NodeContext,
    ds_h: dict[str, str],
    scientist: User,
    dataset_id: int,
) -> None:
    other = make_user(context, "ds2@example.org", "data_scientist")
    other_h = login(http, other.email)
    frame = _mean_frame(dataset_id)
    mine = _publish(http, ds_h, frame, "shared")
    theirs = _publish(http, other_h, frame, "shared")
    assert mine.status_code == theirs.status_code == 200
    assert mine.content != theirs.content  # two releases, two receipts
    assert _ledger_rows(context, scientist.id) == 1
    assert _ledger_rows(context, other.id) == 1
    # and another frame under the same key is still refused for each, separately
    assert _publish(http, other_h, _mean_frame(dataset_id, scale=2.0), "shared").status_code == 409


@pytest.mark.parametrize("key", ["", "a b", "x" * 129, "caf\xe9".encode("latin-1"), "tab\there"])
def test_a_malformed_key_is_refused(
    http: TestClient,
    context: NodeContext,
    ds_h: dict[str, str],
    scientist: User,
    dataset_id: int,
    key: str | bytes,
) -> None:
    response = _publish(http, ds_h, _mean_frame(dataset_id), key)
    assert response.status_code == 422, response.text
    assert "idempotency key" in response.json()["detail"]
    assert _ledger_rows(context, scientist.id) == 0


def test_the_longest_key_is_accepted(
    http: TestClient, ds_h: dict[str, str], dataset_id: int
) -> None:
    key = "".join(chr(c) for c in range(0x21, 0x7F))[:128].ljust(128, "~")
    assert _publish(http, ds_h, _mean_frame(dataset_id), key).status_code == 200


def test_a_refused_publish_claims_no_key(
    http: TestClient, context: NodeContext, ds_h: dict[str, str], scientist: User, dataset_id: int
) -> None:
    frame = _mean_frame(dataset_id)
    for _ in range(2):  # decided again each time
        refused = _publish(http, ds_h, frame, "k", epsilon=50.0)
        assert refused.status_code == 403 and refused.json()["error"] == "budget_exceeded"
    with context.sessions() as session:
        assert session.scalar(select(func.count()).select_from(PublishKey)) == 0
    # the key is free: a request that fits runs under it
    assert _publish(http, ds_h, frame, "k", epsilon=0.5).status_code == 200
    assert _ledger_rows(context, scientist.id) == 1


def test_a_retry_while_the_first_runs_is_told_to_retry(
    http: TestClient, context: NodeContext, ds_h: dict[str, str], scientist: User, dataset_id: int
) -> None:
    frame = _mean_frame(dataset_id)
    # charged and evaluated, its answer not stored yet: what a retry sees while it runs
    done = service.publish(context, scientist.id, frame, service.PublishRequest(0.5), "k")
    assert isinstance(done, service.Published)
    running = _publish(http, ds_h, frame, "k")
    assert running.status_code == 409, running.text
    assert running.json()["error"] == "publish_in_progress"
    assert "still running" in running.json()["detail"]
    service.answered(context, scientist.id, "k", b"the stored answer")
    assert _publish(http, ds_h, frame, "k").content == b"the stored answer"
    assert _ledger_rows(context, scientist.id) == 1


def test_identical_requests_racing_are_charged_once(
    http: TestClient, context: NodeContext, ds_h: dict[str, str], scientist: User, dataset_id: int
) -> None:
    frame = _mean_frame(dataset_id)
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: _publish(http, ds_h, frame, "race"), range(8)))
    codes = sorted(r.status_code for r in responses)
    assert set(codes) <= {200, 409}, [r.text for r in responses]
    answers = {r.content for r in responses if r.status_code == 200}
    assert len(answers) == 1  # every answer is the one release
    for r in responses:
        if r.status_code == 409:
            assert r.json()["error"] == "publish_in_progress"
    assert _ledger_rows(context, scientist.id) == 1
    assert _publish(http, ds_h, frame, "race").content in answers


def _cost(dataset_id: int) -> Cost:
    units = units_down(0.1, EPSILON_UNIT, "epsilon")
    return Cost("laplace", epsilon_units=units, dataset_ids=[dataset_id])


def test_concurrent_charges_with_one_key_charge_once(
    context: NodeContext, scientist: User, dataset_id: int
) -> None:
    claim = idempotency.Claim("k", idempotency.request_hash(b"frame", 0.1, None, None))

    def charge(_: int) -> str:
        try:
            budget.charge(
                context.serial_sessions,
                context.settings,
                scientist.id,
                _cost(dataset_id),
                claim=claim,
            )
        except idempotency.AlreadyClaimed:
            return "duplicate"
        return "charged"

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(charge, range(32)))
    assert results.count("charged") == 1 and results.count("duplicate") == 31
    assert _ledger_rows(context, scientist.id) == 1


def test_the_unique_constraint_backs_the_check_up(
    context: NodeContext, scientist: User, dataset_id: int
) -> None:
    claim = idempotency.Claim("k", "0" * 64)
    entry, _ = budget.charge(
        context.serial_sessions, context.settings, scientist.id, _cost(dataset_id), claim=claim
    )
    lease = context.settings.publish_lease_seconds
    with context.serial_sessions() as session, pytest.raises(idempotency.AlreadyClaimed):
        # without ensure_free, as a charge does (it looks only before refusing)
        idempotency.record(session, scientist.id, claim, entry.id, utcnow(), lease)


def test_expired_keys_are_purged_on_the_lease_rounds(
    http: TestClient, context: NodeContext, ds_h: dict[str, str], scientist: User, dataset_id: int
) -> None:
    frame = _mean_frame(dataset_id)
    assert _publish(http, ds_h, frame, "old").status_code == 200
    assert _publish(http, ds_h, frame, "recent").status_code == 200
    ttl = context.settings.publish_key_ttl_seconds
    with context.sessions() as session:
        session.execute(
            update(PublishKey)
            .where(PublishKey.key == "old")
            .values(created_at=utcnow() - timedelta(seconds=ttl + 1))
        )
        session.commit()

    def kept() -> list[str]:
        with context.sessions() as session:
            return sorted(session.scalars(select(PublishKey.key)))

    # until it is purged, the expired key still names its request
    assert _publish(http, ds_h, frame, "old", epsilon=0.25).status_code == 409
    keeper = LeaseKeeper(context.relaxed_sessions, 0.03, ttl)  # a round every 10 ms
    try:
        keeper.hold(scientist.id, "recent")  # the rounds run while a key is held
        deadline = time.monotonic() + 10
        while kept() != ["recent"] and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        keeper.close()
    assert kept() == ["recent"]
    assert _publish(http, ds_h, frame, "old", epsilon=0.25).status_code == 200  # free again


def test_a_publish_is_a_job_its_key_names(
    http: TestClient, context: NodeContext, ds_h: dict[str, str], scientist: User, dataset_id: int
) -> None:
    frame = _mean_frame(dataset_id)

    def state(key: str, headers: dict[str, str] = ds_h) -> Response:
        return http.get(f"/api/v1/publish/keys/{key}", headers=headers)

    assert state("job").status_code == 404  # nothing charged under it yet
    refused = _publish(http, ds_h, frame, "job", epsilon=50.0)
    assert refused.json()["error"] == "budget_exceeded"
    unknown = state("job")
    assert unknown.status_code == 404 and unknown.json()["error"] == "not_found"
    # charged and evaluated, not answered yet: what a client polling a long publish sees
    done = service.publish(context, scientist.id, frame, service.PublishRequest(0.5), "job")
    assert isinstance(done, service.Published)
    running = state("job")
    assert running.status_code == 200, running.text
    assert running.json()["state"] == "running"
    assert running.json()["ledger_id"] == done.receipt["ledger_id"]
    # another user sees nothing of it
    other = make_user(context, "ds2@example.org", "data_scientist")
    assert state("job", login(http, other.email)).status_code == 404
    service.answered(context, scientist.id, "job", b"the stored answer")
    assert state("job").json()["state"] == "answered"
    assert _publish(http, ds_h, frame, "job").content == b"the stored answer"
    assert _ledger_rows(context, scientist.id) == 1
    malformed = state("a%20b")
    assert malformed.status_code == 422 and "idempotency key" in malformed.json()["detail"]
    assert http.get("/api/v1/publish/keys/job").status_code == 401


def test_a_failed_evaluation_stores_its_answer_even_if_the_operators_record_fails(
    http: TestClient,
    context: NodeContext,
    ds_h: dict[str, str],
    dataset_id: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The audit line ran first among the tasks after the answer, and one that raised kept
    # the answer from being stored: the key stayed running, every retry was told to wait.
    def unreadable(*args: Any, **kwargs: Any) -> Any:
        raise OSError("the column's file is gone")

    failed: list[str] = []

    def audit_fails(*args: Any, **kwargs: Any) -> None:
        failed.append("record")
        raise RuntimeError("the database is busy")

    monkeypatch.setattr(context.store, "open_array", unreadable)
    monkeypatch.setattr(service, "record_failure", audit_fails)
    frame = _mean_frame(dataset_id)
    first = _publish(http, ds_h, frame, "k-failed")
    assert first.status_code == 200, first.text  # the public stand-in, charged
    monkeypatch.undo()
    assert failed == ["record"]  # the evaluation failed, and so did its audit line
    state = http.get("/api/v1/publish/keys/k-failed", headers=ds_h)
    assert state.json()["state"] == "answered", state.text
    retry = _publish(http, ds_h, frame, "k-failed")
    assert retry.status_code == 200 and retry.content == first.content

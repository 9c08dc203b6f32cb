"""Concurrent requests: on either backend, a burst of writers queues; none of them fails."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from sqlalchemy import event
from starlette.testclient import TestClient

from dpnode.core.errors import ConflictError, NotFoundError
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services import audit, datasets, models, users
from dpnode.node.services.datasets import DatasetUpload
from dpnode.node.services.models import ModelUpload
from dpnode.node.services.tabular import ColumnSpec
from tests.conftest import PASSWORD, login, make_user
from tests.node.conftest import upload

BURST = 8


def test_a_burst_of_logins_and_uploads_all_succeed(
    http: TestClient, admin: User, owner: User, scientist: User
) -> None:
    # Each login reads the account, then appends an audit line: on SQLite a deferred
    # transaction doing that failed with "database is locked" once another had committed.
    owner_h = login(http, owner.email)

    def log_in(i: int) -> int:
        body = {"email": owner.email if i % 2 else scientist.email, "password": PASSWORD}
        return http.post("/api/v1/auth/login", json=body).status_code

    def put(i: int) -> int:
        data = {"x": np.full(10, float(i))}
        return upload(http, owner_h, f"d{i}", data, bounds={"x": (0, BURST)}).status_code

    with ThreadPoolExecutor(BURST) as pool:
        logins = list(pool.map(log_in, range(BURST)))
        uploads = list(pool.map(put, range(BURST)))
    assert logins == [200] * BURST
    assert uploads == [201] * BURST
    admin_h = login(http, admin.email)
    names = [d["name"] for d in http.get("/api/v1/datasets", headers=admin_h).json()]
    assert sorted(names) == sorted(f"d{i}" for i in range(BURST))
    events = http.get("/api/v1/audit", params={"limit": 1000}, headers=admin_h).json()
    actions = [e["action"] for e in events]
    assert actions.count("auth.login") == BURST + 2
    assert actions.count("dataset.upload") == BURST


def test_two_admins_demoting_each_other_at_once_leave_an_admin(
    context: NodeContext, admin: User
) -> None:
    other = make_user(context, "admin2@example.org", "admin")
    # Both transactions pause after flushing their change, before counting the admins
    # left: without a lock each would still see the other as an active admin. With a lock
    # the second one never reaches the pause, so the pause gives up after a second.
    pause = threading.Barrier(2, timeout=1)

    def wait_for_the_other(*_: object) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            pause.wait()

    def demote(actor: User, target: User) -> str:
        with context.sessions() as session:
            event.listen(session, "after_flush", wait_for_the_other)
            try:
                users.update_user(session, context.hasher, actor, target.id, role="data_owner")
            except ConflictError as exc:
                return exc.detail
            return "demoted"

    with ThreadPoolExecutor(2) as pool:
        results = sorted(pool.map(demote, [admin, other], [other, admin]))
    assert results == ["demoted", "this change would leave the node without an active admin"]
    with context.sessions() as session:
        assert users.count_admins(session) == 1


def test_two_creations_racing_for_one_name_get_a_conflict_not_a_500(
    context: NodeContext, owner: User
) -> None:
    # Both pass the name check, then meet before inserting: the unique constraint decides.
    pause = threading.Barrier(2, timeout=1)

    def wait_for_the_other(*_: object) -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            pause.wait()

    def create(kind: str) -> str:
        with context.sessions() as session:
            event.listen(session, "before_flush", wait_for_the_other)
            try:
                if kind == "dataset":
                    spec = ColumnSpec(bounds={"x": (0, 1)}, categories={})
                    upload = DatasetUpload("same", "", [], spec, ["x"], {"x": np.zeros(3)})
                    datasets.create_dataset(session, context.store, owner, upload, max_elements=10)
                elif kind == "model":
                    model = ModelUpload("same", "", [], False, ["w"], {"w": np.zeros(3)})
                    models.create_model(session, context.store, owner, model, max_elements=10)
                else:
                    users.create_user(
                        session,
                        context.hasher,
                        None,
                        email="same@x.org",
                        password=PASSWORD,
                        role="data_scientist",
                    )
            except ConflictError as exc:
                return exc.detail
            return "created"

    conflicts = {
        "dataset": "a dataset named 'same' already exists",
        "model": "a model named 'same' already exists",
        "user": "a user with email same@x.org already exists",
    }
    for kind, conflict in conflicts.items():
        pause.reset()
        with ThreadPoolExecutor(2) as pool:
            results = sorted(pool.map(create, [kind, kind]))
        assert results == [conflict, "created"]


def test_two_deletes_racing_for_one_dataset_delete_it_once(
    context: NodeContext, http: TestClient, monkeypatch: Any
) -> None:
    # Both requests read the dataset before either deleted it: on PostgreSQL both answered
    # 204 and wrote an audit event each. Each pauses before its audit event; with the row
    # locked, the second one waits for the first instead (the pause gives up after a second).
    owner = make_user(context, "racer@example.org", "data_owner")
    h = login(http, "racer@example.org", PASSWORD)
    assert upload(http, h, "doomed", {"x": np.zeros(3)}, bounds={"x": (0, 1)}).status_code == 201
    pause = threading.Barrier(2, timeout=1)
    record = audit.record

    def paused(*args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(threading.BrokenBarrierError):
            pause.wait()
        return record(*args, **kwargs)

    monkeypatch.setattr(audit, "record", paused)

    def delete(_: int) -> str:
        with context.sessions() as session:
            actor = session.get(User, owner.id)
            assert actor is not None
            try:
                datasets.delete_dataset(session, context.store, actor, "doomed")
            except NotFoundError:
                return "not found"
            return "deleted"

    with ThreadPoolExecutor(2) as pool:
        assert sorted(pool.map(delete, range(2))) == ["deleted", "not found"]

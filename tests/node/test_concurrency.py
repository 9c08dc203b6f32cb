"""Concurrent requests: on either backend, a burst of writers queues; none of them fails."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from starlette.testclient import TestClient

from node.db.models import User
from tests.conftest import PASSWORD, login
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

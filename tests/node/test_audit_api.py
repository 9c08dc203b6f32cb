"""The audit log: every account change, upload, deletion, download and login, with its actor."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from starlette.testclient import TestClient

from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from tests.conftest import PASSWORD, login
from tests.node.conftest import refused, upload_model, upload_ok

AUDIT = "/api/v1/audit"


def events(http: TestClient, headers: dict[str, str], **params: Any) -> list[dict[str, Any]]:
    response = http.get(AUDIT, params=params, headers=headers)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()
    return found


def test_every_change_download_and_login_is_logged_with_its_actor(
    http: TestClient, admin: User, owner: User, scientist: User
) -> None:
    admin_h = login(http, admin.email)
    owner_h = login(http, owner.email)
    ds_h = login(http, scientist.email)
    http.post("/api/v1/auth/login", json={"email": "ds@example.org", "password": "wrong pass"})
    http.post("/api/v1/auth/login", json={"email": "nobody@example.org", "password": "x"})
    created = http.post(
        "/api/v1/users",
        json={"email": "ds2@example.org", "password": PASSWORD, "role": "data_scientist"},
        headers=owner_h,
    ).json()
    http.patch(
        f"/api/v1/users/{created['id']}",
        json={"is_active": False, "password": "p" * 9},
        headers=admin_h,
    )
    dataset = upload_ok(
        http,
        owner_h,
        "d",
        {"x": np.array([1.0, 2.0])},
        bounds={"x": (0, 5)},
        mock={"x": np.array([3.0])},
        tags=["t"],
        clamp=["x"],
    )
    http.get("/api/v1/datasets/d/mock", headers=ds_h)
    http.get("/api/v1/datasets/d/data", headers=owner_h)
    model = upload_model(
        http, owner_h, "m", {"w": np.ones(2, dtype=np.float32)}, architecture=b"arch", public=True
    ).json()
    assert http.get("/api/v1/models/m/weights", headers=ds_h).status_code == 200
    assert http.get("/api/v1/models/m/architecture", headers=ds_h).status_code == 200
    http.delete("/api/v1/models/m", headers=admin_h)
    http.delete("/api/v1/datasets/d", headers=owner_h)

    log = events(http, admin_h)
    lines = [
        (e["action"], e["actor_email"], e["target_type"], e["target_id"]) for e in reversed(log)
    ]
    assert lines == [
        ("user.create", None, "user", admin.id),  # the fixtures create users from the CLI side
        ("user.create", None, "user", owner.id),
        ("user.create", None, "user", scientist.id),
        ("auth.login", "admin@example.org", "user", admin.id),
        ("auth.login", "owner@example.org", "user", owner.id),
        ("auth.login", "ds@example.org", "user", scientist.id),
        ("auth.login_failed", None, None, None),
        ("auth.login_failed", None, None, None),
        ("user.create", "owner@example.org", "user", created["id"]),
        ("user.update", "admin@example.org", "user", created["id"]),
        ("dataset.upload", "owner@example.org", "dataset", dataset["id"]),
        ("dataset.mock_download", "ds@example.org", "dataset", dataset["id"]),
        ("dataset.download", "owner@example.org", "dataset", dataset["id"]),
        ("model.upload", "owner@example.org", "model", model["id"]),
        ("model.download", "ds@example.org", "model", model["id"]),
        ("model.architecture_download", "ds@example.org", "model", model["id"]),
        ("model.delete", "admin@example.org", "model", model["id"]),
        ("dataset.delete", "owner@example.org", "dataset", dataset["id"]),
    ]
    by_action = {e["action"]: e for e in log}
    assert [e["detail"] for e in log if e["action"] == "auth.login_failed"] == [
        {"email": "nobody@example.org"},
        {"email": "ds@example.org"},
    ]
    assert by_action["user.update"]["detail"] == {"is_active": False, "password": "changed"}
    assert by_action["dataset.upload"]["detail"] == {
        "name": "d",
        "rows": 2,
        "columns": 1,
        "tags": ["t"],
        "clamp": ["x"],
    }
    assert by_action["model.upload"]["detail"] == {
        "name": "m",
        "tensors": 1,
        "public": True,
        "tags": [],
    }
    assert all(e["actor_id"] is None for e in log if e["actor_email"] is None)
    assert [e["id"] for e in log] == sorted((e["id"] for e in log), reverse=True)


def test_only_admins_read_the_log_and_filters_work(
    http: TestClient,
    admin: User,
    admin_h: dict[str, str],
    owner_h: dict[str, str],
    ds_h: dict[str, str],
) -> None:
    for headers in (owner_h, ds_h):
        assert (
            refused(http.get(AUDIT, headers=headers), 403, "forbidden") == "only admins may do this"
        )
    refused(http.get(AUDIT), 401, "unauthenticated")
    logins = events(http, admin_h, action="auth.login")
    assert [e["actor_email"] for e in logins] == [
        "ds@example.org",
        "owner@example.org",
        "admin@example.org",
    ]
    assert [e["action"] for e in events(http, admin_h, actor_id=admin.id)] == ["auth.login"]
    newest, older = events(http, admin_h, limit=2)
    assert events(http, admin_h, before_id=newest["id"], limit=1) == [older]
    refused(http.get(AUDIT, params={"limit": 1001}, headers=admin_h), 422, "invalid_request")


def test_the_database_refuses_to_change_or_delete_audit_lines(
    context: NodeContext, admin: User
) -> None:
    with context.engine.connect() as conn:
        first = conn.execute(text("SELECT id, action FROM audit_events ORDER BY id")).first()
    assert first is not None and first.action == "user.create"
    for statement in (
        "UPDATE audit_events SET action = 'nothing'",
        "UPDATE audit_events SET actor_email = NULL WHERE id = :id",
        "DELETE FROM audit_events WHERE id = :id",
        "DELETE FROM audit_events",
    ):
        refusal = pytest.raises(DBAPIError, match="the audit log is append-only")
        with refusal, context.engine.begin() as conn:
            conn.execute(text(statement), {"id": first.id} if ":id" in statement else {})
    with context.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, action, actor_email FROM audit_events")).all()
    assert [tuple(r) for r in rows] == [(first.id, "user.create", None)]
    # Appending still works.
    with context.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO audit_events (at, action, detail) VALUES (:at, 'x', '{}')"),
            {"at": datetime.now(UTC)},
        )

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from starlette.testclient import TestClient

from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services.security import issue_token
from tests.conftest import PASSWORD, login


def test_login_and_me(http: TestClient, scientist: User) -> None:
    headers = login(http, "DS@example.org ")
    me = http.get("/api/v1/users/me", headers=headers)
    assert me.status_code == 200
    assert me.json()["email"] == "ds@example.org"
    assert me.json()["role"] == "data_scientist"


def test_wrong_password_is_refused_with_a_clear_message(http: TestClient, scientist: User) -> None:
    response = http.post(
        "/api/v1/auth/login", json={"email": "ds@example.org", "password": PASSWORD + "x"}
    )
    assert response.status_code == 401
    assert response.json() == {
        "error": "unauthenticated",
        "detail": "wrong email or password, or the account is deactivated",
    }
    unknown = http.post("/api/v1/auth/login", json={"email": "nobody@x.org", "password": "p"})
    assert unknown.json() == response.json()


def test_expired_token_is_refused(http: TestClient, context: NodeContext, scientist: User) -> None:
    past = datetime.now(UTC) - timedelta(seconds=context.settings.token_lifetime_seconds + 5)
    token = issue_token(context.settings, scientist.id, now=past).token
    response = http.get("/api/v1/users/me", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
    assert "expired" in response.json()["detail"]


def test_forged_token_is_refused(http: TestClient, context: NodeContext, scientist: User) -> None:
    other = context.settings.model_copy(
        update={"token_secret": context.settings.token_secret.__class__("x" * 40)}
    )
    token = issue_token(other, scientist.id).token
    response = http.get("/api/v1/users/me", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert "invalid session token" in response.json()["detail"]


def test_missing_token(http: TestClient) -> None:
    response = http.get("/api/v1/users/me")
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"


def test_malformed_json_login(http: TestClient) -> None:
    response = http.post(
        "/api/v1/auth/login", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"
    assert "JSON" in response.json()["detail"]

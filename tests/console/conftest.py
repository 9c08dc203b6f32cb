"""Fixtures for the console: browsers-in-a-test-client signed in as each role, and the data a
console shows (a dataset, a pending publish, a pending budget request)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from httpx import Response
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.db.models import User
from tests.conftest import PASSWORD, login
from tests.node.conftest import publish, upload_ok

_CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')

GATE = "[approval]\nepsilon_above = 0.5\n"


def csrf_of(html: str) -> str:
    """The CSRF token in a page's first form."""
    found = _CSRF.search(html)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


class Browser:
    """A test client that keeps cookies, as a browser does, signed in through the form."""

    def __init__(self, http: TestClient, *, https: bool = True) -> None:
        scheme = "https" if https else "http"
        self.client = TestClient(http.app, base_url=f"{scheme}://testserver")

    def sign_in(self, email: str, password: str = PASSWORD, next: str = "") -> Response:
        form = self.client.get("/console/login")
        assert form.status_code == 200, form.text
        data = {"csrf_token": csrf_of(form.text), "email": email, "password": password}
        if next:
            data["next"] = next
        return self.client.post("/console/login", data=data, follow_redirects=False)

    def get(self, path: str, **params: Any) -> Response:
        return self.client.get(path, params=params or None, follow_redirects=False)

    def post(self, path: str, data: dict[str, str], *, token_from: str | None = None) -> Response:
        """POST a form with the CSRF token of the page at ``token_from`` (none if omitted)."""
        if token_from is not None:
            data = {"csrf_token": csrf_of(self.get(token_from).text), **data}
        return self.client.post(path, data=data, follow_redirects=False)


@pytest.fixture
def admin_browser(http: TestClient, admin: User) -> Browser:
    browser = Browser(http)
    assert browser.sign_in(admin.email).status_code == 303
    return browser


@pytest.fixture
def ds_browser(http: TestClient, scientist: User) -> Browser:
    browser = Browser(http)
    assert browser.sign_in(scientist.email).status_code == 303
    return browser


def sum_frame(dataset_id: int, n: int = 50) -> bytes:
    b = GraphBuilder()
    x = b.input(f"dataset:{dataset_id}/x", "float64", (n,))
    return encode(b.build([b.op("sum", x)]))


@dataclass(frozen=True)
class Pending:
    dataset_id: int
    frame: bytes
    approval_id: int
    request_id: int
    ds_h: dict[str, str]


@pytest.fixture
def pending(http: TestClient, admin: User, owner: User, scientist: User) -> Pending:
    """A gated policy, a dataset, one publish waiting for approval and one budget request."""
    admin_h, owner_h, ds_h = (
        login(http, admin.email),
        login(http, owner.email),
        login(http, scientist.email),
    )
    applied = http.put("/api/v1/policy", json={"toml": GATE, "reason": "gate"}, headers=admin_h)
    assert applied.status_code == 200, applied.text
    body = upload_ok(
        http, owner_h, "visits", {"x": np.linspace(0, 1, 50)}, bounds={"x": (0, 1)}, tags=["health"]
    )
    frame = sum_frame(int(body["id"]))
    waiting = publish(http, ds_h, frame, 0.8)
    assert waiting.status_code == 403 and waiting.json()["error"] == "approval_required"
    asked = http.post(
        "/api/v1/budget/requests",
        json={"epsilon": 1.5, "delta": 0, "reason": "thesis chapter 3"},
        headers=ds_h,
    )
    assert asked.status_code == 201, asked.text
    return Pending(
        int(body["id"]), frame, int(waiting.json()["approval_id"]), int(asked.json()["id"]), ds_h
    )

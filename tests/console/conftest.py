"""Fixtures for the console: browsers-in-a-test-client signed in as each role, and the data a
console shows (a dataset, a pending publish, a pending budget request); for the tests in a
real browser, a ``dpnode serve`` on loopback and Debian's headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from httpx import Response
from playwright.sync_api import Browser as Chromium
from playwright.sync_api import Page, sync_playwright
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.db.models import User
from tests.conftest import PASSWORD, login
from tests.e2e.conftest import Server
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


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# No network beyond the node, no GPU, no sandbox (tests may run as root in a container).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def serve(
    tmp_path_factory: pytest.TempPathFactory, admin: str, password: str
) -> Iterator[tuple[Server, Path]]:
    """A ``dpnode serve`` on loopback with one admin account (made with the command line), and
    the directory screenshots go to (``$DPNODE_CONSOLE_SCREENSHOTS``, or a temporary one)."""
    root = tmp_path_factory.mktemp("console-node")
    server = Server(root / "data", f"sqlite:///{root / 'dpnode.sqlite3'}")
    server.start()
    try:
        add = ["user", "add", "--email", admin, "--role", "admin", "--password", password]
        subprocess.run(
            [sys.executable, "-m", "dpnode", *add],
            env=server.env,
            check=True,
            capture_output=True,
            cwd=root,
        )
        shots = Path(os.environ.get("DPNODE_CONSOLE_SCREENSHOTS") or root / "screenshots")
        shots.mkdir(parents=True, exist_ok=True)
        yield server, shots
        print(f"\nconsole screenshots: {shots}")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Chromium]:
    """One headless Chromium for a module's tests (each test opens its own contexts)."""
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("Chromium is required in CI (apt-get install chromium)")
        pytest.skip("Chromium not found (apt-get install chromium)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def check_accessible(page: Page) -> None:
    """One h1; every control labelled; every table with a caption and column headers, in a
    box of its own that scrolls sideways, can be focused and has a name."""
    problems = page.evaluate(
        """() => {
        const out = [];
        if (document.querySelectorAll('h1').length !== 1) out.push('not one h1');
        for (const el of document.querySelectorAll(
                'input:not([type=hidden]), select, textarea'))
            if (!el.labels || el.labels.length === 0) out.push('unlabelled ' + (el.name || el.id));
        for (const t of document.querySelectorAll('table')) {
            if (!t.caption || !t.querySelector('thead th[scope=col]')) out.push('bare table');
            const box = t.closest('div.scroll');
            if (!box || box.getAttribute('role') !== 'region' || box.tabIndex !== 0
                    || !box.getAttribute('aria-label'))
                out.push('table outside a named scrolling region: ' + t.caption?.textContent);
        }
        return out;
    }"""
    )
    assert problems == [], problems

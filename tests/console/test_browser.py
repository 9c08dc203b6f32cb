"""The console in a real browser (Debian's headless Chromium, driven by Playwright) against a
real ``dpnode serve`` on loopback: an admin answers a waiting publish and a budget request,
applies a policy and sees the chart and the ledger change; a data scientist is refused the
admin pages; a form posted without its CSRF token is refused.

One node and one browser serve the whole module. Each page visited is screenshotted into
``$DPNODE_CONSOLE_SCREENSHOTS`` (default: a directory under pytest's temporary directory,
printed at the end) for review; screenshots are never committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Browser, Page

from dpnode import sdk
from tests.console.conftest import check_accessible, serve
from tests.e2e.conftest import Server

ADMIN, OWNER, ANN = "admin@example.org", "owner@example.org", "ann@example.org"
PASSWORD = "a long enough password"
GATE = 'name = "gate"\n[approval]\nepsilon_above = 0.5\n'
MORE = 'name = "gate"\n[roles.data_scientist]\nepsilon = 4.0\n[approval]\nepsilon_above = 0.5\n'


class Node:
    def __init__(self, server: Server, shots: Path) -> None:
        self.server, self.url, self.shots = server, server.url, shots
        self.admin = sdk.login(server.url, email=ADMIN, password=PASSWORD)
        self.admin.set_policy(GATE, reason="big releases need a look")
        self.admin.create_user(OWNER, PASSWORD, role="data_owner")
        self.admin.create_user(ANN, PASSWORD, role="data_scientist")
        owner = sdk.login(server.url, email=OWNER, password=PASSWORD)
        x = np.random.default_rng(3).uniform(0, 1, 200)
        owner.upload_dataset("visits", {"x": x}, bounds={"x": (0, 1)}, tags=["health"])
        self.ann = sdk.login(server.url, email=ANN, password=PASSWORD)
        self.ann_id = self.ann.me().id

    def ann_publishes(self, epsilon: float) -> object:
        dataset = self.ann.search(tags=["health"])[0]
        return dataset["x"].sum().publish(epsilon=epsilon)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    with serve(tmp_path_factory, ADMIN, PASSWORD) as (server, shots):
        yield Node(server, shots)


def _sign_in(browser: Browser, node: Node, email: str) -> Page:
    context = browser.new_context(base_url=node.url)
    page = context.new_page()
    page.goto("/console/")
    assert page.url.endswith("/console/login?next=/console/&why=signin")
    # Keyboard only: the skip link comes first, then the form, which Enter submits.
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_label("Password").press("Enter")
    page.wait_for_load_state()
    return page


def _visit(page: Page, node: Node, path: str, shot: str) -> None:
    answer = page.goto(path)
    assert answer is not None and answer.status == 200, (path, answer and answer.status)
    check_accessible(page)
    page.screenshot(path=node.shots / f"{shot}.png", full_page=True)


def test_an_admin_answers_approvals_applies_a_policy_and_sees_the_change(
    browser: Browser, node: Node
) -> None:
    with pytest.raises(sdk.ApprovalRequiredError) as waiting:
        node.ann_publishes(0.8)
    node.ann.request_budget(epsilon=2.0, reason="thesis <chapter> 3")
    page = _sign_in(browser, node, ADMIN)
    assert page.url.endswith("/console/approvals")
    _visit(page, node, "/console/approvals", "admin-approvals")
    approval = waiting.value.approval_id
    page.get_by_label("Reason for approving").first.fill("fine for the annual report")
    page.get_by_role("button", name=f"Approve #{approval}").click()
    assert page.get_by_role("status").inner_text() == "Approved."
    page.get_by_label("Epsilon to grant (empty: as asked)").fill("1.5")
    page.get_by_label("Reason for approving").fill("for chapter 3")
    page.get_by_role("button", name="Approve request").click()
    assert "No budget request is waiting." in page.content()
    assert "No publish or run is waiting." in page.content()

    # The approved publish runs; the chart and the ledger show it.
    _visit(page, node, f"/console/budgets/{node.ann_id}", "admin-budget-before")
    assert page.locator("svg.chart circle.charge").count() == 0
    node.ann_publishes(0.8)
    _visit(page, node, f"/console/budgets/{node.ann_id}", "admin-budget-after")
    assert page.locator("svg.chart circle.charge").count() == 1
    granted = node.ann.budget()
    assert granted.spent_epsilon == pytest.approx(0.8)
    assert page.locator("dl.numbers dd").first.inner_text().startswith(f"{granted.epsilon:.6g}")
    _visit(page, node, "/console/ledger", "admin-ledger")
    page.get_by_label("User").select_option(label=ANN)
    page.get_by_label("Dataset").select_option(label="visits")
    page.get_by_role("button", name="Filter").click()
    assert page.url.endswith(f"user_id={node.ann_id}&dataset_id=1&since=&until=")
    assert page.locator("table.ledger tbody tr").count() == 1
    assert "0.8" in page.locator("table.ledger tbody tr").inner_text()

    # A new policy, applied through the form, raises the allocation the chart is drawn against.
    _visit(page, node, "/console/policy", "admin-policy-before")
    page.get_by_label("Policy (TOML)").fill(MORE)
    page.get_by_label("Reason (for the audit log)").fill("more for scientists")
    page.get_by_role("button", name="Apply the policy").click()
    assert "The policy was applied" in page.get_by_role("status").inner_text()
    page.get_by_role("button", name="Show the difference").click()
    diff = page.locator("pre.diff").inner_text().splitlines()
    assert "+epsilon = 4.0" in diff and "+[roles.data_scientist]" in diff
    page.screenshot(path=node.shots / "admin-policy-diff.png", full_page=True)
    _visit(page, node, f"/console/budgets/{node.ann_id}", "admin-budget-new-policy")
    raised = node.ann.budget().epsilon
    assert raised == pytest.approx(4.0 + 1.5)  # the new role's allocation, plus the grant
    assert page.locator("dl.numbers dd").first.inner_text().startswith(f"{raised:.6g}")
    for path, shot in (
        ("/console/users", "admin-users"),
        ("/console/budgets", "admin-budgets"),
        ("/console/catalog", "admin-catalog"),
        ("/console/audit", "admin-audit"),
    ):
        _visit(page, node, path, shot)
    # Text users typed is shown as text, markup and all.
    assert page.get_by_text('"reason": "thesis <chapter> 3"').count() == 1
    assert "thesis &lt;chapter&gt; 3" in page.content()
    page.context.close()


def test_a_data_scientist_sees_their_own_pages_and_is_refused_the_admin_ones(
    browser: Browser, node: Node
) -> None:
    page = _sign_in(browser, node, ANN)
    assert page.url.endswith("/console/me")
    for path, shot in (
        ("/console/me", "ds-budget"),
        ("/console/ledger", "ds-ledger"),
        ("/console/catalog", "ds-catalog"),
    ):
        _visit(page, node, path, shot)
    assert page.get_by_role("link", name="Approvals").count() == 0
    for path in ("/console/approvals", "/console/users", "/console/policy", "/console/audit"):
        answer = page.goto(path)
        assert answer is not None and answer.status == 403, path
        assert page.get_by_role("alert").inner_text() == "only admins may do this"
        assert ADMIN not in page.content() and "thesis" not in page.content()
    page.screenshot(path=node.shots / "ds-refused.png", full_page=True)
    page.context.close()


def test_a_post_without_the_csrf_token_is_refused(browser: Browser, node: Node) -> None:
    page = _sign_in(browser, node, ADMIN)
    before = len(node.admin.policy_history())
    # The browser sends the session cookie (same site), but not the form's token.
    answer = page.request.post(
        "/console/policy", form={"toml": MORE.replace("4.0", "9.0"), "reason": "forged"}
    )
    assert answer.status == 403 and "security token" in answer.text()
    assert len(node.admin.policy_history()) == before
    # A form on another site cannot send the cookie at all (SameSite=Strict).
    cookie = next(c for c in page.context.cookies() if c["name"] == "dpnode_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    page.context.close()

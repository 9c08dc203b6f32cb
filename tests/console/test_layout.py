"""The console's layout in a real browser, at a phone's width (390 px) and a desktop's (1280 px),
with realistic content: long emails, many rows, a long policy, audit entries with long details.

Every page, for every role, fits the window (a wide table scrolls in its own box, not the
page); chart labels never overlap; refused forms come back on their page with the message and
the typed text; the node's root leads to the console; the API's docs load nothing from
elsewhere. One node and one browser serve the whole module; screenshots of every page at both
widths go where ``tests/console/test_browser.py`` puts its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Browser, Page, Route

from dpnode import sdk
from tests.console.conftest import check_accessible, serve

ADMIN = "administrator.of.the.node@information-governance.example-university-hospital.org"
OWNER = "data.custodian.for.the.cardiology.registry@example-university-hospital.org"
SCIENTIST = "postdoctoral.researcher.in.epidemiology@department-of-public-health.example.org"
PASSWORD = "a long enough password"
WIDTHS = (390, 1280)
COLUMNS = [f"measurement_{name}_at_admission" for name in ("systolic", "diastolic", "bmi")]
# A policy an admin would really write: renewal, per-user amounts, caps, approval.
POLICY = "\n".join(
    [
        'name = "cardiology-registry-governance-board-approved-2026"',
        "[renewal]",
        'every = "1d"',
        "anchor = 2026-01-01T00:00:00Z",
        "[roles.data_scientist]",
        "epsilon = 3.0",
        "delta = 1e-6",
        *[f'[users."researcher.{i}.{"x" * 40}@example.org"]\nepsilon = {i}.5' for i in range(8)],
        "[approval]",
        "epsilon_above = 0.5",
    ]
)
BAD_POLICY = "[roles.data_scientist]\nepsilon = -1  # typed by hand, a sign too many\n"


class Node:
    """A node holding what a busy console shows."""

    def __init__(self, url: str, shots: Path) -> None:
        self.url, self.shots = url, shots
        admin = sdk.login(url, email=ADMIN, password=PASSWORD)
        admin.create_user(OWNER, PASSWORD, role="data_owner")
        admin.create_user(SCIENTIST, PASSWORD, role="data_scientist")
        for i in range(8):
            admin.create_user(f"researcher.{i}.{'x' * 40}@example.org", PASSWORD)
        admin.set_policy(POLICY, reason="approved by the board on " + "2026-03-01, " * 30)
        admin.set_policy(POLICY.replace("3.0", "4.0"), reason="more for the winter term")
        owner = sdk.login(url, email=OWNER, password=PASSWORD)
        rng = np.random.default_rng(5)
        data = {c: rng.uniform(0, 1, 300) for c in COLUMNS}
        owner.upload_dataset(
            "cardiology_registry_admissions_2019_2025_deidentified",
            data,
            bounds={c: (0, 1) for c in COLUMNS},
            tags=["health", "cardiology", "registry", "admissions", "longitudinal"],
            description="Admissions to the cardiology ward, one row per admission. " * 4,
        )
        owner.upload_model(
            "readmission_risk_logistic_regression_v2",
            {"weight": np.zeros((1, 3), dtype=np.float32)},
            tags=["health", "cardiology"],
            description="A logistic regression of readmission within 30 days. " * 3,
        )
        scientist = sdk.login(url, email=SCIENTIST, password=PASSWORD)
        self.scientist_id = scientist.me().id
        column = scientist.search(tags=["cardiology"])[0][COLUMNS[0]]
        for _ in range(12):
            column.sum().publish(epsilon=0.01)
        with pytest.raises(sdk.ApprovalRequiredError) as waiting:
            column.mean().publish(epsilon=0.8)
        self.approval_id = waiting.value.approval_id
        scientist.request_budget(
            epsilon=2.0, reason="https://example.org/protocols/" + "cardiology-" * 12 + "v3.pdf"
        )


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    with serve(tmp_path_factory, ADMIN, PASSWORD) as (server, shots):
        yield Node(server.url, shots)


def _signed_in(browser: Browser, node: Node, email: str) -> Page:
    page = browser.new_context(base_url=node.url).new_page()
    page.goto("/console/login")
    page.get_by_label("Email").fill(email)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()
    return page


def _overlaps(page: Page, selector: str) -> list[list[str]]:
    """The pairs of elements matching ``selector`` whose boxes on screen intersect."""
    found: list[list[str]] = page.evaluate(
        """(selector) => {
        const boxes = [...document.querySelectorAll(selector)]
            .map(e => [e.textContent, e.getBoundingClientRect()]);
        const out = [];
        for (let i = 0; i < boxes.length; i++)
            for (let j = i + 1; j < boxes.length; j++) {
                const [s, a] = boxes[i], [t, b] = boxes[j];
                if (a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom)
                    out.push([s, t]);
            }
        return out;
    }""",
        selector,
    )
    return found


def _fits(page: Page, node: Node, path: str, shot: str, status: int = 200) -> None:
    """At each width: the page loads, is no wider than the window, and passes the checks."""
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        answer = page.goto(path)
        assert answer is not None and answer.status == status, (path, answer and answer.status)
        check_accessible(page)
        wide = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        page.screenshot(path=node.shots / f"layout-{shot}-{width}.png", full_page=True)
        assert wide[0] <= wide[1], (path, width, wide)
        assert _overlaps(page, "svg.chart text") == [], (path, width)


def test_every_admin_page_fits_a_phone_and_a_desktop(browser: Browser, node: Node) -> None:
    page = _signed_in(browser, node, ADMIN)
    for path, shot in (
        ("/console/approvals", "admin-approvals"),
        ("/console/users", "admin-users"),
        ("/console/budgets", "admin-budgets"),
        (f"/console/budgets/{node.scientist_id}", "admin-budget"),
        ("/console/policy", "admin-policy"),
        ("/console/policy?old=1&new=2", "admin-policy-diff"),
        ("/console/audit", "admin-audit"),
        ("/console/catalog", "admin-catalog"),
        ("/console/ledger", "admin-ledger"),
        ("/console/me", "admin-me"),
    ):
        _fits(page, node, path, shot)
    _fits(page, node, "/console/nowhere", "admin-not-found", status=404)
    # A control's name says whose it is, though the row shows a short one.
    page.goto("/console/users")
    assert page.get_by_role("combobox", name=f"Role of {SCIENTIST}", exact=True).count() == 1
    # The long values are all there, in full, even where they wrap.
    page.goto("/console/audit")
    assert page.get_by_text("2026-03-01, " * 30, exact=False).count() >= 1
    page.context.close()


@pytest.mark.parametrize("email", [OWNER, SCIENTIST])
def test_every_page_of_an_owner_or_a_scientist_fits(
    browser: Browser, node: Node, email: str
) -> None:
    page = _signed_in(browser, node, email)
    role = email.split(".")[0]
    for path in ("/console/me", "/console/ledger", "/console/catalog"):
        _fits(page, node, path, f"{role}-{path.rsplit('/', 1)[1]}")
    _fits(page, node, "/console/approvals", f"{role}-refused", status=403)
    page.context.close()


def test_the_sign_in_page_and_the_node_root_fit_and_lead_to_the_console(
    browser: Browser, node: Node
) -> None:
    page = browser.new_context(base_url=node.url).new_page()
    _fits(page, node, "/console/login", "sign-in")
    _fits(page, node, "/", "root")
    assert page.get_by_role("link", name="API's documentation").get_attribute("href") == "docs"
    page.get_by_role("link", name="The console").click()
    assert page.url.endswith("/console/login?next=/console/&why=signin")
    page.context.close()


def test_chart_labels_do_not_overlap_where_the_renewal_meets_the_allocation(
    browser: Browser, node: Node
) -> None:
    page = _signed_in(browser, node, SCIENTIST)
    page.goto("/console/me")
    labels = page.locator("svg.chart text").all_text_contents()
    # The renewal (the end of today) is at the plot's right, the allocation near its top:
    # where their labels used to meet.
    assert any(t.startswith("renews ") for t in labels), labels
    assert any(t.startswith("allocation ") for t in labels), labels
    for width in (320, *WIDTHS):
        page.set_viewport_size({"width": width, "height": 900})
        assert _overlaps(page, "svg.chart text") == [], width
    page.context.close()


def test_an_invalid_policy_is_refused_on_its_page_with_the_text_kept(
    browser: Browser, node: Node
) -> None:
    page = _signed_in(browser, node, ADMIN)
    page.set_viewport_size({"width": 390, "height": 900})
    page.goto("/console/policy")
    before = page.locator("pre.source").inner_text()
    page.get_by_label("Policy (TOML)").fill(BAD_POLICY)
    page.get_by_label("Reason (for the audit log)").fill("a typo")
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        page.get_by_role("button", name="Apply the policy").click()
    assert posted.value.status == 422
    assert page.url.endswith("/console/policy")
    textarea = page.get_by_label("Policy (TOML)")
    assert textarea.input_value() == BAD_POLICY
    assert page.get_by_label("Reason (for the audit log)").input_value() == "a typo"
    message = page.locator("#policy-toml-error")
    assert "epsilon" in message.inner_text() and message.get_attribute("role") == "alert"
    assert textarea.get_attribute("aria-describedby") == "policy-toml-error"
    assert page.locator("pre.source").inner_text() == before  # nothing was applied
    page.screenshot(path=node.shots / "layout-admin-policy-refused-390.png", full_page=True)
    page.context.close()


def test_an_empty_reason_is_checked_by_the_browser_and_by_the_node(
    browser: Browser, node: Node
) -> None:
    page = _signed_in(browser, node, ADMIN)
    page.goto("/console/approvals")
    reason = page.get_by_label("Reason for approving").first
    approve = page.get_by_role("button", name=f"Approve #{node.approval_id}")
    for typed in ("", "   "):
        reason.fill(typed)
        approve.click()
        assert page.url.endswith("/console/approvals")  # the browser kept the form
        assert reason.evaluate("e => e.validity.valid") is False, repr(typed)
    # A browser that checks nothing: the node refuses, on the same page, and says why.
    page.evaluate(
        "() => document.querySelectorAll('[required]').forEach(e => "
        "{ e.removeAttribute('required'); e.removeAttribute('pattern'); })"
    )
    with page.expect_response(lambda r: r.request.method == "POST") as posted:
        approve.click()
    assert posted.value.status == 422
    message = page.locator(f"#publish-{node.approval_id}-approve-reason-error")
    assert "a reason is required" in message.inner_text()
    assert page.get_by_role("heading", name="Pending approvals").count() == 1
    assert reason.input_value() == "   "
    page.screenshot(path=node.shots / "layout-admin-approval-refused-1280.png", full_page=True)
    # The grant form: an amount is a number as JSON writes it, a reason more than spaces.
    page.goto(f"/console/budgets/{node.scientist_id}")
    epsilon, reason = page.get_by_label("Epsilon to add"), page.get_by_label("Reason (for")
    for typed, valid in (("lots", False), ("1_0", False), (".5", False), ("0.5", True)):
        epsilon.fill(typed)
        assert epsilon.evaluate("e => e.validity.valid") is valid, typed
    reason.fill("  ")
    assert reason.evaluate("e => e.validity.patternMismatch") is True
    page.context.close()


def test_the_api_docs_load_nothing_from_outside_the_node(browser: Browser, node: Node) -> None:
    context = browser.new_context(base_url=node.url)
    outside: list[str] = []

    def loopback_only(route: Route) -> None:
        url = route.request.url
        if url.startswith(node.url) or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    context.route("**/*", loopback_only)
    page = context.new_page()
    refused: list[str] = []
    page.on("console", lambda m: refused.append(m.text))
    page.goto("/docs")
    assert "dpnode" in page.locator(".swagger-ui .info .title").inner_text()
    page.locator(".opblock").first.wait_for()
    page.goto("/redoc")
    assert "dpnode" in page.locator("h1").first.inner_text()
    page.screenshot(path=node.shots / "layout-redoc-1280.png")
    assert outside == []
    # ReDoc's script names a logo on a CDN; the page's policy keeps the browser from asking.
    assert all("cdn.redoc.ly" in m for m in refused if "Content Security Policy" in m)
    context.close()

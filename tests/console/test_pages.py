"""The console's routes through the real app in process: sign-in and its cookie, the admin
pages refused to anyone else, CSRF on every form, escaping, and that each page shows what the
API shows."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from markupsafe import escape
from starlette.testclient import TestClient

from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services.security import issue_token
from tests.conftest import REPO_ROOT, login, make_user
from tests.console.conftest import GATE, Browser, Pending, csrf_of
from tests.node.conftest import publish, upload_ok

ADMIN_PAGES = [
    "/console/users",
    "/console/budgets",
    "/console/approvals",
    "/console/policy",
    "/console/audit",
]


def _status_of(http: TestClient, headers: dict[str, str], kind: str, item: int) -> str:
    path = "/api/v1/publish/approvals" if kind == "publish" else "/api/v1/budget/requests"
    rows = http.get(path, headers=headers).json()
    return str(next(r["status"] for r in rows if r["id"] == item))


def test_signing_in_sets_a_strict_http_only_cookie_holding_an_expiring_token(
    http: TestClient, admin: User, context: NodeContext
) -> None:
    browser = Browser(http)
    first = browser.get("/console/approvals")
    assert first.status_code == 303
    assert first.headers["location"] == "/console/login?next=/console/approvals&why=signin"

    wrong = browser.sign_in(admin.email, password="not the password")
    assert wrong.status_code == 401 and "wrong email or password" in wrong.text
    assert "dpnode_console=" not in wrong.headers.get("set-cookie", "")

    done = browser.sign_in(admin.email, next="/console/policy")
    assert done.status_code == 303 and done.headers["location"] == "/console/policy"
    cookie = next(c for c in done.headers.get_list("set-cookie") if c.startswith("dpnode_console="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" in cookie
    assert f"Max-Age={context.settings.token_lifetime_seconds}" in cookie
    assert browser.get("/console/policy").status_code == 200

    # Over plain http the cookie is not marked Secure (the browser would drop it).
    plain = Browser(http, https=False).sign_in(admin.email)
    assert "Secure" not in next(
        c for c in plain.headers.get_list("set-cookie") if c.startswith("dpnode_console=")
    )
    # After signing in, only a console path is a destination: never another site.
    elsewhere = Browser(http).sign_in(admin.email, next="//evil.example/console/")
    assert elsewhere.headers["location"] == "/console/"


def test_an_expired_or_forged_session_goes_back_to_sign_in(
    http: TestClient, admin: User, context: NodeContext
) -> None:
    old = issue_token(context.settings, admin.id, now=datetime.now(UTC) - timedelta(days=2))
    for token in (old.token, "forged.token.value"):
        browser = Browser(http)
        browser.client.cookies.set("dpnode_console", token, domain="testserver.local")
        answer = browser.get("/console/users")
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"].endswith("why=expired")
        assert "admin@example.org" not in answer.text
    assert "Your session has ended" in Browser(http).get("/console/login", why="expired").text


def test_a_deactivated_account_is_signed_out_at_its_next_page(
    http: TestClient, admin_browser: Browser, context: NodeContext
) -> None:
    other = make_user(context, "second@example.org", "admin")
    browser = Browser(http)
    browser.sign_in(other.email)
    assert browser.get("/console/users").status_code == 200
    done = admin_browser.post(
        f"/console/users/{other.id}",
        {"role": "admin", "is_active": "false"},
        token_from="/console/users",
    )
    assert done.status_code == 303
    assert browser.get("/console/users").status_code == 303


def test_an_admin_creates_accounts_and_changes_roles_as_the_api_allows(
    http: TestClient, admin_browser: Browser, admin: User
) -> None:
    made = admin_browser.post(
        "/console/users",
        {"email": "New@Example.org", "password": "long enough", "role": "data_owner"},
        token_from="/console/users",
    )
    assert made.headers["location"] == "/console/users?done=created"
    listed = {
        u["email"]: u for u in http.get("/api/v1/users", headers=login(http, admin.email)).json()
    }
    assert listed["new@example.org"]["role"] == "data_owner"
    assert Browser(http).sign_in("new@example.org", "long enough").status_code == 303
    short = admin_browser.post(
        "/console/users",
        {"email": "b@example.org", "password": "short", "role": "data_owner"},
        token_from="/console/users",
    )
    assert short.status_code == 422 and "password too short" in short.text
    # The service keeps the node from losing its last admin, here as in the API.
    last = admin_browser.post(
        f"/console/users/{admin.id}",
        {"role": "data_scientist", "is_active": "true"},
        token_from="/console/users",
    )
    assert last.status_code == 409 and "without an active admin" in last.text
    assert admin_browser.get("/console/users").status_code == 200


def test_a_data_scientist_is_refused_every_admin_page_and_sees_no_data(
    http: TestClient, ds_browser: Browser, admin: User, pending: Pending
) -> None:
    for path in [*ADMIN_PAGES, f"/console/budgets/{admin.id}"]:
        page = ds_browser.get(path)
        assert page.status_code == 403, path
        assert "only admins may do this" in page.text
        # The refusal shows nothing of anyone else: no email, no pending request.
        assert admin.email not in page.text and "thesis chapter" not in page.text
    # Every admin form is refused too, with the scientist's own valid CSRF token.
    token = csrf_of(ds_browser.get("/console/me").text)
    for path in (
        f"/console/approvals/{pending.approval_id}/approve",
        f"/console/budget-requests/{pending.request_id}/approve",
        "/console/policy",
        "/console/users",
    ):
        answer = ds_browser.post(path, {"csrf_token": token, "reason": "x", "toml": GATE})
        assert answer.status_code == 403, path
    assert _status_of(http, pending.ds_h, "publish", pending.approval_id) == "pending"
    assert _status_of(http, pending.ds_h, "budget", pending.request_id) == "pending"
    # Another user's ledger is refused as the API refuses it; their own pages are there.
    other = ds_browser.get("/console/ledger", user_id=str(admin.id))
    assert other.status_code == 403 and "only admins may read another user" in other.text
    for path in ("/console/me", "/console/ledger", "/console/catalog"):
        assert ds_browser.get(path).status_code == 200, path
    assert ds_browser.get("/console/").headers["location"] == "/console/me"


def test_every_post_without_the_sessions_csrf_token_is_refused(
    http: TestClient, admin_browser: Browser, admin: User, pending: Pending
) -> None:
    approve = f"/console/approvals/{pending.approval_id}/approve"
    other = Browser(http)
    other.sign_in(admin.email)  # the same admin, another session: another token
    foreign = csrf_of(other.get("/console/approvals").text)
    for form in ({}, {"csrf_token": ""}, {"csrf_token": "0" * 64}, {"csrf_token": foreign}):
        answer = admin_browser.post(approve, {"reason": "ok", **form})
        assert answer.status_code == 403 and "security token" in answer.text, form
    assert _status_of(http, pending.ds_h, "publish", pending.approval_id) == "pending"
    for path in (
        "/console/policy",
        "/console/users",
        "/console/logout",
        f"/console/budget-requests/{pending.request_id}/deny",
    ):
        assert admin_browser.post(path, {"reason": "x", "toml": GATE}).status_code == 403
    # The sign-in form has its own token, kept in a cookie of its own.
    forged = Browser(http).client.post(
        "/console/login", data={"email": admin.email, "password": "x"}, follow_redirects=False
    )
    assert forged.status_code == 403 and "dpnode_console=" not in forged.headers.get(
        "set-cookie", ""
    )
    # With the token, the same form works.
    answer = admin_browser.post(approve, {"reason": "fine"}, token_from="/console/approvals")
    assert answer.status_code == 303
    assert _status_of(http, pending.ds_h, "publish", pending.approval_id) == "approved"


def test_answers_go_through_the_api_services_with_their_reasons(
    http: TestClient, admin_browser: Browser, pending: Pending, scientist: User
) -> None:
    page = admin_browser.get("/console/approvals").text
    assert f"#{pending.approval_id}" in page and "thesis chapter 3" in page
    granted = admin_browser.post(
        f"/console/budget-requests/{pending.request_id}/approve",
        {"epsilon": "1.25", "reason": "for chapter 3"},
        token_from="/console/approvals",
    )
    assert granted.headers["location"] == "/console/approvals?done=approved"
    assert "Approved." in admin_browser.get(granted.headers["location"]).text
    (row,) = http.get("/api/v1/budget/requests", headers=pending.ds_h).json()
    assert (row["status"], row["granted_epsilon"], row["decision_reason"]) == (
        "approved",
        1.25,
        "for chapter 3",
    )
    # A denial without a reason is refused by the service, as through the API.
    empty = admin_browser.post(
        f"/console/approvals/{pending.approval_id}/deny",
        {"reason": ""},
        token_from="/console/approvals",
    )
    assert empty.status_code == 422, empty.text
    # Answering twice is a conflict, said on the approvals page (the request's form is gone).
    again = admin_browser.post(
        f"/console/budget-requests/{pending.request_id}/deny",
        {"reason": "changed my mind"},
        token_from="/console/approvals",
    )
    assert again.status_code == 409 and "<h1>Pending approvals</h1>" in again.text
    assert f"budget request {pending.request_id} was already approved" in again.text
    bad = admin_browser.post(
        f"/console/budget-requests/{pending.request_id}/approve",
        {"epsilon": "lots"},
        token_from="/console/approvals",
    )
    assert bad.status_code == 422 and "epsilon must be a number" in bad.text
    budget = admin_browser.get(f"/console/budgets/{scientist.id}").text
    assert "for chapter 3" in budget


def test_user_provided_text_is_escaped_everywhere(
    http: TestClient, admin_browser: Browser, owner: User, scientist: User
) -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    upload_ok(
        http,
        login(http, owner.email),
        "tagged",
        {"x": np.linspace(0, 1, 10)},
        bounds={"x": (0, 1)},
        tags=["tag-1"],
        description=evil,
    )
    asked = http.post(
        "/api/v1/budget/requests",
        json={"epsilon": 1, "delta": 0, "reason": evil},
        headers=login(http, scientist.email),
    )
    assert asked.status_code == 201
    reason_sent = admin_browser.post(
        "/console/policy",
        {"toml": 'name = "x"\n', "reason": evil},
        token_from="/console/policy",
    )
    assert reason_sent.status_code == 303
    for path in (
        "/console/catalog",
        "/console/approvals",
        "/console/policy",
        "/console/audit",
        f"/console/budgets/{scientist.id}",
    ):
        page = admin_browser.get(path)
        assert page.status_code == 200, path
        assert "<script>" not in page.text and "<img" not in page.text, path
        assert str(escape("<img src=x onerror=alert(1)>")) in page.text, path
    # Headers keep any page from loading or running anything else.
    headers = admin_browser.get("/console/catalog").headers
    assert "default-src 'none'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY" and headers["cache-control"] == "no-store"
    # A notice is chosen from a fixed list: text in the URL is never shown back.
    spoof = admin_browser.get("/console/policy", done="call 555-0100 now").text
    assert "555-0100" not in spoof


def test_the_ledger_page_filters_as_the_api_does(
    http: TestClient, admin_browser: Browser, admin: User, pending: Pending, owner: User
) -> None:
    other = upload_ok(
        http, login(http, owner.email), "other", {"x": np.linspace(0, 1, 50)}, bounds={"x": (0, 1)}
    )
    for frame in (pending.frame, pending.frame, _frame(int(other["id"]))):
        assert publish(http, pending.ds_h, frame, 0.25).status_code == 200
    admin_h = login(http, admin.email)
    today = datetime.now(UTC).date()
    cases = [
        ({}, {"all_users": True}),
        (
            {"dataset_id": str(pending.dataset_id)},
            {"all_users": True, "dataset_id": pending.dataset_id},
        ),
        (
            {"since": today.isoformat()},
            {"all_users": True, "since": f"{today.isoformat()}T00:00:00Z"},
        ),
        (
            {"until": (today - timedelta(days=1)).isoformat()},
            {"all_users": True, "until": f"{today.isoformat()}T00:00:00Z"},
        ),
        (
            {"since": (today + timedelta(days=1)).isoformat()},
            {"all_users": True, "since": f"{(today + timedelta(days=1)).isoformat()}T00:00:00Z"},
        ),
        ({"user_id": str(admin.id)}, {"user_id": admin.id}),
    ]
    seen = []
    for form, api in cases:
        page = admin_browser.get("/console/ledger", **form)
        assert page.status_code == 200, page.text
        shown = [int(i) for i in re.findall(r'<tr><th scope="row">(\d+)</th>', page.text)]
        expected = [e["id"] for e in http.get("/api/v1/ledger", params=api, headers=admin_h).json()]
        assert shown == expected, form
        seen.append(len(shown))
    assert seen == [3, 2, 3, 0, 0, 0]
    # The API takes times with a zone only: a naive one would be read in some unknown zone.
    naive = http.get("/api/v1/ledger", params={"since": "2026-01-01T00:00:00"}, headers=admin_h)
    assert naive.status_code == 422 and "since" in naive.json()["detail"]
    bad = admin_browser.get("/console/ledger", since="yesterday")
    assert bad.status_code == 422 and "is not a date" in bad.text


def _frame(dataset_id: int) -> bytes:
    from tests.console.conftest import sum_frame

    return sum_frame(dataset_id)


DAILY = """
[renewal]
every = "1d"
anchor = 2026-01-01T00:00:00Z
[roles.data_scientist]
epsilon = 3.0
"""


def test_the_budget_chart_follows_the_ledger_to_the_amount_spent(
    http: TestClient, ds_browser: Browser, pending: Pending, admin: User
) -> None:
    renewing = http.put(
        "/api/v1/policy", json={"toml": DAILY, "reason": "daily"}, headers=login(http, admin.email)
    )
    assert renewing.status_code == 200, renewing.text
    before = ds_browser.get("/console/me").text
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="chart"' in before
    assert before.count('class="charge"') == 0
    for epsilon in (0.25, 0.5):
        assert publish(http, pending.ds_h, pending.frame, epsilon).status_code == 200
    page = ds_browser.get("/console/me").text
    assert page.count('class="charge"') == 2
    spent = http.get("/api/v1/budget", headers=pending.ds_h).json()
    assert spent["spent_epsilon"] == pytest.approx(0.75)
    assert f"{spent['spent_epsilon']:.4g} of {spent['epsilon']:.4g} after 2 charges" in page
    # A Gaussian release charges rho; the line converts it as the budget does.
    gaussian = publish(http, pending.ds_h, pending.frame, 0.25, delta=1e-7)
    assert gaussian.status_code == 200, gaussian.text
    spent = http.get("/api/v1/budget", headers=pending.ds_h).json()
    assert spent["rho"] > 0 and spent["spent_epsilon"] > spent["pure_epsilon"]
    page = ds_browser.get("/console/me").text
    assert f"{spent['spent_epsilon']:.4g} of {spent['epsilon']:.4g} after 3 charges" in page
    # The window runs from the start of today (UTC) to the renewal, drawn as a line.
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert f"<dd>{today} 00:00:00 UTC</dd>" in page and 'class="renewal"' in page
    assert "allocation 3</text>" in page
    # The waiting publish and the budget request are listed, read-only: no forms to answer.
    assert "thesis chapter 3" in page and "/approve" not in page


def test_a_policy_is_applied_listed_and_compared(admin_browser: Browser) -> None:
    first = admin_browser.post(
        "/console/policy",
        {"toml": 'name = "a"\n[roles.data_scientist]\nepsilon = 2.0\n', "reason": "start"},
        token_from="/console/policy",
    )
    assert first.headers["location"] == "/console/policy?done=applied"
    same = admin_browser.post(
        "/console/policy",
        {"toml": 'name = "a"\n[roles.data_scientist]\nepsilon = 2.0\n', "reason": "again"},
        token_from="/console/policy",
    )
    assert same.headers["location"] == "/console/policy?done=unchanged"
    admin_browser.post(
        "/console/policy",
        {"toml": 'name = "a"\n[roles.data_scientist]\nepsilon = 3.0\n', "reason": "more"},
        token_from="/console/policy",
    )
    page = admin_browser.get("/console/policy", old="1", new="2").text
    assert "<del>-epsilon = 2.0</del>" in page and "<ins>+epsilon = 3.0</ins>" in page
    assert "In force: a, revision 2" in page
    invalid = admin_browser.post(
        "/console/policy",
        {"toml": "[roles.data_scientist]\nepsilon = -1\n", "reason": "oops"},
        token_from="/console/policy",
    )
    assert invalid.status_code == 422 and "epsilon" in invalid.text
    missing = admin_browser.get("/console/policy", old="1", new="99")
    assert missing.status_code == 404
    audit = admin_browser.get("/console/audit", action="policy.apply").text
    assert audit.count("<td>policy.apply</td>") == 2


def test_unknown_pages_and_bad_addresses_are_answered_as_pages(admin_browser: Browser) -> None:
    missing = admin_browser.get("/console/nowhere")
    assert missing.status_code == 404 and "<h1>Not found</h1>" in missing.text
    bad = admin_browser.get("/console/budgets/ann")
    assert bad.status_code == 422 and "<h1>Invalid input</h1>" in bad.text
    gone = admin_browser.get("/console/budgets/999")
    assert gone.status_code == 404 and "no user with id 999" in gone.text


def test_the_pages_docs_list_are_there_for_whom_they_say(
    ds_browser: Browser, admin_browser: Browser, admin: User
) -> None:
    doc = (REPO_ROOT / "docs" / "console.md").read_text()
    rows = re.findall(r"^\| `(/console/[^`]*)` \| (admins|everyone) \|", doc, flags=re.M)
    assert len(rows) == 9
    for path, who in rows:
        path = path.replace("{id}", str(admin.id))
        assert admin_browser.get(path).status_code == 200, path
        assert ds_browser.get(path).status_code == (403 if who == "admins" else 200), path


def test_console_routes_stay_out_of_the_api_schema(http: TestClient) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    assert paths and not [p for p in paths if p.startswith("/console")]


def test_an_admin_resets_a_password_from_the_users_page(
    http: TestClient, admin_browser: Browser, ds_browser: Browser, admin: User, scientist: User
) -> None:
    page = admin_browser.get("/console/users")
    assert f'action="/console/users/{scientist.id}/password"' in page.text
    assert f"New password for {scientist.email}" in page.text
    path = f"/console/users/{scientist.id}/password"
    # without the session's CSRF token, or as a data scientist, nothing changes
    assert admin_browser.post(path, {"password": "another long one"}).status_code == 403
    own = csrf_of(ds_browser.get("/console/me").text)
    refused = ds_browser.post(path, {"csrf_token": own, "password": "another long one"})
    assert refused.status_code == 403
    short = admin_browser.post(path, {"password": "short"}, token_from="/console/users")
    assert short.status_code == 422 and "password too short" in short.text
    assert Browser(http).sign_in(scientist.email).status_code == 303  # the old one, still
    done = admin_browser.post(path, {"password": "another long one"}, token_from="/console/users")
    assert done.headers["location"] == "/console/users?done=password"
    assert "The password was changed" in admin_browser.get(done.headers["location"]).text
    assert Browser(http).sign_in(scientist.email).status_code != 303
    assert Browser(http).sign_in(scientist.email, "another long one").status_code == 303
    audit = http.get(
        "/api/v1/audit", params={"action": "user.update"}, headers=login(http, admin.email)
    ).json()
    assert [(e["actor_email"], e["target_id"], e["detail"]) for e in audit] == [
        (admin.email, scientist.id, {"password": "changed"})
    ]
    missing = admin_browser.post(
        "/console/users/9999/password", {"password": "long enough"}, token_from="/console/users"
    )
    assert missing.status_code == 404 and "no user with id 9999" in missing.text

"""Refused console forms come back on their own page, with the API's status code, the message
next to the field it is about and what was typed kept (never a password); the browser's own
checks (``required``, ``pattern``, ``minlength``) are in every form. Through the real app in
process, on SQLite and PostgreSQL."""

from __future__ import annotations

import re

from markupsafe import escape
from starlette.testclient import TestClient

from dpnode.node.db.models import User
from tests.conftest import login
from tests.console.conftest import Browser, Pending

BAD_POLICY = '[roles.data_scientist]\nepsilon = -1\nnote = "<b>typed</b>"\n'


def _message(html: str, id_: str) -> str:
    found = re.search(
        rf'<span class="error field-error" role="alert" id="{id_}">([^<]*)</span>', html
    )
    assert found is not None, f"no message {id_!r} on the page"
    return found.group(1)


def test_an_invalid_policy_comes_back_on_its_page_with_the_text_typed(
    http: TestClient, admin_browser: Browser, admin: User
) -> None:
    before = http.get("/api/v1/policy/revisions", headers=login(http, admin.email)).json()
    answer = admin_browser.post(
        "/console/policy", {"toml": BAD_POLICY, "reason": "a typo"}, token_from="/console/policy"
    )
    assert answer.status_code == 422
    page = answer.text
    assert "<h1>Budget policy</h1>" in page
    assert "epsilon" in _message(page, "policy-toml-error")
    # The text typed, escaped, in the textarea that is marked invalid and points at the message.
    typed = re.search(r'<textarea id="toml"([^>]*)>([^<]*)</textarea>', page)
    assert typed is not None and typed.group(2) == str(escape(BAD_POLICY))
    assert 'aria-invalid="true" aria-describedby="policy-toml-error"' in typed.group(1)
    assert 'name="reason"' in page and 'value="a typo"' in page
    after = http.get("/api/v1/policy/revisions", headers=login(http, admin.email)).json()
    assert after == before
    # No reason: the message goes by the reason, the policy typed is still there.
    unexplained = admin_browser.post(
        "/console/policy", {"toml": BAD_POLICY, "reason": ""}, token_from="/console/policy"
    )
    assert unexplained.status_code == 422
    assert _message(unexplained.text, "policy-reason-error").startswith("reason:")
    assert str(escape(BAD_POLICY)) in unexplained.text


def test_an_empty_reason_is_refused_next_to_its_field_and_nothing_is_answered(
    http: TestClient, admin_browser: Browser, pending: Pending
) -> None:
    for path, id_ in (
        (f"/console/approvals/{pending.approval_id}/approve", f"publish-{pending.approval_id}"),
        (f"/console/approvals/{pending.approval_id}/deny", f"publish-{pending.approval_id}"),
        (f"/console/budget-requests/{pending.request_id}/deny", f"request-{pending.request_id}"),
    ):
        answer = admin_browser.post(path, {"reason": "  "}, token_from="/console/approvals")
        assert answer.status_code == 422, path
        assert "<h1>Pending approvals</h1>" in answer.text
        kind = path.rsplit("/", 1)[1]
        assert "a reason is required" in _message(answer.text, f"{id_}-{kind}-reason-error")
    publishes = http.get("/api/v1/publish/approvals", headers=pending.ds_h).json()
    requests = http.get("/api/v1/budget/requests", headers=pending.ds_h).json()
    assert {r["status"] for r in publishes + requests} == {"pending"}
    # An amount that is not a number goes by the amount, with what was typed kept.
    bad = admin_browser.post(
        f"/console/budget-requests/{pending.request_id}/approve",
        {"epsilon": "lots", "reason": "for chapter 3"},
        token_from="/console/approvals",
    )
    assert bad.status_code == 422
    where = f"request-{pending.request_id}-approve"
    assert "epsilon must be a number" in _message(bad.text, f"{where}-epsilon-error")
    assert 'value="lots"' in bad.text and 'value="for chapter 3"' in bad.text
    # The browser checks the same before sending: every reason is required and not blank.
    page = admin_browser.get("/console/approvals").text
    reasons = re.findall(r'<input id="[a-z]+-reason-\d+"[^>]*>', page)
    assert len(reasons) == 4
    assert all('required pattern=".*\\S.*"' in r for r in reasons), reasons


def test_a_refused_account_keeps_the_email_typed_and_forgets_the_password(
    admin_browser: Browser, admin: User
) -> None:
    taken = admin_browser.post(
        "/console/users",
        {"email": admin.email, "password": "a secret typed once", "role": "data_owner"},
        token_from="/console/users",
    )
    assert taken.status_code == 409 and "<h1>Users and roles</h1>" in taken.text
    assert "already exists" in _message(taken.text, "new-user-email-error")
    assert f'value="{admin.email}"' in taken.text
    assert '<option value="data_owner" selected>' in taken.text
    assert "a secret typed once" not in taken.text
    short = admin_browser.post(
        "/console/users",
        {"email": "b@example.org", "password": "short", "role": "data_owner"},
        token_from="/console/users",
    )
    assert short.status_code == 422
    assert "password too short" in _message(short.text, "new-user-password-error")
    # A change the service refuses is said in that account's row.
    last = admin_browser.post(
        f"/console/users/{admin.id}",
        {"role": "data_scientist", "is_active": "true"},
        token_from="/console/users",
    )
    assert last.status_code == 409
    assert "without an active admin" in _message(last.text, f"user-{admin.id}-role-error")
    form = admin_browser.get("/console/users").text
    assert 'name="email" type="email" required' in form and 'minlength="8"' in form


def test_the_node_root_leads_to_the_console_and_the_api_docs(http: TestClient) -> None:
    root = http.get("/")
    assert root.status_code == 200 and root.headers["content-type"].startswith("text/html")
    for link in ('href="console/"', 'href="docs"', 'href="redoc"', 'href="openapi.json"'):
        assert link in root.text
    assert "/" not in http.get("/openapi.json").json()["paths"]
    for docs in ("/docs", "/redoc"):
        policy = http.get(docs).headers["content-security-policy"]
        assert "default-src 'self'" in policy and "img-src 'self' data:" in policy, docs


def test_an_admin_grants_budget_through_the_form_and_a_bad_grant_stays_on_the_page(
    http: TestClient, admin_browser: Browser, scientist: User
) -> None:
    page = f"/console/budgets/{scientist.id}"
    headers = login(http, scientist.email)
    before = http.get("/api/v1/budget", headers=headers).json()["epsilon"]
    for typed, field, status in (
        ({"epsilon": "0.5", "reason": " "}, "reason", 422),
        ({"epsilon": "1_0", "reason": "for the thesis"}, "epsilon", 422),
        ({"epsilon": "0", "reason": "for the thesis"}, "epsilon", 422),
    ):
        refused = admin_browser.post(f"{page}/grants", typed, token_from=page)
        assert refused.status_code == status, (typed, refused.text)
        assert f"<h1>Budget of {scientist.email}</h1>" in refused.text
        _message(refused.text, f"grant-{field}-error")
        assert f'value="{typed["epsilon"]}"' in refused.text
    assert http.get("/api/v1/budget", headers=headers).json()["epsilon"] == before
    granted = admin_browser.post(
        f"{page}/grants", {"epsilon": "0.5", "reason": "for the thesis"}, token_from=page
    )
    assert granted.headers["location"] == f"{page}?done=granted"
    assert "The budget was granted." in admin_browser.get(granted.headers["location"]).text
    assert http.get("/api/v1/budget", headers=headers).json()["epsilon"] == before + 0.5


def test_a_refused_sign_in_keeps_the_email_and_forgets_the_password(
    http: TestClient, admin: User
) -> None:
    wrong = Browser(http).sign_in(admin.email, password="not the password at all")
    assert wrong.status_code == 401 and "<h1>Sign in</h1>" in wrong.text
    assert f'value="{admin.email}"' in wrong.text
    assert "not the password at all" not in wrong.text

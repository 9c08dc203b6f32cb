"""Numbers in the console's forms and filters are read as the API reads them: as JSON writes
them (dpnode.node.api.numbers). float() read an approval's ``1_0`` as 10 and ``١`` as 1."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from dpnode.node.db.models import User
from tests.console.conftest import Browser, Pending


@pytest.mark.parametrize("text", ["1_0", "١", "１", "inf", ".5"])
def test_a_console_form_number_spelled_otherwise_than_json_is_refused(
    http: TestClient, admin_browser: Browser, pending: Pending, text: str
) -> None:
    answer = admin_browser.post(
        f"/console/budget-requests/{pending.request_id}/approve",
        {"epsilon": text, "reason": "r"},
        token_from="/console/approvals",
    )
    assert answer.status_code == 422 and "epsilon must be a number" in answer.text, text
    (row,) = http.get("/api/v1/budget/requests", headers=pending.ds_h).json()
    assert row["status"] == "pending"


def test_a_console_filter_or_path_number_spelled_otherwise_than_json_is_refused(
    admin_browser: Browser, admin: User, pending: Pending
) -> None:
    # '²'.isdigit() is true and int('²') raised: a 500; int('١') is 1
    for text in ("²", "١", "1_0", "+1"):
        page = admin_browser.get("/console/ledger", user_id=text)
        assert page.status_code == 422 and "user must be a number" in page.text, text
        assert admin_browser.get(f"/console/budgets/{text}").status_code == 422, text
    assert admin_browser.get("/console/ledger", user_id=str(admin.id)).status_code == 200
    assert admin_browser.get(f"/console/budgets/{admin.id}").status_code == 200


def test_a_console_filter_id_beyond_any_id_is_refused(admin_browser: Browser) -> None:
    # PostgreSQL's ids are 32-bit: each reached the database and answered 500
    for path, field in (("/console/ledger", "before_id"), ("/console/audit", "actor_id")):
        page = admin_browser.get(path, **{field: "2147483648"})
        assert page.status_code == 422 and "must be a number from 0 to" in page.text, path

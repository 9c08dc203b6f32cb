"""The admin commands of the ``dpnode`` command line, run in process on the database of a real
in-process app: what they change, the API sees; what the API refuses, they refuse."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from starlette.testclient import TestClient

from dpnode.node.cli import main
from dpnode.node.db.models import User
from dpnode.node.settings import Settings, get_settings
from tests.conftest import PASSWORD, login
from tests.console.conftest import Pending, pending, sum_frame
from tests.node.conftest import publish, upload_ok

__all__ = ["pending"]  # the fixture, shared with the console's tests


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[None]:
    """The command line on the in-process app's database and data folder."""
    monkeypatch.setenv("DPNODE_DATA_DIR", str(settings.data_dir))
    monkeypatch.setenv("DPNODE_DATABASE_URL", settings.resolved_database_url)
    monkeypatch.setenv("DPNODE_ARGON2_MEMORY_KIB", str(settings.argon2_memory_kib))
    monkeypatch.setenv("DPNODE_ARGON2_TIME_COST", str(settings.argon2_time_cost))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def ok(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    return out


def events(http: TestClient, admin_h: dict[str, str], action: str) -> list[dict[str, object]]:
    found = http.get("/api/v1/audit", params={"action": action}, headers=admin_h)
    assert found.status_code == 200, found.text
    rows: list[dict[str, object]] = found.json()
    return rows


def test_accounts_are_deactivated_changed_and_given_new_passwords(
    cli: None,
    http: TestClient,
    capsys: pytest.CaptureFixture[str],
    admin: User,
    scientist: User,
) -> None:
    admin_h, ds_h = login(http, admin.email), login(http, scientist.email)
    out = ok(capsys, "user", "deactivate", "DS@example.org")
    assert "deactivated ds@example.org" in out
    # the token it had stops working at once, and it cannot log in again
    assert http.get("/api/v1/users/me", headers=ds_h).status_code == 401
    refused = http.post("/api/v1/auth/login", json={"email": scientist.email, "password": PASSWORD})
    assert refused.status_code == 401
    ok(capsys, "user", "activate", str(scientist.id))
    ok(capsys, "user", "role", scientist.email, "data_owner")
    listed = {u["email"]: u for u in http.get("/api/v1/users", headers=admin_h).json()}
    assert listed[scientist.email]["role"] == "data_owner"
    assert listed[scientist.email]["is_active"] is True
    out = ok(capsys, "user", "password", scientist.email, "--password", "a brand new password")
    assert "set a new password for ds@example.org" in out
    assert (
        http.post(
            "/api/v1/auth/login", json={"email": scientist.email, "password": PASSWORD}
        ).status_code
        == 401
    )
    login(http, scientist.email, "a brand new password")
    # the service's own checks hold on the command line
    code, _, err = run(capsys, "user", "password", scientist.email, "--password", "short")
    assert code == 2 and "password too short" in err
    code, _, err = run(capsys, "user", "role", admin.email, "data_scientist")
    assert code == 2 and "without an active admin" in err
    code, _, err = run(capsys, "user", "deactivate", "nobody@example.org")
    assert code == 2 and "no user with email nobody@example.org" in err
    # each change is audited, by the command line, and never with the password
    updates = events(http, admin_h, "user.update")
    assert [e["detail"] for e in reversed(updates)] == [
        {"is_active": False},
        {"is_active": True},
        {"role": "data_owner"},
        {"password": "changed"},
    ]
    assert all(e["actor_email"] is None and e["target_id"] == scientist.id for e in updates)


def test_publish_approvals_are_answered_once_with_a_reason(
    cli: None, http: TestClient, capsys: pytest.CaptureFixture[str], admin: User, pending: Pending
) -> None:
    # what the admin reads before answering: the computation, its noise, budget and caps
    shown = ok(capsys, "approval", "show", str(pending.approval_id))
    assert f"request {pending.approval_id} by ds@example.org: laplace publish, pending" in shown
    assert 'visits["x"]' in shown and "sum(" in shown and "noise scale" in shown
    assert "remaining budget of ds@example.org: epsilon" in shown and "reads visits" in shown
    code, _, err = run(capsys, "approval", "show", "999")
    assert code == 2 and "no publish approval request 999" in err
    code, _, err = run(capsys, "approval", "approve", str(pending.approval_id), "--reason", " ")
    assert code == 2 and "a reason is required" in err
    out = ok(capsys, "approval", "approve", str(pending.approval_id), "--reason", "annual report")
    assert f"approved publish approval request {pending.approval_id}" in out
    code, _, err = run(capsys, "approval", "deny", str(pending.approval_id), "--reason", "no")
    assert code == 2 and "already answered (approved)" in err
    # the same publish, sent again, runs, charged once
    assert publish(http, pending.ds_h, pending.frame, 0.8).status_code == 200
    listed = ok(capsys, "approval", "list", "--status", "used")
    assert "command line (" in listed and "annual report" in listed
    (event,) = events(http, login(http, admin.email), "publish.approved")
    assert event["actor_email"] is None and event["detail"]["reason"] == "annual report"  # type: ignore[index]
    assert event["detail"]["operator"]  # type: ignore[index]
    code, _, err = run(capsys, "approval", "deny", "999", "--reason", "no")
    assert code == 2 and "no publish approval request 999" in err


def test_budget_requests_are_listed_and_answered(
    cli: None, http: TestClient, capsys: pytest.CaptureFixture[str], admin: User, pending: Pending
) -> None:
    before = http.get("/api/v1/budget", headers=pending.ds_h).json()
    listed = ok(capsys, "budget", "requests", "--status", "pending")
    assert str(pending.request_id) in listed and "'thesis chapter 3'" in listed
    assert "epsilon 1.5" in listed
    ok(capsys, "budget", "approve", str(pending.request_id), "--epsilon", "1", "--reason", "1 now")
    after = http.get("/api/v1/budget", headers=pending.ds_h).json()
    assert after["epsilon"] == pytest.approx(before["epsilon"] + 1.0)
    code, _, err = run(capsys, "budget", "deny", str(pending.request_id), "--reason", "late")
    assert code == 2 and "was already approved" in err
    assert "no budget requests" in ok(capsys, "budget", "requests", "--status", "pending")
    asked = http.post(
        "/api/v1/budget/requests", json={"epsilon": 2, "reason": "more"}, headers=pending.ds_h
    )
    ok(capsys, "budget", "deny", str(asked.json()["id"]), "--reason", "not this month")
    mine = http.get("/api/v1/budget/requests", headers=pending.ds_h).json()
    assert [r["status"] for r in mine] == ["denied", "approved"]
    assert http.get("/api/v1/budget", headers=pending.ds_h).json()["epsilon"] == after["epsilon"]
    admin_h = login(http, admin.email)
    (approved,) = events(http, admin_h, "budget.request_approved")
    (denied,) = events(http, admin_h, "budget.request_denied")
    assert (
        approved["detail"]["epsilon_units"] > 0 and denied["detail"]["reason"] == "not this month"
    )  # type: ignore[index,operator]


def test_a_dataset_with_charges_is_deleted_only_when_asked_twice(
    cli: None,
    http: TestClient,
    capsys: pytest.CaptureFixture[str],
    admin: User,
    owner: User,
    scientist: User,
) -> None:
    owner_h, ds_h = login(http, owner.email), login(http, scientist.email)
    data = {"x": np.linspace(0, 1, 50)}
    quiet = upload_ok(http, owner_h, "quiet", data, bounds={"x": (0, 1)})
    read = upload_ok(http, owner_h, "read", data, bounds={"x": (0, 1)})
    assert publish(http, ds_h, sum_frame(int(read["id"])), 0.5).status_code == 200
    # never published from: gone at once, by name or id
    assert "deleted dataset 'quiet'" in ok(capsys, "dataset", "delete", str(quiet["id"]))
    assert http.get("/api/v1/datasets/quiet", headers=owner_h).status_code == 404
    # published from: refused, nothing deleted, and the way to do it named
    code, _, err = run(capsys, "dataset", "delete", "read")
    assert code == 2 and "1 privacy charge(s) in the ledger" in err and "--charged" in err
    assert http.get("/api/v1/datasets/read", headers=owner_h).status_code == 200
    ok(capsys, "dataset", "delete", "read", "--charged")
    assert http.get("/api/v1/datasets/read", headers=owner_h).status_code == 404
    # the ledger outlives it, and the deletion is audited with what it had cost
    ledger = http.get("/api/v1/ledger", headers=ds_h).json()
    assert any(int(read["id"]) in e["dataset_ids"] for e in ledger)
    deleted = events(http, login(http, admin.email), "dataset.delete")
    assert [(e["detail"]["name"], e["detail"]["charges"]) for e in deleted] == [  # type: ignore[index]
        ("read", 1),
        ("quiet", 0),
    ]
    code, _, err = run(capsys, "dataset", "delete", "quiet")
    assert code == 2 and "no dataset 'quiet'" in err

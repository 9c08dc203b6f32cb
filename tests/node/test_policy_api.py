"""Budget policies through the API: applied and versioned, enforced at publish with named
rules, budget requests and grants, approval-gated publishes, and the audit trail."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from httpx import Response
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from tests.conftest import login, make_user
from tests.node.conftest import publish, refused, upload_ok
from tests.sdk.conftest import connect

POLICY = "/api/v1/policy"

HOSPITAL = """
name = "hospital"
[roles.data_scientist]
epsilon = 2.0
[publish]
max_epsilon = 1.0
[rate_limit]
max_publishes = 5
window = "1h"
[datasets.visits]
max_epsilon = 3.0
"""


def _sum_frame(dataset_id: int, n: int = 50, *, scale: float | None = None) -> bytes:
    b = GraphBuilder()
    x = b.input(f"dataset:{dataset_id}/x", "float64", (n,))
    out = b.op("sum", x)
    if scale is not None:
        out = b.op("mul", out, scale)
    return encode(b.build([out]))


def _dataset(http: TestClient, headers: dict[str, str], name: str = "visits") -> int:
    body = upload_ok(http, headers, name, {"x": np.linspace(0, 1, 50)}, bounds={"x": (0, 1)})
    return int(body["id"])


def _apply(http: TestClient, headers: dict[str, str], toml: str, reason: str = "r") -> Response:
    return http.put(POLICY, json={"toml": toml, "reason": reason}, headers=headers)


def _policy_refusal(response: Response, code: str, rule: str) -> dict[str, Any]:
    assert response.status_code == 403, response.text
    body: dict[str, Any] = response.json()
    assert body["error"] == code and body["rule"] == rule, body
    assert f"rule {rule}]" in body["detail"] and body["reason"] in body["detail"]
    return body


def test_a_policy_is_validated_versioned_and_audited(
    http: TestClient, admin_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    builtin = http.get(POLICY, headers=admin_h).json()
    assert builtin["revision"] is None and builtin["name"] == "default"
    # Malformed documents are refused with a stable code and every bad key named.
    bad = _apply(http, admin_h, "[publish]\nmax_epsilon = -1\n[rate_limits]\nx = 1")
    detail = refused(bad, 422, "invalid_policy")
    assert "publish.max_epsilon" in detail and "rate_limits: unknown key" in detail
    refused(_apply(http, admin_h, "not = [toml"), 422, "invalid_policy")
    unknown = _apply(http, admin_h, '[users."ghost@example.org"]\nepsilon = 1.0')
    assert "users.ghost@example.org: no such user" in refused(unknown, 422, "invalid_policy")
    nan_doc = {"document": {"publish": {"max_epsilon": "nan"}}, "reason": "r"}
    refused(http.put(POLICY, json=nan_doc, headers=admin_h), 422, "invalid_policy")
    no_reason = http.put(POLICY, json={"toml": HOSPITAL, "reason": ""}, headers=admin_h)
    refused(no_reason, 422, "invalid_request")
    refused(_apply(http, ds_h, HOSPITAL), 403, "forbidden")
    refused(http.get(POLICY, headers=ds_h), 403, "forbidden")

    first = _apply(http, admin_h, HOSPITAL, "hospital rules, ticket 12").json()
    assert first["revision"] == 1 and first["changed"] and first["source"] == HOSPITAL
    assert first["warnings"] == [
        "datasets.visits: no dataset of that name yet; the cap applies once one is uploaded"
    ]
    again = _apply(http, admin_h, HOSPITAL, "same again").json()
    assert again["revision"] == 1 and not again["changed"]
    # The same shape as JSON is a policy too.
    doc = {"name": "strict", "publish": {"max_epsilon": 0.5}}
    second = http.put(POLICY, json={"document": doc, "reason": "tighter"}, headers=admin_h)
    assert second.status_code == 200, second.text
    assert second.json()["revision"] == 2
    assert http.get(POLICY, headers=admin_h).json()["name"] == "strict"
    history = http.get(f"{POLICY}/revisions", headers=admin_h).json()
    assert [(r["revision"], r["reason"]) for r in history] == [
        (2, "tighter"),
        (1, "hospital rules, ticket 12"),
    ]
    assert http.get(f"{POLICY}/revisions/1", headers=admin_h).json()["name"] == "hospital"
    assert "the newest is 2" in refused(
        http.get(f"{POLICY}/revisions/9", headers=admin_h), 404, "not_found"
    )
    events = http.get("/api/v1/audit", params={"action": "policy.apply"}, headers=admin_h).json()
    assert [(e["actor_email"], e["detail"]["revision"], e["detail"]["reason"]) for e in events] == [
        ("admin@example.org", 2, "tighter"),
        ("admin@example.org", 1, "hospital rules, ticket 12"),
    ]
    assert events[0]["detail"]["previous_revision"] == 1


def test_every_rule_refuses_by_name_and_a_change_applies_at_the_next_publish(
    http: TestClient, admin_h: dict[str, str], owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    frame = _sum_frame(_dataset(http, owner_h))
    assert _apply(http, admin_h, HOSPITAL).status_code == 200
    body = _policy_refusal(publish(http, ds_h, frame, 1.5), "policy_refused", "publish.max_epsilon")
    assert body["policy"] == "hospital" and body["policy_revision"] == 1
    assert "allows at most 1 per publish" in body["reason"]
    for _ in range(2):
        assert publish(http, ds_h, frame, 1.0).status_code == 200
    body = _policy_refusal(
        publish(http, ds_h, frame, 0.5), "budget_exceeded", "roles.data_scientist.epsilon"
    )
    assert "does not fit your epsilon budget of 2 in total" in body["reason"]
    # A grant lifts the budget; the dataset's cap (3, across users) then refuses.
    grant = {"user": "ds@example.org", "epsilon": 5.0, "reason": "study extended"}
    assert http.post("/api/v1/budget/grants", json=grant, headers=admin_h).status_code == 201
    assert publish(http, ds_h, frame, 1.0).status_code == 200
    _policy_refusal(
        publish(http, ds_h, frame, 0.5), "budget_exceeded", "datasets.visits.max_epsilon"
    )
    # Lift the cap without a restart: the rate limit (5 per hour) decides next.
    lifted = HOSPITAL.replace("max_epsilon = 3.0", "max_epsilon = 30.0")
    assert _apply(http, admin_h, lifted).json()["revision"] == 2
    assert publish(http, ds_h, frame, 0.5).status_code == 200
    assert publish(http, ds_h, frame, 0.5).status_code == 200
    body = _policy_refusal(
        publish(http, ds_h, frame, 0.5), "policy_refused", "rate_limit.max_publishes"
    )
    assert body["policy_revision"] == 2 and "the next one is possible at" in body["reason"]
    ledger = http.get("/api/v1/ledger", headers=ds_h).json()
    assert [e["policy_revision"] for e in ledger] == [2, 2, 1, 1, 1]
    budget = http.get("/api/v1/budget", headers=ds_h).json()
    assert budget["epsilon"] == 7.0 and budget["granted_epsilon"] == 5.0
    assert budget["spent_epsilon"] == 4.0 and budget["remaining_epsilon"] == 3.0
    assert budget["epsilon_rule"] == "roles.data_scientist.epsilon"
    assert (budget["policy"], budget["policy_revision"]) == ("hospital", 2)
    # Refusals are audited with their rule: who tried what, and why it did not run.
    events = http.get("/api/v1/audit", params={"action": "publish.refused"}, headers=admin_h).json()
    assert [e["detail"]["rule"] for e in events] == [
        "rate_limit.max_publishes",
        "datasets.visits.max_epsilon",
        "roles.data_scientist.epsilon",
        "publish.max_epsilon",
    ]


def test_a_budget_request_is_answered_and_the_requester_sees_the_decision(
    http: TestClient, admin: User, owner: User, scientist: User
) -> None:
    admin_c, ds_c = connect(http, admin.email), connect(http, scientist.email)
    owner_h = login(http, owner.email)
    frame = _sum_frame(_dataset(http, owner_h))
    admin_c.set_policy("[roles.data_scientist]\nepsilon = 1.0\n", reason="pilot")
    ds_c.publish_frame(frame, epsilon=1.0)
    with pytest.raises(sdk.BudgetExceededError) as exc:
        ds_c.publish_frame(frame, epsilon=0.5)
    assert exc.value.rule == "roles.data_scientist.epsilon" and exc.value.policy_revision == 1
    asked = ds_c.request_budget(epsilon=2.0, reason="need a second cohort")
    assert asked.status == "pending" and asked.user_email == scientist.email
    assert [r.id for r in admin_c.budget_requests(status="pending")] == [asked.id]
    approved = admin_c.approve_budget_request(asked.id, epsilon=0.5, reason="half for now")
    assert (approved.status, approved.granted_epsilon) == ("approved", 0.5)
    (seen,) = ds_c.budget_requests()
    assert (seen.status, seen.decided_by, seen.decision_reason) == (
        "approved",
        admin.email,
        "half for now",
    )
    assert ds_c.budget().remaining_epsilon == 0.5
    ds_c.publish_frame(frame, epsilon=0.5)  # continues with the grant
    with pytest.raises(sdk.ConflictError, match="already approved"):
        admin_c.deny_budget_request(asked.id, reason="changed my mind")

    second = ds_c.request_budget(epsilon=5.0, reason="more")
    with pytest.raises(sdk.InvalidRequestError, match="a reason is required to approve"):
        admin_c.approve_budget_request(second.id, reason=" ")
    with pytest.raises(sdk.InvalidRequestError, match="reason is required"):
        admin_c.deny_budget_request(second.id, reason=" ")
    denied = admin_c.deny_budget_request(second.id, reason="the cohort is closed")
    assert denied.status == "denied" and denied.granted_epsilon is None
    assert ds_c.budget_requests(status="denied")[0].decision_reason == "the cohort is closed"
    assert ds_c.budget().remaining_epsilon == 0.0
    with pytest.raises(sdk.PermissionDeniedError):
        ds_c.approve_budget_request(second.id, reason="me")
    grants = admin_c.grants(user=scientist.email)
    assert [(g.epsilon, g.request_id, g.granted_by) for g in grants] == [
        (0.5, asked.id, admin.email)
    ]
    actions = [e.action for e in admin_c.audit(limit=20) if e.action.startswith("budget.")]
    assert actions == [
        "budget.request_denied",
        "budget.request",
        "budget.request_approved",
        "budget.request",
    ]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"epsilon": -1.0, "reason": "r"}, 422, "invalid_request"),
        ({"epsilon": "NaN", "reason": "r"}, 422, "invalid_request"),
        ({"epsilon": 1.0, "delta": 1.0, "reason": "r"}, 422, "invalid_request"),
        ({"epsilon": 0.0, "reason": "r"}, 422, "invalid_request"),
        ({"epsilon": 1.0, "reason": ""}, 422, "invalid_request"),
        ({"epsilon": 1.0}, 422, "invalid_request"),
        ({"epsilon": 1e300, "reason": "r"}, 422, "invalid_request"),
    ],
)
def test_bad_budget_requests_are_refused(
    http: TestClient, ds_h: dict[str, str], body: dict[str, Any], status: int, code: str
) -> None:
    refused(http.post("/api/v1/budget/requests", json=body, headers=ds_h), status, code)


def test_grants_to_unknown_users_and_bad_answers_are_refused(
    http: TestClient, admin_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    grants = "/api/v1/budget/grants"
    for user in ("nobody@example.org", 999):
        body = {"user": user, "epsilon": 1.0, "reason": "r"}
        refused(http.post(grants, json=body, headers=admin_h), 404, "not_found")
    body = {"user": "ds@example.org", "epsilon": 1.0, "reason": "r"}
    refused(http.post(grants, json=body, headers=ds_h), 403, "forbidden")
    refused(
        http.post("/api/v1/budget/requests/77/approve", json={}, headers=admin_h), 404, "not_found"
    )
    refused(
        http.get("/api/v1/budget/requests?status=maybe", headers=admin_h), 422, "invalid_request"
    )
    refused(http.get("/api/v1/ledger?all_users=true", headers=ds_h), 403, "forbidden")
    assert http.get("/api/v1/health").status_code == 200


def test_a_grants_user_is_an_id_as_json_writes_it_or_an_email(
    http: TestClient, admin_h: dict[str, str], scientist: User
) -> None:
    grants = "/api/v1/budget/grants"
    arabic = str(scientist.id).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    # isdigit() took '١' (read as id 1) and '0N' (id N); '²' and 5000 digits made int() raise
    for user in (arabic, f"0{scientist.id}", "²", "9" * 5000, f" {scientist.id}"):
        body = {"user": user, "epsilon": 1.0, "reason": "r"}
        detail = refused(http.post(grants, json=body, headers=admin_h), 422, "invalid_request")
        assert detail.endswith("is not a valid email address"), detail
    assert http.get(grants, headers=admin_h).json() == []
    for user in (str(scientist.id), scientist.id, scientist.email):
        body = {"user": user, "epsilon": 1.0, "reason": "r"}
        granted = http.post(grants, json=body, headers=admin_h)
        assert granted.status_code == 201 and granted.json()["user_id"] == scientist.id


def test_a_publish_over_the_threshold_waits_and_runs_once_when_approved(
    http: TestClient, admin: User, owner: User, scientist: User
) -> None:
    admin_c, ds_c = connect(http, admin.email), connect(http, scientist.email)
    frame = _sum_frame(_dataset(http, login(http, owner.email)))
    admin_c.set_policy("[approval]\nepsilon_above = 0.5\n", reason="big releases need a look")
    ds_c.publish_frame(frame, epsilon=0.5)  # at the threshold: runs
    with pytest.raises(sdk.ApprovalRequiredError) as waiting:
        ds_c.publish_frame(frame, epsilon=0.8)
    approval_id = waiting.value.approval_id
    assert waiting.value.rule == "approval.epsilon_above" and approval_id is not None
    assert f"request {approval_id}" in str(waiting.value)
    with pytest.raises(sdk.ApprovalRequiredError) as again:  # still waiting: the same request
        ds_c.publish_frame(frame, epsilon=0.8)
    assert again.value.approval_id == approval_id
    assert len(ds_c.ledger()) == 1
    (pending,) = admin_c.publish_approvals(status="pending")
    assert (pending.id, pending.epsilon, pending.user_email) == (approval_id, 0.8, scientist.email)
    # An approval covers this computation only: another one, or another epsilon, waits.
    other = _sum_frame(pending.dataset_ids[0], scale=2.0)
    with pytest.raises(sdk.InvalidRequestError, match="say why the publish is approved"):
        admin_c.approve_publish(approval_id, reason="")
    admin_c.approve_publish(approval_id, reason="fine for the annual report")
    with pytest.raises(sdk.ApprovalRequiredError):
        ds_c.publish_frame(other, epsilon=0.8)
    with pytest.raises(sdk.ApprovalRequiredError):
        ds_c.publish_frame(frame, epsilon=0.9)
    _, receipt = ds_c.publish_frame(frame, epsilon=0.8)
    used = next(a for a in ds_c.publish_approvals() if a.id == approval_id)
    assert used.status == "used" and used.ledger_id == receipt["ledger_id"]
    # Used up: the same publish waits for a new approval.
    with pytest.raises(sdk.ApprovalRequiredError) as fresh:
        ds_c.publish_frame(frame, epsilon=0.8)
    assert fresh.value.approval_id != approval_id
    charge = admin_c.audit(action="privacy.charge", limit=1)[0]
    assert charge.detail["approval_id"] == approval_id and charge.detail["epsilon_units"] == 8e8
    with pytest.raises(sdk.ConflictError):
        admin_c.approve_publish(approval_id, reason="again")


def test_a_denied_publish_is_refused_with_the_admins_reason_then_may_ask_again(
    http: TestClient, admin: User, owner: User, scientist: User
) -> None:
    admin_c, ds_c = connect(http, admin.email), connect(http, scientist.email)
    frame = _sum_frame(_dataset(http, login(http, owner.email)))
    admin_c.set_policy("[approval]\nepsilon_above = 0.5\n", reason="gate")
    with pytest.raises(sdk.ApprovalRequiredError) as waiting:
        ds_c.publish_frame(frame, epsilon=2.0)
    with pytest.raises(sdk.PermissionDeniedError):
        ds_c.deny_publish(waiting.value.approval_id, reason="no")  # type: ignore[arg-type]
    admin_c.deny_publish(waiting.value.approval_id, reason="too precise for 50 rows")  # type: ignore[arg-type]
    with pytest.raises(sdk.PolicyRefusedError) as denied:
        ds_c.publish_frame(frame, epsilon=2.0)
    assert type(denied.value) is sdk.PolicyRefusedError and denied.value.rule == "approval"
    assert "denied this publish: too precise for 50 rows" in str(denied.value)
    with pytest.raises(sdk.ApprovalRequiredError) as asked_again:
        ds_c.publish_frame(frame, epsilon=2.0)
    assert asked_again.value.approval_id != waiting.value.approval_id
    assert ds_c.ledger() == []


def test_the_audit_log_reconstructs_who_published_what_under_which_policy(
    http: TestClient, admin: User, owner: User, scientist: User, context: NodeContext
) -> None:
    admin_c = connect(http, admin.email)
    other = make_user(context, "ds2@example.org", "data_scientist")
    clients = {
        scientist.email: connect(http, scientist.email),
        other.email: connect(http, other.email),
    }
    dataset_id = _dataset(http, login(http, owner.email))
    frame = _sum_frame(dataset_id)
    admin_c.set_policy('name = "v1"', reason="first")
    clients[scientist.email].publish_frame(frame, epsilon=0.25)
    admin_c.set_policy('name = "v2"\n[publish]\nmax_epsilon = 1.0', reason="second")
    clients[other.email].publish_frame(frame, epsilon=0.5, delta=1e-7)
    with pytest.raises(sdk.PolicyRefusedError):
        clients[other.email].publish_frame(frame, epsilon=2.0)
    charges = admin_c.audit(action="privacy.charge")
    revisions = {r.revision: r.name for r in admin_c.policy_history()}
    story = [
        (
            e.actor_email,
            e.detail["mechanism"],
            e.detail["epsilon_units"] / 1e9,
            e.detail["delta_units"] / 1e18,
            e.detail["datasets"],
            revisions[e.detail["policy_revision"]],
        )
        for e in reversed(charges)
    ]
    assert story == [
        (scientist.email, "laplace", 0.25, 0.0, [dataset_id], "v1"),
        (other.email, "gaussian", 0.5, 1e-7, [dataset_id], "v2"),
    ]
    # The ledger agrees, row by row, and admins can read everyone's or one dataset's.
    ledger = admin_c.ledger(everyone=True)
    assert [(e.user_email, e.policy_revision) for e in ledger] == [
        (other.email, 2),
        (scientist.email, 1),
    ]
    assert [e.id for e in admin_c.ledger(dataset="visits", everyone=True)] == [e.id for e in ledger]
    assert [e.target_id for e in charges] == [e.id for e in ledger]
    assert admin_c.ledger(user=other.email)[0].rho > 0


def test_policy_history_grants_and_the_dataset_index_are_append_only(
    http: TestClient, admin_h: dict[str, str], context: NodeContext, scientist: User
) -> None:
    assert _apply(http, admin_h, HOSPITAL).status_code == 200
    grant = {"user": scientist.id, "epsilon": 1.0, "reason": "r"}
    assert http.post("/api/v1/budget/grants", json=grant, headers=admin_h).status_code == 201
    with context.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO ledger_entries (at, user_id, mechanism, epsilon_units, "
                "tv_units, rho_units, dataset_ids, detail) VALUES "
                f"(CURRENT_TIMESTAMP, {scientist.id}, 'laplace', 1, 0, 0, '[1]', '{{}}')"
            )
        )
        conn.execute(
            text(
                "INSERT INTO ledger_entry_datasets (ledger_id, dataset_id) "
                "SELECT max(id), 1 FROM ledger_entries"
            )
        )
    for statement in (
        "UPDATE policy_revisions SET reason = 'x'",
        "DELETE FROM policy_revisions",
        "UPDATE budget_grants SET epsilon_units = 10",
        "DELETE FROM budget_grants",
        "UPDATE ledger_entry_datasets SET dataset_id = 2",
        "DELETE FROM ledger_entry_datasets",
    ):
        with context.engine.connect() as conn, pytest.raises(DBAPIError, match="append-only"):
            conn.execute(text(statement))


def test_a_large_epsilon_is_usable(
    http: TestClient, admin_h: dict[str, str], owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    # the samplers' deviation is charged at each release's own epsilon, not at the cap's:
    # a cap of 60 (or an allocation of 10,000) no longer leaves no room for any publish
    frame = _sum_frame(_dataset(http, owner_h))
    applied = _apply(
        http,
        admin_h,
        "[datasets.visits]\nmax_epsilon = 60.0\n[roles.data_scientist]\nepsilon = 10000.0",
    ).json()
    assert applied["warnings"] == []
    for _ in range(3):
        assert publish(http, ds_h, frame, 0.5).status_code == 200


def test_the_sdk_applies_a_policy_from_a_file_or_a_mapping(
    http: TestClient, admin: User, tmp_path: Any
) -> None:
    admin_c = connect(http, admin.email)
    path = tmp_path / "clinic.toml"
    path.write_text('name = "from-file"\n')
    assert admin_c.set_policy(path, reason="file").name == "from-file"
    assert admin_c.set_policy(str(path), reason="same file").changed is False
    mapped = admin_c.set_policy({"name": "mapped", "publish": {"max_epsilon": 1}}, reason="m")
    assert (mapped.revision, mapped.document["publish"]) == (2, {"max_epsilon": 1.0})
    with pytest.raises(sdk.InvalidPolicyError, match=r"publish\.max_epsilonn: unknown key"):
        admin_c.set_policy("[publish]\nmax_epsilonn = 1", reason="typo")
    with pytest.raises(FileNotFoundError):
        admin_c.set_policy("missing.toml", reason="no such file")
    assert admin_c.policy().name == "mapped"
    assert [r.revision for r in admin_c.policy_history()] == [2, 1]


def test_a_dataset_uploaded_again_under_its_name_keeps_its_cap(
    http: TestClient, admin_h: dict[str, str], owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    _apply(
        http,
        admin_h,
        '[datasets.visits]\nmax_epsilon = 1.0\n[rate_limit]\nmax_publishes = 9\nwindow = "1h"',
    )
    first = _dataset(http, owner_h)
    _dataset(http, owner_h, "other")  # so that SQLite does not give the old id again
    assert publish(http, ds_h, _sum_frame(first), 0.75).status_code == 200
    assert http.delete(f"/api/v1/datasets/{first}", headers=owner_h).status_code == 204
    again = _dataset(http, owner_h)
    assert again != first
    body = _policy_refusal(
        publish(http, ds_h, _sum_frame(again), 0.5),
        "budget_exceeded",
        "datasets.visits.max_epsilon",
    )
    assert "0.25 is left" in body["reason"]
    assert publish(http, ds_h, _sum_frame(again), 0.25).status_code == 200
    # Without a rate limit the rows enter as sums: the same answer.
    _apply(http, admin_h, "[datasets.visits]\nmax_epsilon = 1.0")
    _policy_refusal(
        publish(http, ds_h, _sum_frame(again), 0.1),
        "budget_exceeded",
        "datasets.visits.max_epsilon",
    )

"""Budget policies against a real ``dpnode serve``, on SQLite and PostgreSQL.

An admin applies a policy file with the command line while the node runs; a data scientist
meets each limit through ordinary remote-tensor code and reads why; asks for more budget, is
approved and continues; two users racing cannot pass a dataset's cap together; and the audit
log tells who published what, with which epsilon, under which policy revision.
"""

from __future__ import annotations

import contextlib
import io
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dpnode import sdk
from tests.e2e.conftest import REPO, Server

ADMIN, OWNER = "admin@example.org", "owner@example.org"
ANN, BOB = "ann@example.org", "bob@example.org"
PASSWORD = "a long enough password"

POLICY = """\
name = "clinic"
description = "Per-publish cap, approval above 0.5, 2 per scientist, 6 on visits for everyone"

[roles.data_scientist]
epsilon = 2.0

[publish]
max_epsilon = 1.0

[approval]
epsilon_above = 0.5

[datasets.visits]
max_epsilon = 6.0
"""


def _login(server: Server, email: str) -> sdk.Client:
    return sdk.login(server.url, email=email, password=PASSWORD)


@pytest.fixture
def clinic(server: Server, tmp_path: Path) -> Server:
    roles = (
        (ADMIN, "admin"),
        (OWNER, "data_owner"),
        (ANN, "data_scientist"),
        (BOB, "data_scientist"),
    )
    server.add_users(*((email, role, PASSWORD) for email, role in roles))
    rng = np.random.default_rng(7)
    _login(server, OWNER).upload_dataset(
        "visits", {"age": rng.integers(18, 90, 400)}, bounds={"age": (0, 120)}, tags=["health"]
    )
    policy = tmp_path / "clinic.toml"
    policy.write_text(POLICY)
    out = server.cli("policy", "apply", str(policy), "--reason", "clinic rules, ticket 42")
    assert out.strip() == "applied policy 'clinic' as revision 1"
    return server


def test_a_scientist_meets_each_limit_asks_for_more_and_continues(clinic: Server) -> None:
    admin, ann = _login(clinic, ADMIN), _login(clinic, ANN)
    mean_age = ann.dataset("visits")["age"].float().mean()
    assert float(mean_age.publish(epsilon=0.5)) == pytest.approx(54, abs=10)

    with pytest.raises(sdk.PolicyRefusedError) as too_big:  # over the per-publish cap
        mean_age.publish(epsilon=1.5)
    assert too_big.value.rule == "publish.max_epsilon"
    assert "at most 1 per publish" in str(too_big.value) and "'clinic' (revision 1)" in str(
        too_big.value
    )

    with pytest.raises(sdk.ApprovalRequiredError) as waiting:  # over the approval threshold
        mean_age.publish(epsilon=0.75)
    assert waiting.value.rule == "approval.epsilon_above"
    (pending,) = admin.publish_approvals(status="pending")
    assert (pending.id, pending.user_email, pending.epsilon) == (
        waiting.value.approval_id,
        ANN,
        0.75,
    )
    admin.approve_publish(pending.id, reason="annual report")
    mean_age.publish(epsilon=0.75)  # the same computation again: it runs now

    with pytest.raises(sdk.BudgetExceededError) as spent:  # 0.5 + 0.75 + 0.5 + 0.5 > 2
        mean_age.publish(epsilon=0.5)
        mean_age.publish(epsilon=0.5)
    assert spent.value.rule == "roles.data_scientist.epsilon"
    assert "does not fit your epsilon budget of 2" in str(spent.value)
    assert ann.budget().remaining_epsilon == pytest.approx(0.25)

    request = ann.request_budget(epsilon=2.0, reason="a second age band")
    (seen,) = admin.budget_requests(status="pending")
    assert (seen.id, seen.reason) == (request.id, "a second age band")
    admin.approve_budget_request(request.id, epsilon=1.0, reason="one more for now")
    (answered,) = ann.budget_requests()
    assert (answered.status, answered.granted_epsilon) == ("approved", 1.0)
    mean_age.publish(epsilon=0.5)  # continues
    assert ann.budget().remaining_epsilon == pytest.approx(0.75)

    # A rate limit, changed while the node runs, applies at the next publish.
    admin.set_policy(
        POLICY + '\n[rate_limit]\nmax_publishes = 4\nwindow = "1h"\n', reason="slow down"
    )
    with pytest.raises(sdk.PolicyRefusedError) as slow:
        mean_age.publish(epsilon=0.25)
    assert slow.value.rule == "rate_limit.max_publishes" and slow.value.policy_revision == 2

    # The command line sees the same node.
    budget_line = clinic.cli("budget", "show", "--user", ANN)
    assert "epsilon 2.25 of 3 spent" in budget_line and "'clinic' (revision 2)" in budget_line
    history = clinic.cli("policy", "show", "--history").splitlines()
    assert [line.split()[0] for line in history] == ["2", "1"]


def test_two_scientists_racing_cannot_pass_the_datasets_cap(clinic: Server) -> None:
    admin = _login(clinic, ADMIN)
    for email in (ANN, BOB):  # their own budgets are not what stops them
        admin.grant_budget(email, epsilon=20.0, reason="cap test")
    clients = {email: _login(clinic, email) for email in (ANN, BOB)}
    tensors = {email: c.dataset("visits")["age"].float().sum() for email, c in clients.items()}

    def hammer(email: str) -> int:
        runs = 0
        for _ in range(20):
            try:
                tensors[email].publish(epsilon=0.5, client=clients[email])
                runs += 1
            except sdk.BudgetExceededError as exc:
                assert exc.rule == "datasets.visits.max_epsilon", exc
        return runs

    with ThreadPoolExecutor(max_workers=4) as pool:
        runs = list(pool.map(hammer, [ANN, BOB, ANN, BOB]))
    assert sum(runs) == 12  # 6.0 / 0.5, across both users
    visits = admin.dataset("visits").id
    ledger = admin.ledger(dataset=visits, everyone=True, limit=1000)
    assert sum(e.epsilon for e in ledger) == pytest.approx(6.0)
    for i, email in enumerate((ANN, BOB)):
        assert sum(1 for e in ledger if e.user_email == email) == runs[i] + runs[i + 2]


def test_the_audit_log_says_who_learned_what_under_which_policy(clinic: Server) -> None:
    admin, ann, bob = _login(clinic, ADMIN), _login(clinic, ANN), _login(clinic, BOB)
    # Remote tensors publish through the last login unless told: name the client.
    ann.dataset("visits")["age"].float().mean().publish(epsilon=0.25, client=ann)
    admin.set_policy(POLICY.replace('"clinic"', '"clinic-2"'), reason="renamed")
    bob.dataset("visits")["age"].float().sum().publish(epsilon=0.5, delta=1e-7, client=bob)
    with pytest.raises(sdk.PolicyRefusedError):
        bob.dataset("visits")["age"].float().sum().publish(epsilon=3.0, client=bob)

    names = {r.revision: r.name for r in admin.policy_history()}
    charges = list(reversed(admin.audit(action="privacy.charge")))
    assert [
        (
            e.actor_email,
            e.detail["mechanism"],
            e.detail["epsilon_units"] / 1e9,
            names[e.detail["policy_revision"]],
        )
        for e in charges
    ] == [(ANN, "laplace", 0.25, "clinic"), (BOB, "gaussian", 0.5, "clinic-2")]
    ledger = list(reversed(admin.ledger(everyone=True)))
    assert [e.id for e in ledger] == [e.target_id for e in charges]
    assert [e.policy_revision for e in ledger] == [1, 2]
    (refusal,) = admin.audit(action="publish.refused")
    assert (refusal.actor_email, refusal.detail["rule"]) == (BOB, "publish.max_epsilon")
    changes = [(e.action, e.actor_email) for e in admin.audit(action="policy.apply")]
    assert changes == [("policy.apply", ADMIN), ("policy.apply", None)]  # None: the CLI
    lines = clinic.cli("audit", "--action", "privacy.charge").splitlines()
    assert len(lines) == 2 and BOB in lines[0] and '"policy_revision": 2' in lines[0]
    ledger_lines = clinic.cli("ledger").splitlines()
    assert [line.rsplit(" ", 1)[1] for line in ledger_lines] == ["2", "1"]


def readme_admin_blocks() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Budget policies (admins)", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_readme_admin_section_runs(demo_server: Server) -> None:
    (block,) = readme_admin_blocks()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = block.replace("http://127.0.0.1:8000", demo_server.url)
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # our own README
    printed = out.getvalue()
    assert "policy revision 1\nrefused by publish.max_epsilon\n" in printed
    # the admin reads what the waiting publish computes, approves it, and it runs once
    assert "waiting for approval, request 1\npublish #1 by ds@example.org" in printed
    assert 'diabetes["age"]' in printed and "\ntensor(" in printed
    assert (
        "approved epsilon: 0.8 of 12 spent, 11.2 remaining; delta: 1e-18 of 1e-06 used, "
        "1e-06 remaining; renews" in printed
    )
    assert "ds@example.org laplace 0.8 1" in printed
    assert "admin@example.org 1 governance board, March" in printed

"""``dpnode policy``, ``budget``, ``ledger``, ``approval`` and ``audit``, in process, on each
backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpnode.core.errors import ApprovalRequiredError
from dpnode.node.context import NodeContext
from dpnode.node.services import budget, runs
from dpnode.node.services.budget import Cost
from dpnode.node.settings import Settings
from tests.node.test_cli import cli_env, run  # noqa: F401  (the fixture)


def _users(capsys: pytest.CaptureFixture[str]) -> None:
    for email, role in (("root@example.org", "admin"), ("ds@example.org", "data_scientist")):
        code, _, err = run(
            capsys, "user", "add", "--email", email, "--role", role, "--password", "long enough!"
        )
        assert code == 0, err


def test_policy_budget_ledger_and_audit_commands(
    cli_env: Settings,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    _users(capsys)
    code, out, _ = run(capsys, "policy", "show")
    assert code == 0 and out.startswith("# no policy was applied: the built-in default")
    assert json.loads(out.split("\n", 1)[1])["name"] == "default"

    bad = tmp_path / "bad.toml"
    bad.write_text("[publish]\nmax_epsilon = -1\n")
    code, _, err = run(capsys, "policy", "apply", str(bad), "--reason", "r")
    assert code == 2 and "invalid policy: publish.max_epsilon" in err
    code, _, err = run(capsys, "policy", "apply", str(tmp_path / "missing.toml"), "--reason", "r")
    assert code == 2 and "cannot read policy file" in err

    good = tmp_path / "clinic.toml"
    good.write_text('name = "clinic"\n[roles.data_scientist]\nepsilon = 2.0\n')
    code, out, _ = run(capsys, "policy", "apply", str(good), "--reason", "board decision")
    assert (code, out) == (0, "applied policy 'clinic' as revision 1\n")
    code, out, _ = run(capsys, "policy", "apply", str(good), "--reason", "again")
    assert out == "unchanged: this is already revision 1\n"
    code, out, _ = run(capsys, "policy", "show")
    assert "# revision 1 (clinic)" in out and "board decision" in out
    assert out.rstrip().endswith("epsilon = 2.0")
    code, _, err = run(capsys, "policy", "show", "--revision", "4")
    assert code == 2 and "no policy revision 4; the newest is 1" in err

    code, out, _ = run(
        capsys, "budget", "grant", "--user", "ds@example.org", "--epsilon", "0.5", "--reason", "x"
    )
    assert code == 0 and out.startswith("granted epsilon 0.5, delta 0 to ds@example.org")
    for bad_args, message in (
        (("--user", "nobody@example.org", "--epsilon", "1"), "no user with email"),
        (("--user", "ds@example.org", "--epsilon", "nan"), "epsilon must be a finite number"),
        (("--user", "ds@example.org", "--epsilon", "-1"), "epsilon must be a finite number"),
        (("--user", "ds@example.org", "--epsilon", "1", "--delta", "2"), "delta must be"),
    ):
        code, _, err = run(capsys, "budget", "grant", *bad_args, "--reason", "x")
        assert code == 2 and message in err, err

    context = NodeContext.from_settings(cli_env)
    try:
        budget.charge(context.serial_sessions, cli_env, 2, Cost("laplace", 10**9))
    finally:
        context.close()
    code, out, _ = run(capsys, "budget", "show", "--user", "ds@example.org")
    assert out.splitlines() == [
        "ds@example.org                   epsilon 1 of 2.5 spent, 1.5 left "
        "(roles.data_scientist.epsilon)",
        "policy in force: 'clinic' (revision 1)",
    ]
    code, out, _ = run(capsys, "ledger", "--user", "ds@example.org")
    (line,) = out.splitlines()
    assert "ds@example.org" in line and "epsilon 1 " in line and line.endswith("policy 1")
    code, out, _ = run(capsys, "audit", "--action", "budget.grant")
    (line,) = out.splitlines()
    assert "command line" in line and '"reason": "x"' in line and '"operator":' in line


def test_a_ledger_dataset_is_an_id_as_json_writes_it_or_a_name(
    cli_env: Settings,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    _users(capsys)
    table = tmp_path / "t.csv"
    table.write_text("x\n1\n2\n")
    bounds = tmp_path / "t.toml"
    bounds.write_text("[bounds]\nx = [0, 5]\n")
    for name in ("a", "١"):  # ids 1 and 2
        add = ("dataset", "add", str(table), "--name", name, "--bounds", str(bounds))
        code, _, err = run(capsys, *add, "--owner", "root@example.org")
        assert code == 0, err
    context = NodeContext.from_settings(cli_env)
    try:
        budget.charge(context.serial_sessions, cli_env, 2, Cost("laplace", 10**9, dataset_ids=[2]))
    finally:
        context.close()
    # isdigit() read '١' as id 1 and '02' as id 2; int() could not read '²'
    for ref in ("2", "١"):
        code, out, err = run(capsys, "ledger", "--dataset", ref)
        assert code == 0 and "datasets [2]" in out and len(out.splitlines()) == 1, (ref, out, err)
    assert run(capsys, "ledger", "--dataset", "a") == (0, "", "")
    for ref in ("02", "²", "9" * 5000):
        code, _, err = run(capsys, "ledger", "--dataset", ref)
        assert code == 2 and f"no dataset {ref!r}" in err, (ref, err)


def test_approval_list_shows_runs_with_their_steps(
    cli_env: Settings,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    _users(capsys)
    gate = tmp_path / "gate.toml"
    gate.write_text("[approval]\nepsilon_above = 0.05\n")
    assert run(capsys, "policy", "apply", str(gate), "--reason", "gate runs")[0] == 0
    code, out, _ = run(capsys, "approval", "list")
    assert (code, out) == (0, "no publish approvals\n")
    context = NodeContext.from_settings(cli_env)
    plan = runs.RunPlan(30, 0.1, 1e-6, 10, description="private_training: 30 steps")
    try:
        with pytest.raises(ApprovalRequiredError):
            runs.plan(context.serial_sessions, cli_env, 2, plan)
        with pytest.raises(ApprovalRequiredError):
            budget.charge(
                context.serial_sessions, cli_env, 2, Cost("laplace", 10**8, frame_hash="f" * 64)
            )
    finally:
        context.close()
    code, out, _ = run(capsys, "approval", "list", "--status", "pending")
    publish, planned = out.splitlines()  # newest first
    assert "ds@example.org" in planned and "pending" in planned
    assert "run of 30 steps (0 used)" in planned and "'private_training: 30 steps'" in planned
    assert "[approval.epsilon_above]" in planned
    assert "laplace publish, epsilon 0.1 delta 0" in publish
    code, _, err = run(capsys, "approval", "list", "--status", "nonsense")
    assert code == 2 and "unknown status" in err

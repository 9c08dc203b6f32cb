"""Back up, spend, restore: the node refuses publishes until the missing spending is carried
forward, and spent epsilon never goes down; on SQLite and PostgreSQL, through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.app import create_app
from dpnode.node.cli import main
from dpnode.node.context import NodeContext
from dpnode.node.db.models import AuditEvent, LedgerEntry
from dpnode.node.services.spending_mark import dataset_key, read_totals, user_key
from dpnode.node.settings import Settings
from tests.conftest import make_user
from tests.sdk.conftest import connect, remote_dataset
from tests.sdk.test_synthesize import table


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _spent(client: sdk.Client) -> float:
    return client.budget().spent_epsilon


def _ledger_rows(context: NodeContext) -> int:
    with context.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(LedgerEntry)) or 0)


def test_a_restored_backup_refuses_publishes_until_spending_is_carried_forward(
    settings: Settings, cli: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = NodeContext.from_settings(settings)
    make_user(first, "admin@example.org", "admin")
    owner = make_user(first, "owner@example.org", "data_owner")
    scientist = make_user(first, "ds@example.org", "data_scientist")
    try:
        with TestClient(create_app(context=first)) as http:
            ds = remote_dataset(connect(http, owner.email), connect(http, scientist.email))
            ds["age"].float().mean().publish(epsilon=0.5)
            out = _run(capsys, "backup", str(tmp_path / "backup"), *cli)
            assert "ledger up to row 1" in out
            for epsilon in (1.0, 0.25):  # spent after the backup: what a restore would refund
                ds["age"].float().mean().publish(epsilon=epsilon)
            before = _spent(connect(http, scientist.email))
            assert before == pytest.approx(1.75)
    finally:
        first.close()  # a clean stop: the mark is settled at the database's totals

    out = _run(capsys, "restore", str(tmp_path / "backup"), *cli)
    assert "behind the budget mark" in out and "dpnode budget carry-forward" in out

    second = NodeContext.from_settings(settings)
    try:
        with TestClient(create_app(context=second)) as http:
            client = connect(http, scientist.email)  # logins and reads keep working
            assert _spent(client) == pytest.approx(0.5)  # the restored database's view
            rows = _ledger_rows(second)
            with pytest.raises(sdk.BudgetMarkBehindError) as refused:
                client.dataset("cohort")["age"].float().mean().publish(epsilon=0.1)
            assert refused.value.status == 503
            assert "dpnode budget carry-forward" in refused.value.detail
            assert f"{user_key(scientist.id)} (epsilon 1.25," in refused.value.detail
            assert _ledger_rows(second) == rows  # nothing charged for the refusal

            out = _run(capsys, "budget", "carry-forward", "--reason", "restored backup")
            assert "carried epsilon 1.25, rho 0, delta " in out
            assert f"forward for {user_key(scientist.id)} (ledger row" in out
            assert "the node serves publishes again" in out
            assert _spent(client) == pytest.approx(before)  # what it was before the restore
            with second.engine.connect() as connection:
                totals = read_totals(connection).amounts
            assert totals[dataset_key("cohort")][0] == 1_750_000_000  # the cap's count too
            with second.sessions() as session:
                actions = set(session.scalars(select(AuditEvent.action)))
            assert "budget.carry_forward" in actions

            # The same process serves again, without a restart, and spends on top.
            client.dataset("cohort")["age"].float().mean().publish(epsilon=0.1)
            assert _spent(client) == pytest.approx(before + 0.1)
            out = _run(capsys, "budget", "carry-forward", "--reason", "again")
            assert "nothing to carry forward" in out
    finally:
        second.close()


def test_restore_refuses_while_the_node_runs(
    settings: Settings, cli: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    context = NodeContext.from_settings(settings)
    try:
        with TestClient(create_app(context=context)):  # started: holds its lease file
            _run(capsys, "backup", str(tmp_path / "b"), *cli)
            assert main(["restore", str(tmp_path / "b"), *cli]) == 2
            assert "stop the node before restoring" in capsys.readouterr().err
            assert main(["backup", str(tmp_path / "b"), *cli]) == 2  # never over a backup
            assert "is not empty" in capsys.readouterr().err
    finally:
        context.close()


def test_a_restored_backup_cannot_re_spend_the_cap_an_owners_synthetic_mock_used(
    settings: Settings, cli: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mock's charge is paid from the dataset's cap, not from the owner's budget: the
    budget mark covers it under the dataset's key, so a restore from before it refuses
    publishes until carry-forward puts it back on the cap, where no one can spend it again
    (and on no one's own budget)."""
    first = NodeContext.from_settings(settings)
    admin = make_user(first, "admin@example.org", "admin")
    owner = make_user(first, "owner@example.org", "data_owner")
    scientist = make_user(first, "ds@example.org", "data_scientist")
    try:
        with TestClient(create_app(context=first)) as http:
            connect(http, owner.email).upload_dataset(
                "cohort",
                table(200, 0),
                bounds={"age": (0, 120), "bmi": (10, 70)},
                categories={"region": ["north", "south", "east"]},
            )
            connect(http, admin.email).set_policy(
                "[datasets.cohort]\nmax_epsilon = 5.0\nmax_delta = 1e-5\n", reason="a promise"
            )
            _run(capsys, "backup", str(tmp_path / "backup"), *cli)
            cohort = connect(http, owner.email).dataset("cohort")
            cohort.synthesize_mock(epsilon=2.0, delta=1e-6, bins={"age": 8, "bmi": 8})
            used = cohort.budget().epsilon_used
            assert used is not None and used > 1.0
    finally:
        first.close()

    out = _run(capsys, "restore", str(tmp_path / "backup"), *cli)
    assert "behind the budget mark" in out

    second = NodeContext.from_settings(settings)
    try:
        with TestClient(create_app(context=second)) as http:
            client = connect(http, scientist.email)
            cohort = connect(http, owner.email).dataset("cohort")
            assert cohort.budget().epsilon_used == 0  # the restored database forgot it
            assert cohort.mock_synthetic is None  # and the mock it made
            with pytest.raises(sdk.BudgetMarkBehindError) as refused:
                client.dataset("cohort")["age"].float().mean().publish(epsilon=4.0)
            assert dataset_key("cohort") in refused.value.detail
            assert user_key(owner.id) not in refused.value.detail  # not the owner's spending

            _run(capsys, "budget", "carry-forward", "--reason", "restored backup")
            assert cohort.budget().epsilon_used == pytest.approx(used, abs=1e-6)
            # what the mock used cannot be spent again: 4 fitted the restored cap, not now
            with pytest.raises(sdk.BudgetExceededError) as over:
                client.dataset("cohort")["age"].float().mean().publish(epsilon=4.0)
            assert over.value.rule == "datasets.cohort.max_epsilon"
            # and carrying it forward charged nobody's own budget
            for user in (admin, owner):
                assert connect(http, user.email).budget().spent_epsilon == 0
    finally:
        second.close()

"""``dpnode dataset show``: a dataset's columns and how much of its cap all users spent, in
process, on each backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpnode.node.context import NodeContext
from dpnode.node.services import budget
from dpnode.node.services.budget import Cost
from dpnode.node.settings import Settings
from tests.node.test_cli import cli_env, run  # noqa: F401  (the fixture)

UNIT = 10**9  # ledger units in one epsilon


def test_dataset_show_gives_the_columns_and_the_exact_use_of_the_cap(
    cli_env: Settings,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    for email, role in (("root@example.org", "admin"), ("ds@example.org", "data_scientist")):
        code, _, err = run(
            capsys, "user", "add", "--email", email, "--role", role, "--password", "long enough!"
        )
        assert code == 0, err
    table, bounds, policy = tmp_path / "v.csv", tmp_path / "b.toml", tmp_path / "p.toml"
    table.write_text("age,bmi\n34,22.5\n51,25\n35,30\n")
    bounds.write_text("[bounds]\nage = [0, 120]\nbmi = [10, 70]\n")
    code, _, err = run(
        capsys, "dataset", "add", str(table), "--name", "visits", "--bounds", str(bounds)
    )
    assert code == 0, err
    code, out, _ = run(capsys, "dataset", "show", "visits")
    assert out.splitlines()[-1] == "cap: not capped"

    policy.write_text("[datasets.visits]\nmax_epsilon = 30.0\n")
    code, _, err = run(capsys, "policy", "apply", str(policy), "--reason", "a lifetime cap")
    assert code == 0, err
    context = NodeContext.from_settings(cli_env)
    try:
        for units in (UNIT // 2, UNIT // 4, 3 * UNIT // 4):
            cost = Cost("laplace", units, dataset_ids=[1])
            budget.charge(context.serial_sessions, cli_env, 2, cost)
        budget.charge(context.serial_sessions, cli_env, 2, Cost("laplace", UNIT))  # no dataset
    finally:
        context.close()
    code, out, _ = run(capsys, "dataset", "show", "visits")
    assert code == 0
    assert out.splitlines() == [
        "dataset 1 'visits', owner root@example.org: 3 rows",
        "  age                      int64    bounds [0, 120]",
        "  bmi                      float64  bounds [10, 70]",
        "cap: epsilon 1.5 of 30, delta 0 of 1e-06 used",
    ]
    code, _, err = run(capsys, "dataset", "show", "nothing")
    assert code == 2 and "nothing" in err

"""``dpnode dataset show``: a dataset's columns and how much of its cap all users spent, in
process, on each backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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
        "mock: none",
        "cap: epsilon 1.5 of 30, delta 0 of 1e-06 used",
    ]
    code, _, err = run(capsys, "dataset", "show", "nothing")
    assert code == 2 and "nothing" in err


def test_dataset_synthesize_mock_pays_from_the_cap_and_show_says_where_the_mock_came_from(
    cli_env: Settings,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    code, _, err = run(
        capsys, "user", "add", "--email", "root@example.org", "--role", "admin",
        "--password", "long enough!",
    )  # fmt: skip
    assert code == 0, err
    rng = np.random.default_rng(0)
    table, bounds, policy = tmp_path / "v.csv", tmp_path / "b.toml", tmp_path / "p.toml"
    ages, bmis = rng.integers(18, 90, 200), rng.uniform(15, 45, 200)
    rows = [f"{a},{b:.2f}" for a, b in zip(ages, bmis, strict=True)]
    table.write_text("age,bmi\n" + "\n".join(rows) + "\n")
    bounds.write_text("[bounds]\nage = [0, 120]\nbmi = [10, 70]\n")
    assert (
        run(capsys, "dataset", "add", str(table), "--name", "visits", "--bounds", str(bounds))[0]
        == 0
    )
    mock = ("dataset", "synthesize-mock", "visits", "--epsilon", "2", "--delta", "1e-6")
    code, _, err = run(capsys, *mock)
    assert code == 2 and "[datasets.visits] max_epsilon" in err  # no cap: nothing to pay from
    policy.write_text("[datasets.visits]\nmax_epsilon = 30.0\nmax_delta = 1e-5\n")
    assert run(capsys, "policy", "apply", str(policy), "--reason", "a lifetime cap")[0] == 0
    code, out, err = run(capsys, *mock)
    assert code == 0, err
    assert "is now synthetic (mst, epsilon 2, delta 1e-06, 200 rows)" in out
    assert "ledger row 1 in root@example.org's name" in out
    code, out, _ = run(capsys, "dataset", "show", "visits")
    lines = out.splitlines()
    assert lines[3] == (
        "mock: 200 rows, synthetic: mst, epsilon 2, delta 1e-06, ledger row 1, paid from the cap"
    )
    assert lines[4].startswith("cap: epsilon 2.") and "of 30" in lines[4]

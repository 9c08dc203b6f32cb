"""docs/policies.md: its example policy is valid, its code runs and prints what it says."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from dpnode.policies import RULES, load_policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "policies.md"


def _blocks(kind: str) -> list[str]:
    """The fenced blocks whose info string is ``kind``, in order."""
    blocks: list[str] = []
    current: list[str] = []
    info: str | None = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if info is None:
                info, current = line[3:].strip(), []
            else:
                if info == kind:
                    blocks.append("\n".join(current) + "\n")
                info = None
        elif info is not None:
            current.append(line)
    return blocks


def test_example_policy_is_valid() -> None:
    (toml,) = _blocks("toml")
    policy = load_policy(toml)
    assert policy.users["alice@example.org"].epsilon == 6.0
    assert policy.rate_limit is not None and policy.rate_limit.window == "1h"


def test_usage_example_prints_what_the_doc_says() -> None:
    (code,) = _blocks("python")
    expected = _blocks("")[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), {})  # our own document, not client input
    lines = out.getvalue().splitlines()
    assert lines[: len(expected.splitlines())] == expected.splitlines()
    assert len(lines) == len(expected.splitlines()) + 1


def test_every_rule_name_is_in_the_table() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in (
        "publish.max_epsilon",
        "publish.max_delta",
        "rate_limit.max_publishes",
        "users.EMAIL.epsilon",
        "roles.ROLE.epsilon",
        "defaults.epsilon",
        "datasets.NAME.max_epsilon",
        "datasets.NAME.max_delta",
        "approval.epsilon_above",
        "approval.delta_above",
    ):
        assert f"`{name}`" in text, name
    # The table lists the rules in the order they are checked.
    assert [family for family, _ in RULES] == [
        "publish",
        "rate_limit",
        "budget",
        "datasets",
        "approval",
    ]

"""The README's snippets really run, twice in a row, against one real demo node; and the demo
banner's snippet runs as printed."""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import REPO, Server

README = (REPO / "README.md").read_text()


def python_blocks(heading: str) -> list[str]:
    section = README.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def walkthrough_blocks() -> list[str]:
    return python_blocks("Walkthrough")


def run_blocks(blocks: list[str], url: str, where: str = "README.md") -> str:
    """Run each block as a fresh script on the node at ``url``; what they printed."""
    out = io.StringIO()
    for block in blocks:
        code = block.replace("http://127.0.0.1:8000", url)
        with contextlib.redirect_stdout(out):
            exec(compile(code, where, "exec"), {"__name__": "readme"})
    return out.getvalue()


def test_the_readme_has_a_walkthrough() -> None:
    assert len(walkthrough_blocks()) >= 3
    assert len(python_blocks("Budget policies (admins)")) == 1


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_readme_walkthrough_runs_twice_then_the_policy_section_twice(
    demo_server: Server, tmp_path: Path
) -> None:
    printed = run_blocks(walkthrough_blocks(), demo_server.url)
    assert "(442, 11) (0.0, 120.0)" in printed
    assert "Sensitivity(l1=0.2715" in printed  # 120 / 442, and a float32 last bit: 2**-23 * 120
    assert "epsilon: 0.5 of 10 spent, 9.5 remaining" in printed
    assert printed.count("refused:") == 2
    assert "column 'age' has 1 values outside its declared bounds [0, 120]" in printed
    assert "analyst@example.org data_scientist False" not in printed  # listed before deactivation
    assert "analyst@example.org data_scientist True" in printed
    assert "user.update" in printed
    # the last step's receipt: what it took from the budget, the filter's conversion of the
    # zCDP total growing by less than the asked 0.25 once the first step paid its log term
    assert "gaussian noise of scale 18.57 for sensitivity 1; charged epsilon 0.0246" in printed
    assert "(asked 0.25)" in printed
    accuracy = float(re.search(r"accuracy (\S+)", printed).group(1))  # type: ignore[union-attr]
    assert accuracy > 0.8, printed
    assert "epsilon: 2.55637 of 10 spent, 7.44363 remaining" in printed
    # the CNN: 40 Gaussian steps in at most 4 epsilon as the node's ledger counts them (less
    # after the logistic regression's steps: the filter's conversion is concave), and a
    # published accuracy far above chance
    cnn = float(re.search(r"cnn accuracy (\S+)", printed).group(1))  # type: ignore[union-attr]
    assert cnn > 0.3, printed
    spent = [float(e) for e in re.findall(r"epsilon: (\S+) of 10 spent", printed)]
    assert 2.55637 + 2.5 < spent[-1] <= 2.55637 + 4.5, spent
    # statistics: a histogram at the sensitivity of a partition, and means per group
    assert re.search(r"patients per 20 years \[[-\d, ]+\] 2\.0000", printed), printed
    bmi = re.search(r"bmi by sex \{1\.0: (\S+), 2\.0: (\S+)\}", printed)
    assert bmi is not None and all(18 < float(m) < 35 for m in bmi.groups()), printed
    # the query builder: a row per sex, each statistic beside its noise scale, and the split
    assert re.search(r"sex\s+count\s+count_scale\s+bmi_mean\s+bmi_mean_scale", printed), printed
    assert "epsilon 0.5 split across 2 publish(es)" in printed, printed
    # the same kind of question in SQL: one row, each statistic beside its noise scale
    sql = re.search(r"\[\{'count': (\S+), 'count_scale': \S+, 'bmi_mean': (\S+),", printed)
    assert sql is not None and 18 < float(sql.group(2)) < 35, printed
    # the ledger: the CNN's 40 steps on one line, and the lines add up to the budget
    assert re.search(r"run \d+: 40 steps, epsilon used \S+, delta used", printed), printed
    assert "adds up: True" in printed
    # a synthetic copy of five columns: every row back, values inside the declared bounds
    assert "synthetic: mst (442, 5) True" in printed, printed
    # docs/api.md's ledger example, on the node the walkthrough left
    api = (REPO / "docs" / "api.md").read_text().split("## The ledger", 1)[1]
    (block,) = re.findall(r"```python\n(.*?)```", api.split("\n## ", 1)[0], flags=re.S)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = block.replace("http://127.0.0.1:8000", demo_server.url)
        exec(compile(code, "docs/api.md", "exec"), {"__name__": "docs"})
    assert re.search(r"run \d+: 40 steps, epsilon used", out.getvalue()), out.getvalue()
    # Again, on the same node, as a reader who runs the walkthrough a second time: what the
    # first run uploaded and created is reused, and the admin's grant paid for this run.
    again = run_blocks(walkthrough_blocks(), demo_server.url)
    assert "already there: a user with email analyst@example.org already exists" in again
    assert "<Dataset 'clinic_visits'" in again and again.count("refused:") == 2
    assert "epsilon: 0.5 of 10 spent" not in again and "of 20 spent" in again
    assert "adds up: True" in again
    assert float(re.search(r"cnn accuracy (\S+)", again).group(1)) > 0.3  # type: ignore[union-attr]
    # The policy section, twice: its approval gate queues the same publish again, and each
    # run's budget request is answered.
    for _ in range(2):
        policy = run_blocks(python_blocks("Budget policies (admins)"), demo_server.url)
        assert "refused by publish.max_epsilon" in policy, policy
        assert re.search(r"waiting for approval, request \d+", policy), policy
        assert re.search(r"^approved epsilon: ", policy, flags=re.M), policy


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_demo_banners_snippet_runs_as_printed(demo_server: Server) -> None:
    banner = demo_server.output().split("Paste into Python", 1)[1]
    snippet = textwrap.dedent(banner.split("\n\n", 2)[1])
    assert snippet.startswith("from dpnode import sdk\n"), snippet
    assert demo_server.url in snippet  # the address the node serves on, as printed
    assert "make sdk" in banner.split("\n", 1)[0]  # the README's install step
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, "banner", "exec"), {"__name__": "banner"})
    printed = out.getvalue()
    assert printed.startswith("<Dataset 'diabetes' tags=['health',"), printed
    assert re.search(r"age +float64 in \[0, 120\]", printed), printed

"""An admin reviews a waiting publish in a real browser (Debian's headless Chromium, driven by
Playwright) against a real ``dpnode serve``: the approvals page shows the dataset, its columns
and the operation, the noise, the requester's description (as text, markup and all) and the
dataset's cap; the admin approves; the catalog page and ``dpnode dataset show`` then show the
cap's exact use. Screenshots go where ``tests/console/test_browser.py`` puts them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from playwright.sync_api import Browser

from dpnode import sdk
from tests.console.conftest import serve
from tests.console.test_browser import PASSWORD, _sign_in, _visit
from tests.e2e.conftest import Server

ADMIN, OWNER, ANN = "admin@example.org", "owner@example.org", "ann@example.org"
POLICY = (
    'name = "reviewed"\n[approval]\nepsilon_above = 0.5\n[datasets.diabetes]\nmax_epsilon = 30.0\n'
)
SCRIPT = "<script>document.title = 'owned'</script> mean BMI for the board"


class Node:
    def __init__(self, server: Server, shots: Path) -> None:
        self.server, self.url, self.shots = server, server.url, shots
        admin = sdk.login(server.url, email=ADMIN, password=PASSWORD)
        admin.set_policy(POLICY, reason="big releases need a look; a lifetime cap")
        admin.create_user(OWNER, PASSWORD, role="data_owner")
        admin.create_user(ANN, PASSWORD, role="data_scientist")
        self.owner = sdk.login(server.url, email=OWNER, password=PASSWORD)
        rng = np.random.default_rng(5)
        self.owner.upload_dataset(
            "diabetes",
            {"age": rng.integers(20, 80, 442), "bmi": rng.uniform(18, 42, 442)},
            bounds={"age": (0, 120), "bmi": (18, 42)},
            tags=["health"],
        )
        self.ann = sdk.login(server.url, email=ANN, password=PASSWORD)

    def mean_bmi(self, epsilon: float, description: str = "") -> object:
        bmi = self.ann.dataset("diabetes")["bmi"]
        return bmi.mean().publish(epsilon=epsilon, description=description)

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "dpnode", *args],
            env=self.server.env,
            check=True,
            capture_output=True,
            text=True,
            cwd=self.server.log.parent,
        )
        return done.stdout


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    with serve(tmp_path_factory, ADMIN, PASSWORD) as (server, shots):
        yield Node(server, shots)


def test_an_admin_reads_what_a_publish_computes_approves_it_and_sees_the_cap_used(
    browser: Browser,
    node: Node,
) -> None:
    with pytest.raises(sdk.ApprovalRequiredError) as waiting:
        node.mean_bmi(0.8, SCRIPT)
    approval = waiting.value.approval_id
    page = _sign_in(browser, node, ADMIN)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    _visit(page, node, "/console/approvals", "admin-approval-review")
    card = page.locator("article", has=page.get_by_role("heading", name=f"publish #{approval}"))
    listing = card.locator("pre.computation").inner_text().splitlines()
    assert listing[0] == 'x0 = diabetes["bmi"]   # float64 (442,) bounds [18, 42]'
    assert listing[1] == "x1 = x0.mean()   # float64 ()"
    assert listing[2].startswith("release x1  # shape (), L1 sensitivity ")
    assert "laplace scale" in listing[2]
    # The description is text: shown as typed, never run.
    assert card.locator("q.description").inner_text() == SCRIPT
    assert "&lt;script&gt;" in page.content()
    assert page.title() != "owned" and dialogs == []
    caps = card.get_by_role("table").inner_text()
    assert "diabetes" in caps and "0 / 30" in caps
    assert f"{ANN}'s budget left" in card.inner_text()

    card.get_by_label("Reason for approving").fill("an aggregate for the board")
    card.get_by_role("button", name=f"Approve #{approval}").click()
    assert page.get_by_role("status").inner_text() == "Approved."
    released = node.mean_bmi(0.8, SCRIPT)
    assert 18 <= float(released) <= 42  # type: ignore[arg-type]  # clipped to its bounds
    node.mean_bmi(0.25)
    node.mean_bmi(0.5)  # not above the threshold: no approval

    cap = node.owner.dataset("diabetes").budget()
    assert (cap.epsilon_used, cap.epsilon) == (1.55, 30.0)
    _visit(page, node, "/console/catalog", "admin-catalog-cap")
    shown = page.locator("p.cap").inner_text()
    assert shown.startswith("Cap: epsilon 1.55 used of 30 (28.45 left); delta ")
    assert shown.endswith("used of 1e-06, for the dataset's lifetime.")
    assert "cap: epsilon 1.55 of 30, delta" in node.cli("dataset", "show", "diabetes")
    page.context.close()

    ann = _sign_in(browser, node, ANN)
    _visit(ann, node, "/console/catalog", "ds-catalog-no-cap")
    assert ann.locator("p.cap").count() == 0  # the cap tells how much others queried
    ann.context.close()

"""The console's ledger and budget pages show a training run as one row, its steps under a
disclosure, each with the epsilon it added to the budget (through the real app)."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from tests.console.conftest import Browser, Pending
from tests.node.conftest import publish

_ROW = re.compile(r'^  <tr><th scope="row">(\d+)</th>', re.M)  # a line, not a step within


def test_a_run_is_one_row_with_its_steps_under_a_disclosure(
    http: TestClient, ds_browser: Browser, admin_browser: Browser, pending: Pending
) -> None:
    plan = {"steps": 3, "epsilon": 0.1, "delta": 1e-8, "values": 1, "description": "a <b> run"}
    planned = http.post("/api/v1/publish/runs", json=plan, headers=pending.ds_h)
    assert planned.status_code == 200, planned.text
    run_id = planned.json()["run_id"]
    for _ in range(3):
        step = publish(http, pending.ds_h, pending.frame, 0.1, delta=1e-8, run=run_id)
        assert step.status_code == 200, step.text
    assert publish(http, pending.ds_h, pending.frame, 0.25).status_code == 200
    lines = http.get("/api/v1/ledger/grouped", headers=pending.ds_h).json()
    steps = [e["id"] for e in lines[1]["entries"]]
    for browser, path in ((ds_browser, "/console/ledger"), (ds_browser, "/console/me")):
        page = browser.get(path).text
        table = page.split('<table class="ledger">', 1)[1].split("\n</table>", 1)[0]
        assert [int(i) for i in _ROW.findall(table)] == [line["id"] for line in lines]
        assert page.count("<details>") == 1
        assert f"Run {run_id}: 3 steps of 3 (a &lt;b&gt; run)" in page
        inside = page.split("<details>", 1)[1].split("</details>", 1)[0]
        assert [int(i) for i in re.findall(r'<th scope="row">(\d+)</th>', inside)] == steps
        assert f"{lines[1]['epsilon_used']:.6g}" in page  # the run's total in epsilon terms
    # An admin's budget page for the user groups the same way.
    scientist_id = lines[0]["user_id"]
    page = admin_browser.get(f"/console/budgets/{scientist_id}").text
    assert page.count("<details>") == 1 and f"Run {run_id}: 3 steps" in page

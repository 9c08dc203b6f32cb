"""``client.ledger()`` shows a training run as one line, in epsilon terms that add up to the
budget (the SDK against the real app, in process)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.context import NodeContext
from tests.conftest import make_user
from tests.sdk.conftest import connect

N = 120


@pytest.fixture
def points(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (N, 3)).astype(np.float32)
    label = (x[:, 0] > 0.5).astype(np.int64)
    owner_client.upload_dataset(
        "points", {"x": x, "label": label}, bounds={"x": (0.0, 1.0), "label": (0, 1)}
    )
    return ds_client.dataset("points")


def test_a_training_run_is_one_line_whose_epsilon_used_adds_up(
    points: sdk.DatasetHandle, ds_client: sdk.Client, sqlite_only: None
) -> None:
    x, y = points.tensors("x", "label")
    points["x"].float().mean().publish(epsilon=0.5)  # a publish of its own, first
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    run = sdk.private_training(
        model,
        opt,
        (x, y),
        loss_fn=F.cross_entropy,
        target_epsilon=1.0,
        steps=4,
        max_grad_norm=1.0,
        progress=False,
    )
    history = run.fit()
    assert run.run is not None and run.run.approval_id is None

    ledger = ds_client.ledger()
    assert [(line.kind, line.steps) for line in ledger] == [("run", 4), ("charge", 1)]
    line = ledger[0]
    assert line.run_id == run.run.run_id and line.run is not None and line.run.steps == 4
    assert line.description.startswith("private_training: 4 steps")
    # The run's line is its steps' epsilon used, summed; the lines add up to the budget.
    assert line.epsilon_used == pytest.approx(sum(e.epsilon_used for e in line.entries), abs=1e-8)
    spent = ds_client.budget().spent_epsilon
    assert sum(x.epsilon_used for x in ledger) == pytest.approx(spent, abs=1e-8)
    assert line.epsilon_used == pytest.approx(spent - 0.5, abs=1e-8)
    # Each step's receipt states the run so far; the last one the run's total.
    last = history[-1].receipt
    assert (last.run_id, last.run_steps, last.run_planned_steps) == (line.run_id, 4, 4)
    assert last.run_epsilon == pytest.approx(line.epsilon_used, abs=1e-8)
    assert run.epsilon == last.run_epsilon
    assert f"run {line.run_id}: 4 of 4 steps, epsilon" in str(last)
    # Expanded, every charge on its own; runs() keeps the runs.
    flat = ledger.expand()
    assert len(flat) == 5 and [e.run_id for e in flat] == [line.run_id] * 4 + [None]
    assert [e.id for e in flat] == [e.id for e in ds_client.ledger_entries()]
    assert [e.id for e in ds_client.ledger_entries(run_id=line.run_id)] == [
        e.id for e in line.entries
    ]
    assert [r.run_id for r in ledger.runs()] == [line.run_id]
    # Shown as one row per line, the run's steps under a disclosure.
    frame = ledger.to_pandas()
    assert len(frame) == 2 and list(frame["steps"]) == [4, 1]
    assert "epsilon_used" in frame.columns and "entries" not in frame.columns
    html = ledger._repr_html_()
    assert re.search(r"ledger</strong> \(2\)", html) and html.count("<details>") == 1
    assert f"the 4 steps of run {line.run_id}" in html
    assert "run " in str(line) and "epsilon used" in str(line)
    # Printed, one text line per run or publish; expanded, one per charge
    text = str(ledger).splitlines()
    assert len(text) == 2 and f"run {line.run_id}: 4 steps, epsilon used" in text[0]
    assert "publish" in text[1] and "(laplace), epsilon used 0.5" in text[1]
    steps = str(flat).splitlines()
    assert len(steps) == 5 and all(f"step of run {line.run_id}" in s for s in steps[:4])


def test_publishing_under_someone_else_s_run_is_refused(
    points: sdk.DatasetHandle, ds_client: sdk.Client, http: TestClient, context: NodeContext
) -> None:
    x, y = points.tensors("x", "label")
    planned = ds_client.plan_run(
        steps=2, epsilon=0.1, delta=1e-8, values=8, dataset_ids=[points.id]
    )
    make_user(context, "ds2@example.org", "data_scientist")
    other = connect(http, "ds2@example.org")
    model = torch.nn.Linear(3, 2)
    F.cross_entropy(model(x), y).backward()
    with pytest.raises(sdk.NotFoundError, match="not a run you planned"):
        sdk.publish_grads(
            model, epsilon=0.1, delta=1e-8, max_grad_norm=1.0, client=other, run_id=planned.run_id
        )
    assert other.ledger() == [] and other.budget().spent_epsilon == 0
    receipt = sdk.publish_grads(
        model, epsilon=0.1, delta=1e-8, max_grad_norm=1.0, client=ds_client, run_id=planned.run_id
    )
    assert receipt.run_id == planned.run_id and receipt.run_steps == 1

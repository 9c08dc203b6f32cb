"""The ledger shows a training run as a run, in epsilon terms that add up (through the real
app, on both databases).

Reported: a 40-step run was 40 rows on the ledger, each Gaussian step showing an epsilon of
~3e-08 beside a rho, so that no row said what it took from the budget and the rows did not
add up to the epsilon the budget reports as spent. Now every planned run is recorded, each
step's row names it, ``GET /ledger/grouped`` shows its steps as one line, and each row's
``epsilon_used`` (what it added to the budget's ``spent_epsilon``) adds up to that total.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from alembic import command
from httpx import Response
from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.migrate import alembic_config, check, upgrade
from dpnode.node.db.models import User
from dpnode.node.db.session import make_engine
from dpnode.node.settings import Settings
from tests.conftest import login, make_user
from tests.node.conftest import publish, refused, upload_ok
from tests.node.frames import read_frame

N = 50
STEP_EPSILON, STEP_DELTA = 0.2, 1e-8


def _sum_frame(http: TestClient, owner_h: dict[str, str], name: str = "visits") -> bytes:
    body = upload_ok(http, owner_h, name, {"x": np.linspace(0, 1, N)}, bounds={"x": (0, 1)})
    b = GraphBuilder()
    x = b.input(f"dataset:{body['id']}/x", "float64", (N,))
    return encode(b.build([b.op("sum", x)]))


def _ok(response: Response) -> Any:
    assert response.status_code in (200, 201), response.text
    return response.json()


def _receipt(response: Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    manifest, _ = read_frame(response.content)
    receipt: dict[str, Any] = manifest["receipt"]
    return receipt


def _plan(http: TestClient, headers: dict[str, str], steps: int) -> dict[str, Any]:
    body = {"steps": steps, "epsilon": STEP_EPSILON, "delta": STEP_DELTA, "values": 1}
    return dict(_ok(http.post("/api/v1/publish/runs", json=body, headers=headers)))


def _step(http: TestClient, headers: dict[str, str], frame: bytes, run_id: int) -> Response:
    return publish(http, headers, frame, STEP_EPSILON, delta=STEP_DELTA, run=run_id)


def test_a_run_is_one_line_whose_epsilon_used_sums_its_steps_and_the_budget(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    frame = _sum_frame(http, owner_h)
    assert _receipt(publish(http, ds_h, frame, 0.5))["epsilon"] == 0.5  # a publish of its own
    plan = _plan(http, ds_h, 5)
    assert plan["approval_id"] is None and plan["run_id"] > 0
    assert _plan(http, ds_h, 5)["run_id"] == plan["run_id"]  # again before a step: the same run
    receipts = [_receipt(_step(http, ds_h, frame, plan["run_id"])) for _ in range(5)]
    assert [r["run_steps"] for r in receipts] == [1, 2, 3, 4, 5]
    assert {(r["run_id"], r["run_planned_steps"]) for r in receipts} == {(plan["run_id"], 5)}
    # Each receipt states the run's total so far in epsilon terms: its steps' epsilon summed.
    so_far = np.cumsum([r["epsilon"] for r in receipts])
    assert [r["run_epsilon"] for r in receipts] == pytest.approx(list(so_far), abs=1e-8)
    assert _receipt(publish(http, ds_h, frame, 0.25))["epsilon"] == 0.25

    lines = _ok(http.get("/api/v1/ledger/grouped", headers=ds_h))
    assert [(line["kind"], line["steps"]) for line in lines] == [
        ("charge", 1),
        ("run", 5),
        ("charge", 1),
    ]
    run = lines[1]
    assert run["run"]["id"] == plan["run_id"] and run["run"]["steps"] == 5
    assert run["mechanism"] == "gaussian" and len(run["entries"]) == 5
    steps_used = [e["epsilon_used"] for e in run["entries"]]
    assert all(e["run_id"] == plan["run_id"] for e in run["entries"])
    # The first Gaussian step pays for starting the zCDP total: more than each later one.
    assert steps_used[-1] > max(steps_used[:-1]) > 0
    assert run["epsilon_used"] == pytest.approx(sum(steps_used), abs=1e-8)
    assert run["epsilon_used"] == pytest.approx(receipts[-1]["run_epsilon"], abs=1e-8)
    # Each step's raw epsilon is the sampler's tiny one, beside its rho: kept, not summed.
    assert all(e["epsilon"] < 1e-6 and e["rho"] > 0 for e in run["entries"])
    spent = _ok(http.get("/api/v1/budget", headers=ds_h))["spent_epsilon"]
    assert sum(line["epsilon_used"] for line in lines) == pytest.approx(spent, abs=1e-8)
    assert spent == pytest.approx(0.75 + run["epsilon_used"], abs=1e-8)
    # The flat ledger says the same, row by row; one run's steps by run_id.
    rows = _ok(http.get("/api/v1/ledger", headers=ds_h))
    assert len(rows) == 7
    assert sum(r["epsilon_used"] for r in rows) == pytest.approx(spent, abs=1e-8)
    steps = _ok(http.get(f"/api/v1/ledger?run_id={plan['run_id']}", headers=ds_h))
    assert [s["id"] for s in steps] == [e["id"] for e in run["entries"]]
    # Lines page by their newest row.
    (older,) = _ok(http.get(f"/api/v1/ledger/grouped?before_id={run['id']}", headers=ds_h))
    assert older["kind"] == "charge" and older["epsilon_used"] == 0.5
    # Planning the same run again once it has steps starts a new one.
    assert _plan(http, ds_h, 5)["run_id"] != plan["run_id"]


def test_a_step_naming_someone_else_s_run_is_refused_with_nothing_charged(
    context: NodeContext,
    http: TestClient,
    owner_h: dict[str, str],
    ds_h: dict[str, str],
) -> None:
    frame = _sum_frame(http, owner_h)
    mine = _plan(http, ds_h, 3)["run_id"]
    make_user(context, "ds2@example.org", "data_scientist")
    other_h = login(http, "ds2@example.org")
    message = refused(_step(http, other_h, frame, mine), 404, "not_found")
    assert f"training run {mine}, which is not a run you planned" in message
    assert "nothing was charged" in message
    refused(_step(http, ds_h, frame, mine + 1000), 404, "not_found")  # no such run at all
    assert _ok(http.get("/api/v1/ledger", headers=other_h)) == []
    assert _ok(http.get("/api/v1/ledger", headers=ds_h)) == []
    assert _ok(http.get("/api/v1/budget", headers=other_h))["spent_epsilon"] == 0
    _receipt(_step(http, ds_h, frame, mine))  # the owner of the run may


def test_the_rows_of_a_renewal_window_add_up_to_its_spent_epsilon(
    http: TestClient, admin_h: dict[str, str], owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    frame = _sum_frame(http, owner_h)
    toml = '[renewal]\nevery = "30d"\nanchor = 2026-01-01T00:00:00Z\n'
    _ok(http.put("/api/v1/policy", json={"toml": toml, "reason": "r"}, headers=admin_h))
    run_id = _plan(http, ds_h, 3)["run_id"]
    for _ in range(3):
        _receipt(_step(http, ds_h, frame, run_id))
    budget = _ok(http.get("/api/v1/budget", headers=ds_h))
    assert budget["period_start"] is not None
    (line,) = _ok(http.get("/api/v1/ledger/grouped", headers=ds_h))
    assert line["epsilon_used"] == pytest.approx(budget["spent_epsilon"], abs=1e-8)
    # An admin's view of everyone's ledger groups the same way, and names the user.
    (seen,) = _ok(http.get("/api/v1/ledger/grouped?all_users=true", headers=admin_h))
    assert (seen["id"], seen["user_email"], seen["steps"]) == (line["id"], "ds@example.org", 3)


def _node(settings: Settings) -> tuple[NodeContext, TestClient]:
    context = NodeContext.from_settings(settings)
    return context, TestClient(create_app(context=context))


def test_the_migration_upgrades_a_database_with_ledger_rows(
    settings: Settings, database_url: str, tmp_path: Path
) -> None:
    """A node's ledger as 0008 held it (no runs) upgraded: its rows kept, each a line of its
    own, still append-only, its totals still kept; then runs are recorded."""
    context, http = _node(settings)
    with http:
        make_user(context, "owner@example.org", "data_owner")
        make_user(context, "ds@example.org", "data_scientist")
        owner_h, ds_h = login(http, "owner@example.org"), login(http, "ds@example.org")
        frame = _sum_frame(http, owner_h)
        for epsilon in (0.25, 0.5):
            _receipt(publish(http, ds_h, frame, epsilon))
        _receipt(publish(http, ds_h, frame, 0.1, delta=1e-8))
    context.close()

    engine = make_engine(database_url)
    try:
        command.downgrade(alembic_config(database_url), "0008")
        with engine.connect() as connection:
            assert "training_runs" not in inspect(connection).get_table_names()
            before = connection.execute(text("SELECT * FROM ledger_entries ORDER BY id")).all()
        assert len(before) == 3
        engine.dispose()
        upgrade(database_url)
        check(database_url)  # the models and the migrations agree
        with engine.connect() as connection:
            after = connection.execute(text("SELECT * FROM ledger_entries ORDER BY id")).all()
            columns = [c["name"] for c in inspect(connection).get_columns("ledger_entries")]
        assert columns[-2:] == ["run_id", "cap_only"]  # 0014 added the last
        assert [tuple(r)[:-2] for r in after] == [tuple(r) for r in before]
        assert [tuple(r)[-2:] for r in after] == [(None, False)] * 3
        with pytest.raises(DBAPIError, match="append-only"), engine.begin() as connection:
            connection.execute(text("UPDATE ledger_entries SET run_id = NULL"))
    finally:
        engine.dispose()

    context, http = _node(settings)
    try:
        with http:
            ds_h = login(http, "ds@example.org")
            lines = _ok(http.get("/api/v1/ledger/grouped", headers=ds_h))
            assert [(line["kind"], line["run"]) for line in lines] == [("charge", None)] * 3
            run_id = _plan(http, ds_h, 2)["run_id"]
            for _ in range(2):
                _receipt(_step(http, ds_h, frame, run_id))
            lines = _ok(http.get("/api/v1/ledger/grouped", headers=ds_h))
            assert [line["steps"] for line in lines] == [2, 1, 1, 1]
            spent = _ok(http.get("/api/v1/budget", headers=ds_h))["spent_epsilon"]
            assert sum(line["epsilon_used"] for line in lines) == pytest.approx(spent, abs=1e-8)
        with context.sessions() as session:  # the totals trigger still adds each new row
            user = session.query(User).filter_by(email="ds@example.org").one()
            total = session.execute(
                text("SELECT count(*) FROM ledger_entries WHERE user_id = :u"), {"u": user.id}
            ).scalar()
            summed = session.execute(
                text(
                    "SELECT t.rho_units, (SELECT sum(rho_units) FROM ledger_entries "
                    "WHERE user_id = :u) FROM ledger_totals AS t WHERE t.user_id = :u"
                ),
                {"u": user.id},
            ).one()
        assert total == 5 and summed[0] == summed[1]
    finally:
        context.close()

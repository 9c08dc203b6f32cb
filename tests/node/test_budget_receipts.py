"""A receipt states what the release took from the budget, in the user's own terms, and the
budget (``client.budget()``, the ledger) says the same (through the real app).

Reported: a Gaussian publish at epsilon 1e-6, delta 0.009 said "epsilon 1e-06" in its receipt
while the remaining epsilon fell by much more; and "delta: 1e-18 of 1e-06 used" stood next to
a remaining delta of 9.77e-10.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from httpx import Response
from starlette.testclient import TestClient

from dpnode import policies
from dpnode.core.dp.accounting import calibrate_rho
from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services import budget_status, ledger
from dpnode.node.services.budget import DELTA_UNIT, EPSILON_UNIT, RHO_UNIT
from dpnode.sdk._budget import BudgetStatus
from tests.node.conftest import publish, upload_ok
from tests.node.frames import read_frame

#: The default budget's delta, and the share of it the zCDP total is converted at.
DELTA_B = 1e-6
_DEFAULT = policies.Limit.for_policy(policies.Policy(), None, 10**12)
DELTA_Z = float(_DEFAULT.conversion_delta_units * DELTA_UNIT)


def _sum_frame(http: TestClient, owner_h: dict[str, str]) -> bytes:
    body = upload_ok(http, owner_h, "visits", {"x": np.linspace(0, 1, 50)}, bounds={"x": (0, 1)})
    b = GraphBuilder()
    x = b.input(f"dataset:{body['id']}/x", "float64", (50,))
    return encode(b.build([b.op("sum", x)]))


def _receipt(response: Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    manifest, _ = read_frame(response.content)
    receipt: dict[str, Any] = manifest["receipt"]
    return receipt


def _budget(http: TestClient, headers: dict[str, str]) -> dict[str, Any]:
    response = http.get("/api/v1/budget", headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _terms(context: NodeContext, user: User, epsilon: float, delta: float | None) -> dict[str, Any]:
    """``receipt_terms`` for the user's newest ledger row and the budget as it now stands."""
    with context.sessions() as session:
        entry = ledger.ledger_of(session, user.id, limit=1)[0]
        status = budget_status.budget_of(session, context.settings, user.id)
    return budget_status.receipt_terms(entry, status, asked_epsilon=epsilon, asked_delta=delta)


def test_a_gaussian_receipt_says_what_the_budget_lost(
    http: TestClient,
    context: NodeContext,
    scientist: User,
    owner_h: dict[str, str],
    ds_h: dict[str, str],
) -> None:
    frame = _sum_frame(http, owner_h)
    fresh = _budget(http, ds_h)
    assert (fresh["epsilon"], fresh["delta"], fresh["spent_epsilon"]) == (10.0, DELTA_B, 0.0)
    receipt = _receipt(publish(http, ds_h, frame, epsilon=1e-6, delta=0.009))
    after = _budget(http, ds_h)
    # The reported numbers: asked epsilon 1e-6, but the rho this calibrates to, converted at
    # the budget's own delta by the filter, takes 0.0686 of the remaining epsilon.
    rho = calibrate_rho(1e-6, 0.009)
    assert rho <= receipt["rho"] <= rho + 1e-9  # rounded up to the ledger's unit
    fell = fresh["remaining_epsilon"] - after["remaining_epsilon"]
    assert fell == pytest.approx(0.0685869, abs=1e-6)
    assert fell > 60_000 * 1e-6
    # What the receipt must say: the epsilon and delta the budget lost, next to what was asked.
    terms = _terms(context, scientist, 1e-6, 0.009)
    assert terms["asked_epsilon"] == 1e-6 and terms["asked_delta"] == 0.009
    assert terms["epsilon"] == pytest.approx(fell, abs=1e-9)
    assert terms["epsilon"] == terms["spent_epsilon"] == after["spent_epsilon"]
    assert terms["remaining_epsilon"] == after["remaining_epsilon"]
    # A first Gaussian release commits the delta the rho total is converted at, and its
    # sampler's delta; spent and remaining add up to the allocation.
    assert terms["delta"] == after["spent_delta"] == terms["spent_delta"]
    assert terms["delta"] == pytest.approx(DELTA_Z + terms["sampler_delta"], abs=1e-21)
    assert terms["remaining_delta"] == after["remaining_delta"]
    assert after["spent_delta"] + after["remaining_delta"] == pytest.approx(DELTA_B, abs=1e-21)
    assert terms["rho"] == receipt["rho"]
    # The ledger agrees with the receipt, row for row.
    with context.sessions() as session:
        (entry,) = ledger.ledger_of(session, scientist.id)
    assert float(entry.rho_units * RHO_UNIT) == receipt["rho"]
    assert float(entry.epsilon_units * EPSILON_UNIT) == terms["sampler_epsilon"] > 0
    assert float(entry.tv_units * DELTA_UNIT) == terms["sampler_delta"] > 0
    # And client.budget() reads it the same way.
    text = str(BudgetStatus.from_json(after))
    assert text.startswith("epsilon: 0.0685")
    spent, left = after["spent_delta"], after["remaining_delta"]
    assert f"delta: {spent:.3g} of 1e-06 used, {left:.3g} remaining" in text
    # A second Gaussian release: its receipt's epsilon is again what the budget lost.
    _receipt(publish(http, ds_h, frame, epsilon=0.5, delta=1e-7))
    second = _terms(context, scientist, 0.5, 1e-7)
    again = _budget(http, ds_h)
    fell = after["remaining_epsilon"] - again["remaining_epsilon"]
    assert second["epsilon"] == pytest.approx(fell, abs=1e-9)
    assert second["delta"] == second["sampler_delta"]  # the converting share was committed


def test_a_laplace_receipt_and_the_budget_agree_on_delta(
    http: TestClient,
    context: NodeContext,
    scientist: User,
    owner_h: dict[str, str],
    ds_h: dict[str, str],
) -> None:
    frame = _sum_frame(http, owner_h)
    _receipt(publish(http, ds_h, frame, epsilon=0.5))
    terms = _terms(context, scientist, 0.5, None)
    body = _budget(http, ds_h)
    # Pure epsilon is charged as asked; the sampler's delta is spent, the rest remains.
    assert terms["epsilon"] == terms["asked_epsilon"] == 0.5 and terms["asked_delta"] is None
    assert terms["delta"] == terms["sampler_delta"] == body["spent_delta"] == 1e-18
    assert body["remaining_delta"] == pytest.approx(DELTA_B - 1e-18, abs=1e-24)
    assert body["remaining_delta"] > 9.9e-7  # not the direct share alone (9.77e-10)
    text = str(BudgetStatus.from_json(body))
    assert "delta: 1e-18 of 1e-06 used, 1e-06 remaining" in text


def test_the_published_receipt_is_the_budget_s(
    http: TestClient,
    context: NodeContext,
    scientist: User,
    owner_h: dict[str, str],
    ds_h: dict[str, str],
) -> None:
    frame = _sum_frame(http, owner_h)
    receipt = _receipt(publish(http, ds_h, frame, epsilon=1e-6, delta=0.009))
    terms = _terms(context, scientist, 1e-6, 0.009)
    assert {k: receipt[k] for k in terms} == terms


@pytest.mark.parametrize("delta", [None, 1e-7])
def test_the_ledger_row_says_what_the_receipt_says(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str], delta: float | None
) -> None:
    frame = _sum_frame(http, owner_h)
    params: dict[str, Any] = {"epsilon": 0.5} | ({} if delta is None else {"delta": delta})
    receipt = _receipt(publish(http, ds_h, frame, **params))
    response = http.get("/api/v1/ledger", headers=ds_h)
    assert response.status_code == 200, response.text
    (row,) = [r for r in response.json() if r["id"] == receipt["ledger_id"]]
    assert row["sampler_tv"] == receipt["sampler_delta"] > 0
    assert row["rho"] == receipt["rho"]

"""The budget check cannot be raced: concurrent charges never overspend, on either database."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError

from dpnode.core.errors import BudgetExceededError, InvalidRequestError
from dpnode.node.context import NodeContext
from dpnode.node.db.models import LedgerEntry, User
from dpnode.node.services import budget
from dpnode.node.services.budget import EPSILON_UNIT, Cost, quantize_epsilon, units_down
from tests.conftest import REPO_ROOT


def _cost(epsilon: float) -> Cost:
    return Cost("laplace", epsilon_units=units_down(epsilon, EPSILON_UNIT, "epsilon"))


def _try_charge(context: NodeContext, user_id: int, epsilon: float) -> bool:
    try:
        budget.charge(context.serial_sessions, context.settings, user_id, _cost(epsilon))
    except BudgetExceededError:
        return False
    return True


def _spent(context: NodeContext, user_id: int) -> int:
    with context.sessions() as session:
        total = session.scalar(
            select(func.coalesce(func.sum(LedgerEntry.epsilon_units), 0)).where(
                LedgerEntry.user_id == user_id
            )
        )
    return int(total or 0)


@pytest.fixture
def tight(context: NodeContext) -> NodeContext:
    context.settings = context.settings.model_copy(update={"default_epsilon_budget": 1.0})
    return context


def test_ten_tenths_fit_exactly_and_the_eleventh_is_refused(
    tight: NodeContext, scientist: User
) -> None:
    for _ in range(10):
        assert _try_charge(tight, scientist.id, 0.1)
    with pytest.raises(BudgetExceededError) as refused:
        budget.charge(tight.serial_sessions, tight.settings, scientist.id, _cost(0.1))
    assert str(refused.value) == (
        "this publish costs epsilon 0.1 and does not fit your epsilon budget of 1 in total; "
        "remaining budget: epsilon 0, direct delta 9.76562e-10 "
        "[policy 'default' (the built-in default), rule defaults.epsilon]"
    )
    assert refused.value.rule == "defaults.epsilon" and refused.value.policy_revision is None
    assert _spent(tight, scientist.id) == 10**9


def test_fifty_concurrent_charges_against_ten(tight: NodeContext, scientist: User) -> None:
    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(lambda _: _try_charge(tight, scientist.id, 0.1), range(50)))
    assert results.count(True) == 10
    assert _spent(tight, scientist.id) == 10**9


def test_concurrent_processes_never_overspend(
    tight: NodeContext, scientist: User, database_url: str
) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from dpnode.node.context import NodeContext
        from dpnode.core.errors import BudgetExceededError
        from dpnode.node.services import budget
        from dpnode.node.settings import Settings
        settings = Settings(data_dir=sys.argv[1], database_url=sys.argv[2],
                            default_epsilon_budget=1.0)
        context = NodeContext.from_settings(settings)
        wins = 0
        for _ in range(10):
            try:
                budget.charge(context.serial_sessions, settings, {scientist.id},
                              budget.Cost("laplace", epsilon_units=10**8))
                wins += 1
            except BudgetExceededError:
                pass
        print(wins)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(tight.settings.data_dir), database_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        for _ in range(5)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outputs]
    assert sum(int(out) for out, _ in outputs) == 10
    assert _spent(tight, scientist.id) == 10**9


def test_users_have_separate_budgets(tight: NodeContext, scientist: User, owner: User) -> None:
    assert _try_charge(tight, scientist.id, 1.0)
    assert not _try_charge(tight, scientist.id, 1e-9)
    assert _try_charge(tight, owner.id, 1.0)


def test_the_ledger_is_append_only(context: NodeContext, scientist: User) -> None:
    entry, _ = budget.charge(context.serial_sessions, context.settings, scientist.id, _cost(0.5))
    for statement in (
        f"UPDATE ledger_entries SET epsilon_units = 0 WHERE id = {entry.id}",
        f"DELETE FROM ledger_entries WHERE id = {entry.id}",
    ):
        with context.engine.connect() as conn, pytest.raises(DBAPIError, match="append-only"):
            conn.execute(text(statement))
    assert _spent(context, scientist.id) == 5 * 10**8


@pytest.mark.parametrize("bad", [float("nan"), -0.1, float("inf"), 1e-10, "0.1", True])
def test_invalid_epsilons_are_refused(bad: object) -> None:
    with pytest.raises(InvalidRequestError, match="epsilon must be"):
        quantize_epsilon(bad)  # type: ignore[arg-type]


@given(st.floats(min_value=1e-9, max_value=1e6, allow_nan=False))
def test_quantized_epsilon_never_exceeds_the_request(epsilon: float) -> None:
    q = quantize_epsilon(epsilon)
    intended = Fraction(Decimal(repr(epsilon)))
    assert q <= intended and intended - q < EPSILON_UNIT


@hyp_settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.integers(min_value=1, max_value=6 * 10**8), min_size=1, max_size=12))
def test_sequential_charges_grant_exactly_what_fits(
    context: NodeContext, scientist: User, amounts: list[int]
) -> None:
    # One database for all examples: measure from the ledger as it stands.
    start = _spent(context, scientist.id)
    allowance = units_down(context.settings.default_epsilon_budget, EPSILON_UNIT, "budget")
    expected = start
    for units in amounts:
        fits = expected + units <= allowance
        try:
            budget.charge(
                context.serial_sessions,
                context.settings,
                scientist.id,
                Cost("laplace", epsilon_units=units),
            )
            granted = True
        except BudgetExceededError:
            granted = False
        assert granted == fits
        expected += units if granted else 0
    assert _spent(context, scientist.id) == expected <= allowance

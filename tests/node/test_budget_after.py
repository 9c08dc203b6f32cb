"""The budget a charge returns (derived from the sums its decision read, plus the new row)
equals the budget read back from the ledger at the same instant, under every kind of policy."""

from __future__ import annotations

import numpy as np
import pytest

from dpnode import policies
from dpnode.core.errors import PolicyRefusedError
from dpnode.node.context import NodeContext
from dpnode.node.db.models import BudgetGrant, User
from dpnode.node.services import budget, budget_status, datasets, ledger_sums
from dpnode.node.services import policy as policy_service
from dpnode.node.services.budget import Cost
from dpnode.node.services.datasets import DatasetUpload
from dpnode.node.services.tabular import ColumnSpec

TENTH = 10**8  # epsilon 0.1 in ledger units
POLICIES = {
    "default": None,
    "renewal": '[renewal]\nevery = "1h"\nanchor = 2026-01-01T00:00:00Z\n',
    # The fourth charge reaches the rate limit: from then on rows are passed one by one.
    "rate limit": '[rate_limit]\nmax_publishes = 4\nwindow = "1h"\n',
    # A cap above the user's allocation converts the samplers' deviation at its epsilon.
    "generous cap": "[datasets.visits]\nmax_epsilon = 40.0\n",
    "zcdp": "zcdp_delta_share = 0.5\n[roles.data_scientist]\nepsilon = 5.0\ndelta = 1e-5\n",
}


def _dataset(context: NodeContext, owner: User, name: str) -> int:
    spec = ColumnSpec(bounds={"x": (0, 1)}, categories={})
    upload = DatasetUpload(name, "", [], spec, ["x"], {"x": np.zeros(10)})
    with context.sessions() as session:
        return datasets.create_dataset(session, context.store, owner, upload, max_elements=100).id


@pytest.mark.parametrize("toml", POLICIES.values(), ids=POLICIES.keys())
def test_the_budget_after_a_charge_is_the_ledger_s(
    context: NodeContext, owner: User, scientist: User, toml: str | None
) -> None:
    visits = _dataset(context, owner, "visits")
    with context.sessions() as session:
        if toml is not None:
            policy_service.apply(session, None, policies.load_policy(toml), reason="test")
        grant = BudgetGrant(user_id=scientist.id, epsilon_units=TENTH, granted_by="admin@x")
        session.add(grant)
        session.commit()
    costs = [
        Cost("laplace", TENTH, tv_units=7 * 10**11, dataset_ids=[visits]),
        Cost("gaussian", rho_units=3 * 10**6, tv_units=10**12, asked_epsilon_units=TENTH),
        Cost("laplace", 2 * TENTH),
    ]
    for step in range(7):
        try:
            entry, after = budget.charge(
                context.serial_sessions, context.settings, scientist.id, costs[step % 3]
            )
        except PolicyRefusedError:  # the rate limit: nothing was charged
            continue
        with context.sessions() as session:
            user = session.get(User, scientist.id)
            assert user is not None
            in_force = policy_service.current(session)
            puser = ledger_sums.policy_user(session, user)
            read = budget_status._status(session, context.settings, in_force, puser, entry.at)
        assert after == read
        assert after.spent() == read.spent()

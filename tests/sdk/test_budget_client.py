from __future__ import annotations

import pytest

from dpnode import sdk
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services import budget
from dpnode.node.services.budget import Cost
from tests.sdk.conftest import remote_dataset


def test_budget_and_ledger_as_the_ledger_stands(
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    owner_client: sdk.Client,
    context: NodeContext,
    scientist: User,
) -> None:
    fresh = ds_client.budget()
    assert (fresh.epsilon, fresh.spent_epsilon, fresh.remaining_epsilon) == (10.0, 0.0, 10.0)
    assert fresh.delta == 1e-6 and fresh.spent_delta == 0.0 and ds_client.ledger() == []
    read = remote_dataset(owner_client, ds_client).id  # a charge reads datasets that exist
    for units in (10**8, 25 * 10**7):
        budget.charge(
            context.serial_sessions,
            context.settings,
            scientist.id,
            Cost("laplace", epsilon_units=units, dataset_ids=[read], graph_hash="ab" * 32),
        )
    status = ds_client.budget()
    assert status.spent_epsilon == 0.35 and status.remaining_epsilon == 9.65
    assert str(status).startswith("epsilon: 0.35 of 10 spent, 9.65 remaining")
    ledger = ds_client.ledger()
    assert [e.epsilon for e in ledger] == [0.25, 0.1]
    assert ledger[0].mechanism == "laplace" and ledger[0].dataset_ids == (read,)
    assert admin_client.budget(user_id=scientist.id) == status
    assert [e.id for e in admin_client.ledger(user_id=scientist.id)] == [e.id for e in ledger]
    with pytest.raises(sdk.PermissionDeniedError, match="only admins"):
        ds_client.ledger(user_id=scientist.id + 1000)

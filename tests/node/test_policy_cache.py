"""The publish transaction keeps parsed policies by revision: a change still decides the very
next charge, whoever applied it and however the cache was warmed."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import insert

from dpnode import policies
from dpnode.core.errors import BudgetExceededError, PolicyRefusedError
from dpnode.node.context import NodeContext
from dpnode.node.db.migrate import upgrade
from dpnode.node.db.models import PolicyRevision, User
from dpnode.node.services import budget
from dpnode.node.services import policy as policy_service
from dpnode.node.services.budget import Cost
from tests.conftest import make_user

TENTH = 10**8  # epsilon 0.1 in ledger units
LOOSE = policies.load_policy('name = "loose"\n[roles.data_scientist]\nepsilon = 5.0\n')
SMALL_CAP = policies.load_policy('name = "capped"\n[publish]\nmax_epsilon = 0.05\n')
TINY = policies.load_policy('name = "tiny"\n[roles.data_scientist]\nepsilon = 0.15\n')


def _charge(context: NodeContext, user: User) -> int | None:
    """Charge epsilon 0.1 and return the revision that allowed it."""
    entry, after = budget.charge(
        context.serial_sessions, context.settings, user.id, Cost("laplace", TENTH)
    )
    assert after.in_force.revision == entry.policy_revision
    return entry.policy_revision


def _apply(context: NodeContext, policy: policies.Policy) -> int:
    with context.sessions() as session:
        return policy_service.apply(session, None, policy, reason="test").revision.id


def test_a_policy_change_decides_the_very_next_charge(
    context: NodeContext, scientist: User
) -> None:
    assert _charge(context, scientist) is None  # the built-in default
    loose = _apply(context, LOOSE)
    assert _charge(context, scientist) == loose
    assert _charge(context, scientist) == loose  # the parsed revision, from the cache
    capped = _apply(context, SMALL_CAP)
    with pytest.raises(PolicyRefusedError) as refused:
        _charge(context, scientist)
    assert refused.value.policy_revision == capped
    assert refused.value.rule == "publish.max_epsilon"
    # The same content as an earlier revision is a new revision: it is the one in force.
    again = _apply(context, LOOSE)
    assert again > capped
    assert _charge(context, scientist) == again
    tiny = _apply(context, TINY)  # 0.4 spent of 0.15: refused by the budget rule
    with pytest.raises(BudgetExceededError) as exceeded:
        _charge(context, scientist)
    assert (exceeded.value.policy_revision, exceeded.value.rule) == (
        tiny,
        "roles.data_scientist.epsilon",
    )


def test_a_revision_written_by_another_connection_decides_the_next_charge(
    context: NodeContext, scientist: User
) -> None:
    """Another node process sharing the database appends the revision: nothing in this
    process is told, and the next charge still reads it."""
    _apply(context, LOOSE)
    assert _charge(context, scientist) is not None
    with context.engine.begin() as connection:
        row = {
            "created_by": "another process",
            "reason": "test",
            "name": SMALL_CAP.name,
            "content_hash": SMALL_CAP.content_hash(),
            "document": SMALL_CAP.to_dict(),
            "source": "",
        }
        connection.execute(insert(PolicyRevision), row)
    with pytest.raises(PolicyRefusedError) as refused:
        _charge(context, scientist)
    assert refused.value.rule == "publish.max_epsilon"


def test_two_databases_with_a_revision_1_each_are_decided_by_their_own(
    context: NodeContext, scientist: User, tmp_path: Path
) -> None:
    """Revision ids repeat across databases (two nodes in one process, as in these tests):
    the parsed policy is kept by id and content, so neither decides for the other."""
    other_settings = context.settings.model_copy(
        update={"data_dir": tmp_path / "other", "database_url": ""}
    )
    other_settings.data_dir.mkdir()
    upgrade(other_settings.resolved_database_url)
    other = NodeContext.from_settings(other_settings)
    try:
        someone = make_user(other, "ds@example.org", "data_scientist")
        assert _apply(context, LOOSE) == _apply(other, SMALL_CAP)
        for _ in range(2):  # the second time from the cache
            assert _charge(context, scientist) is not None
            with pytest.raises(PolicyRefusedError):
                _charge(other, someone)
    finally:
        other.close()

"""Random policies and random sequences of charges through the node's real publish
transaction: whatever is granted, the ledger never passes a cap, and nothing above the
approval threshold is charged without an admin's approval."""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from sqlalchemy import select

from dpnode import policies
from dpnode.core.errors import ApprovalRequiredError, PolicyRefusedError
from dpnode.node.context import NodeContext
from dpnode.node.db.models import LedgerEntry, PublishApproval, RequestStatus, User
from dpnode.node.services import approvals, budget, datasets
from dpnode.node.services import policy as policy_service
from dpnode.node.services.budget import Cost
from dpnode.node.services.datasets import DatasetUpload
from dpnode.node.services.tabular import ColumnSpec
from tests.conftest import make_user

_runs = itertools.count()
UNIT = 10**8  # amounts are drawn in tenths of epsilon

amounts = st.integers(min_value=1, max_value=12)  # tenths
policies_ = st.fixed_dictionaries(
    {
        "role": st.one_of(st.none(), amounts),
        "per_publish": st.one_of(st.none(), amounts),
        "cap": st.one_of(st.none(), st.integers(min_value=0, max_value=20)),
        "gate": st.one_of(st.none(), amounts),
        "rate": st.one_of(st.none(), st.integers(min_value=0, max_value=6)),
    }
)
# (which user, tenths asked, reads the capped dataset, approve if it waits)
steps = st.lists(st.tuples(st.integers(0, 1), amounts, st.booleans(), st.booleans()), max_size=14)


def _toml(p: dict[str, int | None], capped: str) -> str:
    lines = []
    if p["role"] is not None:
        lines += ["[roles.data_scientist]", f"epsilon = {p['role'] / 10}"]
    if p["per_publish"] is not None:
        lines += ["[publish]", f"max_epsilon = {p['per_publish'] / 10}"]
    if p["gate"] is not None:
        lines += ["[approval]", f"epsilon_above = {p['gate'] / 10}"]
    if p["rate"] is not None:
        lines += ["[rate_limit]", f"max_publishes = {p['rate']}", 'window = "1h"']
    if p["cap"] is not None:
        lines += [f"[datasets.{capped}]", f"max_epsilon = {p['cap'] / 10}"]
    return "\n".join(lines)


@hyp_settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(policies_, steps)
def test_no_sequence_of_charges_passes_a_cap_or_skips_an_approval(
    context: NodeContext,
    admin: User,
    owner: User,
    p: dict[str, int | None],
    plan: list[tuple[int, int, bool, bool]],
) -> None:
    # One database for all examples: fresh users and dataset names for each.
    run = next(_runs)
    users = [make_user(context, f"u{run}-{i}@example.org", "data_scientist") for i in (0, 1)]
    capped = f"capped{run}"
    spec = ColumnSpec(bounds={"x": (0, 1)}, categories={})
    with context.sessions() as session:
        upload = DatasetUpload(capped, "", [], spec, ["x"], {"x": np.zeros(4)})
        dataset_id = datasets.create_dataset(
            session, context.store, owner, upload, max_elements=9
        ).id
        policy_service.apply(session, admin, policies.load_policy(_toml(p, capped)), reason="p")
    for n, (who, tenths, reads, approve) in enumerate(plan):
        cost = Cost(
            "laplace",
            tenths * UNIT,
            dataset_ids=[dataset_id] if reads else [],
            frame_hash=f"{run}-{n}",
        )
        user_id = users[who].id
        try:
            budget.charge(context.serial_sessions, context.settings, user_id, cost)
        except ApprovalRequiredError as waiting:
            with context.sessions() as session:
                approvals.answer(
                    session,
                    context.settings,
                    admin,
                    waiting.more["approval_id"],
                    approve=approve,
                    reason="r",
                )
            with contextlib.suppress(PolicyRefusedError):
                budget.charge(context.serial_sessions, context.settings, user_id, cost)
        except PolicyRefusedError:
            pass
    with context.sessions() as session:
        ids = [u.id for u in users]
        rows = list(session.scalars(select(LedgerEntry).where(LedgerEntry.user_id.in_(ids))))
        used = {
            a.ledger_id
            for a in session.scalars(
                select(PublishApproval).where(
                    PublishApproval.user_id.in_(ids),
                    PublishApproval.status == RequestStatus.USED,
                    PublishApproval.decided_by == admin.email,
                )
            )
        }
    allocation = (10 if p["role"] is None else p["role"] / 10) * 10**9
    for user_id in ids:
        assert sum(e.epsilon_units for e in rows if e.user_id == user_id) <= allocation
        if p["rate"] is not None:
            assert sum(1 for e in rows if e.user_id == user_id) <= p["rate"]
    if p["cap"] is not None:
        on_capped = sum(e.epsilon_units for e in rows if dataset_id in e.dataset_ids)
        assert on_capped <= p["cap"] * UNIT
    for e in rows:
        if p["per_publish"] is not None:
            assert e.epsilon_units <= p["per_publish"] * UNIT
        if p["gate"] is not None and e.epsilon_units > p["gate"] * UNIT:
            assert e.id in used  # ran only with an approval, which it used up

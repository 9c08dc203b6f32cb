"""Policies under concurrency: a dataset's cap holds across users racing for it, and an
approval lets exactly one publish through, on SQLite and on PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from sqlalchemy import func, select

from dpnode import policies
from dpnode.core.errors import ApprovalRequiredError, BudgetExceededError, NotFoundError
from dpnode.node.context import NodeContext
from dpnode.node.db.models import LedgerEntry, User
from dpnode.node.services import approvals, budget, datasets
from dpnode.node.services import policy as policy_service
from dpnode.node.services.budget import Cost
from dpnode.node.services.datasets import DatasetUpload
from dpnode.node.services.tabular import ColumnSpec
from tests.conftest import REPO_ROOT, make_user

TENTH = 10**8  # epsilon 0.1 in ledger units


def _dataset(context: NodeContext, owner: User, name: str) -> int:
    spec = ColumnSpec(bounds={"x": (0, 1)}, categories={})
    upload = DatasetUpload(name, "", [], spec, ["x"], {"x": np.zeros(10)})
    with context.sessions() as session:
        return datasets.create_dataset(session, context.store, owner, upload, max_elements=100).id


def _apply(context: NodeContext, toml: str) -> None:
    with context.sessions() as session:
        policy_service.apply(session, None, policies.load_policy(toml), reason="test")


def _try(context: NodeContext, user_id: int, cost: Cost) -> bool:
    try:
        budget.charge(context.serial_sessions, context.settings, user_id, cost)
    except BudgetExceededError:
        return False
    return True


def _spent_on(context: NodeContext, dataset_id: int) -> int:
    with context.sessions() as session:
        rows = session.scalars(select(LedgerEntry))
        return sum(e.epsilon_units for e in rows if dataset_id in e.dataset_ids)


def test_users_racing_for_a_dataset_cap_never_pass_it(
    context: NodeContext, owner: User, scientist: User
) -> None:
    other = make_user(context, "ds2@example.org", "data_scientist")
    capped = _dataset(context, owner, "capped")
    free = _dataset(context, owner, "free")
    _apply(context, "[datasets.capped]\nmax_epsilon = 1.0\n")
    # Each user's own budget (10) is far from the cap: only the cap can stop them, and only
    # if the two users' transactions cannot both read the dataset's old total.
    both = [capped, free]
    jobs = [(u.id, both if i % 3 == 0 else [capped]) for i in range(20) for u in (scientist, other)]
    with ThreadPoolExecutor(max_workers=16) as pool:
        wins = list(
            pool.map(
                lambda job: _try(context, job[0], Cost("laplace", TENTH, dataset_ids=job[1])),
                jobs,
            )
        )
    assert wins.count(True) == 10
    assert _spent_on(context, capped) == 10 * TENTH
    winners = {user_id for (user_id, _), won in zip(jobs, wins, strict=True) if won}
    assert winners <= {scientist.id, other.id}
    # The uncapped dataset and the users' own budgets are untouched by the refusals.
    assert _try(context, scientist.id, Cost("laplace", TENTH, dataset_ids=[free]))


def test_processes_racing_for_a_dataset_cap_never_pass_it(
    context: NodeContext, owner: User, scientist: User, database_url: str
) -> None:
    users = [
        scientist,
        *(make_user(context, f"p{i}@example.org", "data_scientist") for i in range(3)),
    ]
    capped = _dataset(context, owner, "capped")
    _apply(context, "[datasets.capped]\nmax_epsilon = 1.0\n")
    script = textwrap.dedent(
        f"""
        import sys
        from dpnode.node.context import NodeContext
        from dpnode.core.errors import BudgetExceededError
        from dpnode.node.services import budget
        from dpnode.node.settings import Settings
        settings = Settings(data_dir=sys.argv[1], database_url=sys.argv[2])
        context = NodeContext.from_settings(settings)
        wins = 0
        for _ in range(8):
            try:
                budget.charge(context.serial_sessions, settings, int(sys.argv[3]),
                              budget.Cost("laplace", {TENTH}, dataset_ids=[{capped}]))
                wins += 1
            except BudgetExceededError:
                pass
        print(wins)
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(context.settings.data_dir), database_url, str(u.id)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
        )
        for u in users
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outputs]
    assert sum(int(out) for out, _ in outputs) == 10
    assert _spent_on(context, capped) == 10 * TENTH


def test_an_approval_lets_exactly_one_of_concurrent_publishes_through(
    context: NodeContext, admin: User, scientist: User
) -> None:
    _apply(context, "[approval]\nepsilon_above = 0.5\n")
    cost = Cost("laplace", 8 * TENTH, frame_hash="f" * 64)
    with pytest.raises(ApprovalRequiredError) as waiting:
        budget.charge(context.serial_sessions, context.settings, scientist.id, cost)
    approval_id = waiting.value.more["approval_id"]
    with context.sessions() as session:
        approvals.answer(session, context.settings, admin, approval_id, approve=True, reason="ok")

    def attempt(_: int) -> str:
        try:
            budget.charge(context.serial_sessions, context.settings, scientist.id, cost)
        except ApprovalRequiredError:
            return "waits"
        return "ran"

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(attempt, range(8)))
    assert sorted(results) == ["ran"] + ["waits"] * 7
    with context.sessions() as session:
        count = session.scalar(select(func.count()).select_from(LedgerEntry))
        pending = approvals.list_approvals(session, admin, status="pending")
    assert count == 1
    assert len(pending) == 1  # the seven later attempts share one new request


def test_a_dataset_deleted_during_a_publish_under_a_cap_releases_nothing(
    context: NodeContext, owner: User, scientist: User
) -> None:
    gone = _dataset(context, owner, "gone")
    _apply(context, "[datasets.gone]\nmax_epsilon = 1.0\n")
    with context.sessions() as session:
        datasets.delete_dataset(session, context.store, owner, gone)
    with pytest.raises(NotFoundError, match="deleted while this publish ran"):
        budget.charge(
            context.serial_sessions,
            context.settings,
            scientist.id,
            Cost("laplace", TENTH, dataset_ids=[gone]),
        )
    with context.sessions() as session:
        assert session.scalar(select(func.count()).select_from(LedgerEntry)) == 0

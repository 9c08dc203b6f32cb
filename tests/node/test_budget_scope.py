"""The publish transaction loads the ledger as a few sums, not row by row: every decision on
those sums must be the one the pure core makes on the whole ledger."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from dpnode import policies
from dpnode.node.context import NodeContext
from dpnode.node.db.models import LedgerEntry, LedgerEntryDataset, User
from dpnode.node.services.ledger_sums import _charges
from tests.conftest import make_user

LOOSE = policies.load_policy(
    """
[renewal]
every = "1h"
anchor = 2026-01-01T00:00:00Z
[roles.data_scientist]
epsilon = 3.0
[rate_limit]
max_publishes = 6
window = "25m"
[datasets.a]
max_epsilon = 4.0
[datasets.a.renewal]
every = "2h"
anchor = 2026-01-01T00:00:00Z
[datasets.b]
max_epsilon = 7.0
"""
)
# The rate window straddles renewals, users reach the limit, and a zero limit.
STRICT = LOOSE.model_copy(update={"rate_limit": policies.RateLimit(max_publishes=2, window="90m")})
CLOSED = STRICT.model_copy(update={"rate_limit": policies.RateLimit(max_publishes=0, window="1h")})
DEFAULTS = policies.Allowance.of(10.0, 1e-6)
_runs = itertools.count()


@pytest.mark.parametrize("policy", [LOOSE, STRICT, CLOSED], ids=["loose", "strict", "closed"])
@pytest.mark.parametrize("seed", range(4))
def test_decisions_on_the_sums_equal_decisions_on_the_whole_ledger(
    context: NodeContext, seed: int, policy: policies.Policy
) -> None:
    rng = np.random.default_rng(seed)
    run = next(_runs)
    users = [make_user(context, f"s{run}-{i}@example.org", "data_scientist") for i in range(3)]
    ids = {"a": 1000 + 2 * run, "b": 1001 + 2 * run}
    now = datetime(2026, 3, 1, 10, 17, tzinfo=UTC)
    assert policy.rate_limit is not None
    window = policies.parse_period(policy.rate_limit.window)
    full: list[policies.Charge] = []
    with context.sessions() as session:
        for _ in range(40):
            user: User = users[int(rng.integers(3))]
            # some rows dated ahead (a worker's clock ahead), some beyond the next windows
            at = now - timedelta(minutes=float(rng.uniform(-150, 300)))
            chosen = [ids[n] for n in ("a", "b") if rng.random() < 0.5]
            eps = int(rng.integers(0, 4)) * 10**8
            rho = int(rng.integers(0, 2)) * 10**6
            delta = int(rng.integers(0, 3)) * 10**3  # the samplers' delta, in delta units
            entry = LedgerEntry(
                at=at,
                user_id=user.id,
                mechanism="laplace",
                epsilon_units=eps,
                rho_units=rho,
                tv_units=delta,
                dataset_ids=sorted(chosen),
            )
            session.add(entry)
            session.flush()
            session.add_all(LedgerEntryDataset(ledger_id=entry.id, dataset_id=d) for d in chosen)
            full.append(policies.Charge(at, user.id, tuple(sorted(chosen)), eps, delta, rho))
        session.commit()
        for user in users:
            puser = policies.User(user.id, user.email, "data_scientist")
            for tenths in (1, 3, 6, 12, 25):
                request = policies.PublishRequest(
                    at=now, datasets=ids, epsilon_units=tenths * 10**8
                )
                sums = _charges(session, policy, request, puser)
                recent = [c for c in full if c.user_id == user.id and c.at > now - window]
                assert len(sums) <= len(recent) + 3  # the rate window's rows, three sums
                on_sums = policies.decide(policy, puser, request, sums, defaults=DEFAULTS)
                whole = policies.decide(policy, puser, request, full, defaults=DEFAULTS)
                assert on_sums == whole


def test_a_charge_dated_ahead_does_not_hide_the_windows_spending(context: NodeContext) -> None:
    # The user's rows of the window were summed and dated by the newest: one stamped in the
    # next window by a clock ahead took the whole sum out of this one, and with it the budget.
    user = make_user(context, "ahead@example.org", "data_scientist")
    puser = policies.User(user.id, user.email, "data_scientist")
    now = datetime(2026, 3, 1, 10, 17, tzinfo=UTC)
    with context.sessions() as session:
        for at in (now - timedelta(minutes=5), now + timedelta(minutes=50)):
            session.add(
                LedgerEntry(at=at, user_id=user.id, mechanism="laplace", epsilon_units=15 * 10**8)
            )
        session.commit()
        policy = LOOSE.model_copy(update={"rate_limit": None})
        request = policies.PublishRequest(at=now, datasets={}, epsilon_units=10**8)
        decision = policies.decide(
            policy, puser, request, _charges(session, policy, request, puser), defaults=DEFAULTS
        )
        assert decision.outcome == "refuse", decision
        assert decision.rule == "roles.data_scientist.epsilon"

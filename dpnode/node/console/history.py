"""A user's budget as a page shows it: the API's numbers, their ledger and a chart of both."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from markupsafe import Markup
from sqlalchemy.orm import Session

from dpnode import policies
from dpnode.node.api.routes import budget as budget_routes
from dpnode.node.api.schemas import BudgetPublic, LedgerLinePublic
from dpnode.node.console.charts import Step, budget_chart
from dpnode.node.db.models import User
from dpnode.node.services import budget_status, ledger, users
from dpnode.node.services.costs import EPSILON_UNIT
from dpnode.node.settings import Settings

#: The chart plots at most this many charges of the current window (the newest).
CHART_CHARGES = 1000


@dataclass(frozen=True)
class BudgetView:
    subject: User
    budget: BudgetPublic
    #: The current window's charges, newest first, a training run's steps on one line (as
    #: ``GET /api/v1/ledger/grouped`` lists them).
    lines: list[LedgerLinePublic]
    chart: Markup


def budget_view(session: Session, settings: Settings, viewer: User, user_id: int) -> BudgetView:
    """``user_id``'s budget as ``viewer`` may read it through the API (refused otherwise)."""
    public = budget_routes.get_budget(session, settings, viewer, user_id=user_id)
    lines = budget_routes.get_ledger_grouped(
        session, settings, viewer, user_id=user_id, since=public.period_start, limit=CHART_CHARGES
    )
    subject = users.get_user(session, user_id)
    # The epsilon used after each charge, counted as the budget counts it (pure epsilon plus
    # any zCDP converted), from the same rows the table lists.
    status = budget_status.budget_of(session, settings, user_id)
    rows = ledger.ledger_of(session, user_id, since=status.status.period_start, limit=CHART_CHARGES)
    steps, epsilon_units, rho_units = [], 0, 0
    for row in reversed(rows):
        if row.cap_only:  # paid from a dataset's cap: not the user's spending
            continue
        epsilon_units += row.epsilon_units
        rho_units += row.rho_units
        used, _ = status.used_units(policies.Spent(epsilon_units, 0, rho_units))
        steps.append(Step(row.at, float("inf") if used is None else float(used * EPSILON_UNIT)))
    now = datetime.now(UTC)
    start = public.period_start or subject.created_at
    end = max(public.renews_at or now, now)
    chart = budget_chart(
        steps,
        allocation=public.epsilon,
        start=min(start, now),
        end=end,
        renews_at=public.renews_at,
        title=f"Epsilon used by {subject.email} against an allocation of {public.epsilon:.4g}",
    )
    return BudgetView(subject=subject, budget=public, lines=lines, chart=chart)

"""Admin pages about budgets: every account's, one account's (with its chart), and grants.

As the other admin pages, each takes :data:`~dpnode.node.console.session.ConsoleAdmin` and calls
the API's route functions.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from dpnode.node.api.deps import PathId, SessionDep, SettingsDep
from dpnode.node.api.routes import budget as budget_routes
from dpnode.node.api.routes import users as user_routes
from dpnode.node.api.schemas import BudgetGrantCreate
from dpnode.node.console.forms import FormError, amount, form_error, notice
from dpnode.node.console.history import budget_view
from dpnode.node.console.render import PREFIX, REFUSALS, ConsoleRoute, page, redirect
from dpnode.node.console.session import ConsoleAdmin, Form
from dpnode.node.db.models import User
from dpnode.node.settings import Settings

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


@router.get("/budgets")
def budgets(
    request: Request, session: SessionDep, settings: SettingsDep, admin: ConsoleAdmin
) -> Response:
    rows = [
        (u, budget_routes.get_budget(session, settings, admin, user_id=u.id))
        for u in user_routes.list_users(session, admin)
    ]
    return page(request, "budgets.html", title="Budgets", rows=rows)


def _user_budget_page(
    request: Request,
    session: Session,
    settings: Settings,
    admin: User,
    user_id: int,
    *,
    notice: str = "",
    error: FormError | None = None,
    status: int = 200,
) -> Response:
    view = budget_view(session, settings, admin, user_id)
    requests = budget_routes.list_budget_requests(session, admin, user_id=user_id, limit=50)
    grants = budget_routes.list_grants(session, admin, user_id=user_id, limit=50)
    return page(
        request,
        "budget.html",
        status,
        title=f"Budget of {view.subject.email}",
        view=view,
        requests=requests,
        grants=grants,
        approvals=None,
        notice=notice,
        error=error,
    )


@router.get("/budgets/{user_id}")
def user_budget(
    request: Request,
    user_id: PathId,
    session: SessionDep,
    settings: SettingsDep,
    admin: ConsoleAdmin,
    done: str | None = None,
) -> Response:
    return _user_budget_page(request, session, settings, admin, user_id, notice=notice(done))


@router.post("/budgets/{user_id}/grants")
def grant(
    request: Request,
    user_id: PathId,
    session: SessionDep,
    settings: SettingsDep,
    admin: ConsoleAdmin,
    form: Form,
) -> Response:
    """Add budget to the account's allocation, as ``POST /api/v1/budget/grants`` does."""
    try:
        epsilon, delta = amount(form, "epsilon"), amount(form, "delta")
        body = BudgetGrantCreate(
            user=user_id,
            epsilon=0.0 if epsilon is None else epsilon,
            delta=0.0 if delta is None else delta,
            reason=form.get("reason", ""),
        )
        budget_routes.create_grant(session, admin, body)
    except REFUSALS as exc:
        session.rollback()
        status, error = form_error(exc, "grant", form, ["epsilon", "delta", "reason"])
        return _user_budget_page(
            request, session, settings, admin, user_id, error=error, status=status
        )
    return redirect(f"{PREFIX}/budgets/{user_id}?done=granted")

"""Pages for every signed-in user: sign in and out, your budget, your ledger, the catalog.

Each page calls the API's route functions with the signed-in user, so it shows (and refuses)
exactly what the API would for that user's token.
"""

from __future__ import annotations

import hmac
from datetime import UTC, datetime, time, timedelta

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from dpnode.core.errors import AuthenticationError, InvalidRequestError, RateLimitedError
from dpnode.node.api.deps import (
    ClientAddress,
    HasherDep,
    Limit,
    LoginThrottleDep,
    SessionDep,
    SettingsDep,
)
from dpnode.node.api.routes import approvals as approval_routes
from dpnode.node.api.routes import budget as budget_routes
from dpnode.node.api.routes import datasets as dataset_routes
from dpnode.node.api.routes import search as search_routes
from dpnode.node.api.routes import users as user_routes
from dpnode.node.console import admin
from dpnode.node.console.history import budget_view
from dpnode.node.console.render import HERE, PREFIX, ConsoleRoute, optional_int, page, redirect
from dpnode.node.console.session import (
    COOKIE,
    CSRF_FIELD,
    LOGIN_COOKIE,
    ConsoleUser,
    Form,
    clear_cookie,
    new_login_token,
    read_form,
    session_cookie,
    set_cookie,
)
from dpnode.node.db.models import Role
from dpnode.node.services import dataset_budgets, users
from dpnode.node.services.security import issue_token

router = APIRouter(prefix=PREFIX, route_class=ConsoleRoute, include_in_schema=False)
router.include_router(admin.router)
#: The node's own address, outside the console's prefix.
front = APIRouter(route_class=ConsoleRoute, include_in_schema=False)

_CSS = (HERE / "static" / "console.css").read_bytes()
_WHY = {
    "signin": "Sign in to use the console.",
    "expired": "Your session has ended; sign in again.",
}


@router.get("/static/console.css")
async def stylesheet() -> Response:
    return Response(_CSS, media_type="text/css", headers={"Cache-Control": "max-age=3600"})


def _next(target: str | None) -> str:
    """Where to go after signing in: a console path, never another site.

    >>> _next("/console/ledger"), _next("//evil.example/console"), _next(None)
    ('/console/ledger', '/console/', '/console/')
    """
    if target and target.startswith(PREFIX + "/") and not target.startswith("//"):
        return target
    return PREFIX + "/"


def _login_page(
    request: Request, message: str, target: str | None, status_code: int = 200, email: str = ""
) -> HTMLResponse:
    """The sign-in form; after a refusal, with the message and the email typed (never the
    password)."""
    token = new_login_token()
    response = page(
        request,
        "login.html",
        status_code=status_code,
        title="Sign in",
        message=message,
        next=_next(target),
        login_csrf=token,
        email=email,
    )
    set_cookie(request, response, LOGIN_COOKIE, token, 600, PREFIX + "/login")
    return response


@router.get("/login")
def login_form(request: Request, next: str | None = None, why: str | None = None) -> Response:
    return _login_page(request, _WHY.get(why or "", ""), next)


@router.post("/login")
async def login(
    request: Request,
    session: SessionDep,
    hasher: HasherDep,
    settings: SettingsDep,
    throttle: LoginThrottleDep,
    address: ClientAddress,
) -> Response:
    """Check the password as ``POST /api/v1/auth/login`` does (same throttle), then keep the
    token it would return in the session cookie."""
    form = await read_form(request)
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(
        form.get(CSRF_FIELD, "").encode(), expected.encode()
    ):
        return _login_page(request, "The form expired; sign in again.", form.get("next"), 403)
    try:
        user = users.authenticate(
            session,
            hasher,
            form.get("email", ""),
            form.get("password", ""),
            throttle=throttle,
            address=address,
        )
    except (AuthenticationError, InvalidRequestError, RateLimitedError) as exc:
        status = 429 if isinstance(exc, RateLimitedError) else 401
        return _login_page(request, exc.detail, form.get("next"), status, form.get("email", ""))
    issued = issue_token(settings, user.id)
    response = redirect(_next(form.get("next")))
    cookie = session_cookie(issued.token)
    set_cookie(request, response, COOKIE, cookie, settings.token_lifetime_seconds, PREFIX)
    clear_cookie(request, response, LOGIN_COOKIE, PREFIX + "/login")
    return response


@router.post("/logout")
def logout(request: Request, _form: Form) -> Response:
    """Forget the session cookie. (The token inside stays valid until it expires, as a token
    the API issued does: tokens are not revocable.)"""
    response = redirect(PREFIX + "/login")
    clear_cookie(request, response, COOKIE, PREFIX)
    return response


@router.get("/")
def home(user: ConsoleUser) -> Response:
    return redirect(PREFIX + ("/approvals" if user.role is Role.ADMIN else "/me"))


@front.get("/")
def node_front(request: Request) -> Response:
    """The node's address in a browser: where the console and the API's documentation are."""
    return page(request, "front.html", title="dpnode")


@router.get("/me")
def my_budget(
    request: Request, session: SessionDep, settings: SettingsDep, user: ConsoleUser
) -> Response:
    """Your budget, a chart of it, your budget requests and your waiting publishes."""
    view = budget_view(session, settings, user, user.id)
    requests = budget_routes.list_budget_requests(session, user, limit=50)
    waiting = approval_routes.list_publish_approvals(session, settings, user, limit=50)
    return page(
        request, "budget.html", title="My budget", view=view, requests=requests, approvals=waiting
    )


def _day(value: str | None, *, end: bool) -> datetime | None:
    """A ``YYYY-MM-DD`` form date as the start of that day (or of the next one) in UTC.

    >>> _day("2026-03-01", end=True)
    datetime.datetime(2026, 3, 2, 0, 0, tzinfo=datetime.timezone.utc)
    """
    if not value:
        return None
    try:
        day = datetime.strptime(value, "%Y-%m-%d").date()
    except ValueError:
        raise InvalidRequestError(f"{value!r} is not a date (YYYY-MM-DD)") from None
    start = datetime.combine(day, time(), tzinfo=UTC)
    return start + timedelta(days=1) if end else start


@router.get("/ledger")
def ledger(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    user: ConsoleUser,
    user_id: str | None = None,
    dataset_id: str | None = None,
    since: str | None = None,
    until: str | None = None,
    before_id: str | None = None,
    limit: Limit = 100,
) -> Response:
    """The ledger as ``GET /api/v1/ledger/grouped`` gives it, one row per training run
    (its steps under a disclosure) or charge: admins filter by user (or see everyone's),
    others see their own; by dataset and by day for everyone."""
    subject = optional_int(user_id, "user")
    lines = budget_routes.get_ledger_grouped(
        session,
        settings,
        user,
        user_id=subject,
        all_users=user.role is Role.ADMIN and subject is None,
        dataset_id=optional_int(dataset_id, "dataset"),
        before_id=optional_int(before_id, "before"),
        since=_day(since, end=False),
        until=_day(until, end=True),
        limit=limit,
    )
    # The choices of the filters: what the API lists to this user.
    people = user_routes.list_users(session, user) if user.role is Role.ADMIN else []
    sets = dataset_routes.list_datasets(session, user, limit=1000)
    filters = {
        "user_id": user_id or "",
        "dataset_id": dataset_id or "",
        "since": since or "",
        "until": until or "",
    }
    return page(
        request,
        "ledger.html",
        title="Ledger",
        lines=lines,
        filters=filters,
        limit=limit,
        people=people,
        datasets=sets,
    )


@router.get("/catalog")
def catalog(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    user: ConsoleUser,
    tags: str | None = None,
    text: str | None = None,
) -> Response:
    """Datasets and models, with tags, bounds and owners: what ``/api/v1/search`` lists."""
    wanted = [t.strip() for t in (tags or "").split(",") if t.strip()]
    found = search_routes.search(session, user, tags=wanted, text=text or None, kind="any")
    # each dataset's cap (used / cap), for its owner and admins
    caps = dataset_budgets.visible_budgets(session, settings, user, (d.id for d in found.datasets))
    return page(
        request,
        "catalog.html",
        title="Datasets and models",
        found=found,
        caps=caps,
        filters={"tags": tags or "", "text": text or ""},
    )


@router.get("/{unknown:path}")
def not_found(request: Request, unknown: str) -> Response:
    """Any other console address: a page, not the API's JSON."""
    return page(request, "error.html", 404, title="Not found", detail="no such console page")

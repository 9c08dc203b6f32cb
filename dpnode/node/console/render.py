"""Rendering: the Jinja2 environment, the console's HTTP headers, and errors as pages.

Errors on console routes become HTML pages with the same status code the API would answer
(``dpnode.node.app.status_for``) and the same message; a missing or expired session becomes a
redirect to the sign-in page. The API's JSON handlers never see them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from pydantic import ValidationError

from dpnode.core import errors
from dpnode.core.errors import InvalidRequestError
from dpnode.node.api.numbers import read_id
from dpnode.node.console.session import CSRF_FIELD, CsrfError, SignInRequired
from dpnode.node.db.models import MAX_ID

log = logging.getLogger("dpnode")

PREFIX = "/console"
HERE = Path(__file__).parent

#: Pages load nothing from elsewhere and run no script; forms post only to the node.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _when(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _json(value: object) -> str:
    """JSON as text for a page (autoescaped there), not Jinja's ``tojson`` for scripts.

    >>> _json({"b": "<i>", "a": 1})
    '{"a": 1, "b": "<i>"}'
    """
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,  # every value is text unless a template says otherwise
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENV.filters["when"] = _when
ENV.filters["number"] = _number
ENV.filters["json"] = _json
ENV.globals["prefix"] = PREFIX
ENV.globals["csrf_field"] = CSRF_FIELD
# What a browser checks before it sends a form (the node checks everything again): a number
# as JSON writes it (0.5, 1e-6), a reason that is more than spaces.
ENV.globals["number_pattern"] = r"\s*(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+\-]?[0-9]+)?\s*"
ENV.globals["reason_pattern"] = r".*\S.*"


def page(request: Request, template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
    """Render ``template`` with the signed-in user (if any) and their CSRF token."""
    user = getattr(request.state, "console_user", None)
    values.setdefault("notice", "")
    values.setdefault("error", None)  # a refused form (dpnode.node.console.forms.FormError)
    html = ENV.get_template(template).render(
        user=user,
        csrf=getattr(request.state, "csrf", ""),
        path=request.url.path,
        **values,
    )
    return HTMLResponse(html, status_code=status_code, headers=HEADERS)


def redirect(url: str) -> RedirectResponse:
    """After a POST, show the result with a GET (303), so reloading does not post again."""
    return RedirectResponse(url, status_code=303, headers=HEADERS)


def _error_page(request: Request, status: int, title: str, detail: str) -> HTMLResponse:
    return page(request, "error.html", status_code=status, title=title, detail=detail)


_TITLES = {401: "Sign in required", 403: "Forbidden", 404: "Not found", 409: "Conflict"}

#: What a form's input may be refused with: a domain error or a schema's validation error.
REFUSALS = (errors.DPNodeError, RequestValidationError, ValidationError)


def refusal(exc: Exception) -> tuple[int, str]:
    """The status code and message the API would answer ``exc`` (one of :data:`REFUSALS`) with.

    >>> refusal(InvalidRequestError("say why"))
    (422, 'say why')
    """
    if isinstance(exc, errors.DPNodeError):
        from dpnode.node.app import status_for  # the app factory imports the console

        return status_for(exc), exc.detail
    if isinstance(exc, RequestValidationError | ValidationError):
        return 422, _validation(exc)
    raise TypeError(f"{type(exc).__name__} is not a refusal") from exc


class ConsoleRoute(APIRoute):
    """A route whose errors are answered as pages, not as the API's JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequired as exc:
                # The reason is a fixed word, never text from the URL shown back as a message.
                why = "expired" if exc.expired else "signin"
                return redirect(f"{PREFIX}/login?next={quote(request.url.path)}&why={why}")
            except CsrfError as exc:
                return _error_page(request, 403, "Forbidden", str(exc))
            except REFUSALS as exc:
                status, detail = refusal(exc)
                title = "Invalid input" if status == 422 else _TITLES.get(status, "Refused")
                return _error_page(request, status, title, detail)
            except Exception as exc:  # as the API's handler: logged, named, no detail shown
                log.exception("unhandled error", exc_info=exc)
                detail = f"the node failed unexpectedly ({type(exc).__name__})"
                return _error_page(request, 500, "Error", detail)

        return route


def _validation(exc: RequestValidationError | ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body", "query"))
        parts.append(f"{where or 'input'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def optional_int(value: str | None, what: str) -> int | None:
    """An id typed in a filter form, read as the API reads one; empty means no filter.

    >>> optional_int("", "user"), optional_int("7", "user")
    (None, 7)
    """
    if not value:
        return None
    found = read_id(value)  # isdigit() took '²' (int() raised) and '١' (int() read 1)
    if found is None:
        raise InvalidRequestError(f"{what} must be a number from 0 to {MAX_ID}, not {value!r}")
    return found

"""Console sign-in: the API's token in an HttpOnly cookie, and a CSRF token per session.

The cookie holds the token ``POST /api/v1/auth/login`` returns (same signature, same expiry,
same account checks on every request), after a random nonce that names the session, so the
console has no session store of its own.
It is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it)
and ``Secure`` when the page was served over https.

Every form carries a CSRF token derived from the session cookie with an HMAC under the node's
secret: it is fixed for a session, unguessable without the secret, and needs no storage. The
sign-in form, which has no session yet, uses a random token kept in a short-lived cookie of its
own and repeated in the form (the double-submit pattern).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import Depends, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from dpnode.core.errors import AuthenticationError, PayloadTooLargeError
from dpnode.node.api.deps import SessionDep, SettingsDep, get_admin
from dpnode.node.db.models import User
from dpnode.node.services import users
from dpnode.node.services.security import read_token
from dpnode.node.settings import Settings

COOKIE = "dpnode_console"
LOGIN_COOKIE = "dpnode_console_login"
CSRF_FIELD = "csrf_token"
#: A console form is a few fields and at most a policy file.
MAX_FORM_BYTES = 1_100_000


class SignInRequired(Exception):
    """No valid console session: the browser is sent to the sign-in page."""

    def __init__(self, *, expired: bool) -> None:
        super().__init__("sign in to use the console")
        self.expired = expired


class CsrfError(Exception):
    """A form arrived without its session's CSRF token (answered 403). Neither this nor
    :class:`SignInRequired` is a domain error: the console answers them, never the API."""


def session_cookie(token: str) -> str:
    """The cookie of a new session: a random nonce, then the API token.

    Two sign-ins in the same second get the same token (its claims are the user and the
    times); the nonce keeps their sessions, and so their CSRF tokens, apart.
    """
    return f"{secrets.token_urlsafe(16)}:{token}"


def csrf_token(settings: Settings, session_token: str) -> str:
    """The CSRF token of a session: an HMAC of its cookie under the node's secret.

    >>> from pydantic import SecretStr
    >>> s = Settings(token_secret=SecretStr("k" * 32))
    >>> csrf_token(s, "a") == csrf_token(s, "a") != csrf_token(s, "b")
    True
    """
    key = settings.token_secret.get_secret_value().encode()
    return hmac.new(key, b"console-csrf:" + session_token.encode(), hashlib.sha256).hexdigest()


def set_cookie(
    request: Request, response: Response, name: str, value: str, max_age: int, path: str
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=path,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(request: Request, response: Response, name: str, path: str) -> None:
    set_cookie(request, response, name, "", 0, path)


def new_login_token() -> str:
    return secrets.token_urlsafe(32)


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form (first value of each field), refused past :data:`MAX_FORM_BYTES`."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise PayloadTooLargeError(f"form is over the {MAX_FORM_BYTES}-byte limit")
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {k: v[0] for k, v in fields.items()}


def _session_user(request: Request, session: Session, settings: Settings) -> User:
    cookie = request.cookies.get(COOKIE)
    if not cookie:
        raise SignInRequired(expired=False)
    _, _, token = cookie.partition(":")
    try:
        user = users.active(session, read_token(settings, token))
    except AuthenticationError:
        raise SignInRequired(expired=True) from None
    session.commit()  # end the read, as the API's get_current_user does
    request.state.csrf = csrf_token(settings, cookie)
    request.state.console_user = user
    return user


def console_user(request: Request, session: SessionDep, settings: SettingsDep) -> User:
    return _session_user(request, session, settings)


ConsoleUser = Annotated[User, Depends(console_user)]


async def console_admin(user: ConsoleUser) -> User:
    """The signed-in admin; anyone else is refused exactly as the API's admin routes refuse."""
    return await get_admin(user)


ConsoleAdmin = Annotated[User, Depends(console_admin)]


async def checked_form(request: Request, user: ConsoleUser) -> dict[str, str]:
    """The posted form, after checking its CSRF token against the session's."""
    form = await read_form(request)
    expected: str = request.state.csrf
    if not hmac.compare_digest(form.get(CSRF_FIELD, "").encode(), expected.encode()):
        raise CsrfError("the form's security token is missing or wrong; reload the page")
    return form


Form = Annotated[dict[str, str], Depends(checked_form)]

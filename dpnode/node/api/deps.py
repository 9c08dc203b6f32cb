"""Request dependencies: the session, the current user, the body under its size limit."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import Annotated

from argon2 import PasswordHasher
from fastapi import Depends, Header, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from dpnode.core.errors import (
    AuthenticationError,
    InvalidRequestError,
    PayloadTooLargeError,
    PermissionDeniedError,
)
from dpnode.node.api.numbers import BoolText, IntegerText, read_id
from dpnode.node.context import NodeContext
from dpnode.node.db.models import MAX_ID, Role, User
from dpnode.node.services import users
from dpnode.node.services.security import read_token
from dpnode.node.services.throttle import LoginThrottle
from dpnode.node.services.uploads import UploadSessions
from dpnode.node.settings import Settings
from dpnode.node.storage import BlobStore


# Dependencies that do no I/O are ``async``: FastAPI runs a plain ``def`` dependency in the
# thread pool, a hand-off that costs more than the dependency itself. Those on every publish
# read the context from the request rather than through a chain of sub-dependencies, which
# FastAPI solves again on every request.
def _context_of(request: Request) -> NodeContext:
    context: NodeContext = request.app.state.context
    return context


async def get_context(request: Request) -> NodeContext:
    return _context_of(request)


ContextDep = Annotated[NodeContext, Depends(get_context)]


def get_session(context: ContextDep) -> Iterator[Session]:
    with context.sessions() as session:
        yield session


def get_read_session(context: ContextDep) -> Iterator[Session]:
    with context.read_sessions() as session:
        yield session


async def get_settings(context: ContextDep) -> Settings:
    return context.settings


async def get_store(context: ContextDep) -> BlobStore:
    return context.store


async def get_hasher(context: ContextDep) -> PasswordHasher:
    return context.hasher


SessionDep = Annotated[Session, Depends(get_session)]
#: A session for routes that only read: on SQLite its transactions take no lock (see
#: dpnode.node.db.session.read_engine), so holding one while FastAPI serialises the response (in
#: the thread pool) cannot keep writers waiting.
ReadSessionDep = Annotated[Session, Depends(get_read_session)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[BlobStore, Depends(get_store)]
HasherDep = Annotated[PasswordHasher, Depends(get_hasher)]


async def get_login_throttle(context: ContextDep) -> LoginThrottle:
    return context.logins


LoginThrottleDep = Annotated[LoginThrottle, Depends(get_login_throttle)]

# A charged request's name, so that a retry is answered once and charged once.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="names this request: a retry with the same key gets the first "
        "answer, charged once (1 to 128 printable ASCII characters, no spaces)",
    ),
]


def client_address(peer: str, forwarded_for: str | None, trusted_proxies: list[str]) -> str:
    """The client's address: the peer's, unless the peer is a trusted proxy.

    Behind trusted proxies, ``X-Forwarded-For`` is read from the right (the entries the
    proxies appended) and the first address no trusted proxy holds is the client's; entries
    further left were written by the client and could say anything.

    >>> client_address("10.0.0.2", "1.2.3.4, 10.0.0.1", ["10.0.0.0/8"])
    '1.2.3.4'
    >>> client_address("5.6.7.8", "1.2.3.4", [])
    '5.6.7.8'
    """
    networks = [ipaddress.ip_network(p, strict=False) for p in trusted_proxies]

    def trusted(address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in network for network in networks)

    if not forwarded_for or not trusted(peer):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not trusted(hop):
            return hop
    return hops[0] if hops else peer


async def get_client_address(request: Request) -> str:
    peer = request.client.host if request.client is not None else ""
    proxies = _context_of(request).settings.trusted_proxies
    if not proxies:
        return peer
    return client_address(peer, request.headers.get("x-forwarded-for"), proxies)


#: Where a request comes from, for the login throttle (see ``client_address``).
ClientAddress = Annotated[str, Depends(get_client_address)]

_bearer = HTTPBearer(auto_error=False, description="the access token from /api/v1/auth/login")


Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _token_user_id(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> int:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise AuthenticationError("not logged in: send 'Authorization: Bearer <token>'")
    return read_token(settings, credentials.credentials)


def get_current_user(session: SessionDep, settings: SettingsDep, credentials: Credentials) -> User:
    return users.caller(session, _token_user_id(settings, credentials))


#: The caller, in the request's session (routes that change users need it attached there).
CurrentUser = Annotated[User, Depends(get_current_user)]


async def get_token_user_id(request: Request, credentials: Credentials) -> int:
    return _token_user_id(_context_of(request).settings, credentials)


#: The user id of a valid token (signature and expiry checked, no database read): for routes
#: whose service reads the account itself (``dpnode.node.services.users.active``) in the
#: transaction it reads its inputs in, rather than in a thread hand-off and a transaction of
#: their own. A deactivated account is refused there, before any work.
TokenUserId = Annotated[int, Depends(get_token_user_id)]


async def get_admin(user: CurrentUser) -> User:
    if user.role is not Role.ADMIN:
        raise PermissionDeniedError("only admins may do this")
    return user


AdminUser = Annotated[User, Depends(get_admin)]


async def read_limited_body(request: Request) -> bytes:
    """The request body, refused as soon as it grows past ``max_upload_bytes``."""
    return await _read_body(request, _context_of(request).settings.max_upload_bytes)


async def read_chunk_body(request: Request) -> bytes:
    """A chunk of an upload session, refused past ``max_upload_chunk_bytes``."""
    return await _read_body(request, _context_of(request).settings.max_upload_chunk_bytes)


#: HTTP's Content-Length: ASCII digits (``isdigit()`` took ``²``, which int() cannot read)
_LENGTH = re.compile(r"[0-9]+")
#: more digits than any body's length has (int() raises beyond 4300)
_LONGEST = 19


def _declared_length(request: Request) -> int | None:
    """The body's length as its Content-Length headers declare it (the largest, if several;
    None if none); ``10**19`` stands for any longer number.

    Raises:
        InvalidRequestError: a Content-Length that is not ASCII digits.
    """
    lengths = []
    for value in request.headers.getlist("content-length"):
        if _LENGTH.fullmatch(value) is None:
            raise InvalidRequestError(
                "the Content-Length header must be a number of bytes in ASCII digits, "
                f"not {value[:40]!r}"
            )
        digits = value.lstrip("0") or "0"
        lengths.append(int(digits) if len(digits) <= _LONGEST else 10**_LONGEST)
    return max(lengths, default=None)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = _declared_length(request)
    if declared is not None and declared > limit:
        of = f"of {declared} bytes " if declared < 10**_LONGEST else ""
        raise PayloadTooLargeError(f"request body {of}is over the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body is over the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_catalog_body(request: Request) -> bytes:
    """A member's join request or catalog (dpnode.node.network), refused past
    ``network_max_catalog_bytes``."""
    return await _read_body(request, _context_of(request).settings.network_max_catalog_bytes)


LimitedBody = Annotated[bytes, Depends(read_limited_body)]
CatalogBody = Annotated[bytes, Depends(read_catalog_body)]
ChunkBody = Annotated[bytes, Depends(read_chunk_body)]


async def get_uploads(context: ContextDep) -> UploadSessions:
    return context.uploads


UploadsDep = Annotated[UploadSessions, Depends(get_uploads)]


#: an id in a path or a query (a larger number than the database holds is refused, 422)
PathId = Annotated[int, Path(ge=0, le=MAX_ID), IntegerText]
QueryId = Annotated[int | None, Query(ge=0, le=MAX_ID), IntegerText]
#: how many rows a listing answers at most
Limit = Annotated[int, Query(ge=1, le=1000), IntegerText]
#: a flag in a query: ``true`` or ``false``
QueryFlag = Annotated[bool, Query(), BoolText]


def item_ref(ref: str) -> int | str:
    """A dataset or model path segment: an id as JSON writes it is an id, anything else a
    name (so a number beyond any id is a name, which no dataset has: not found).

    >>> item_ref("42"), item_ref("diabetes"), item_ref("99999999999999999999"), item_ref("²")
    (42, 'diabetes', '99999999999999999999', '²')
    """
    found = read_id(ref)  # int() of 5000 digits raised: a 500
    return ref if found is None else found

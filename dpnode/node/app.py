"""The app factory: routers, and the one place where domain errors become HTTP."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

import anyio.to_thread
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as SQLAlchemyTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from dpnode import __version__
from dpnode.core import errors
from dpnode.node import console
from dpnode.node.api import docs, openapi
from dpnode.node.api.backpressure import InFlightLimit, thread_tokens
from dpnode.node.api.nul import RefuseNul
from dpnode.node.api.routes import (
    approvals,
    audit,
    auth,
    budget,
    datasets,
    meta,
    models,
    policy,
    publish,
    runs,
    search,
    synthesis,
    uploads,
    users,
)
from dpnode.node.context import NodeContext
from dpnode.node.network import routes as network_routes
from dpnode.node.network.membership import Heartbeats
from dpnode.node.services import synthesis_jobs
from dpnode.node.settings import Settings, get_settings
from dpnode.node.storage import CorruptBlobError

log = logging.getLogger("dpnode")

API_PREFIX = "/api/v1"

#: Domain error -> HTTP status. The most specific class in an error's MRO wins.
STATUS: dict[type[errors.DPNodeError], int] = {
    errors.InvalidRequestError: 422,
    errors.EvaluationError: 422,
    errors.QuotaExceededError: 422,
    errors.PayloadTooLargeError: 413,
    errors.AuthenticationError: 401,
    errors.RateLimitedError: 429,
    errors.PermissionDeniedError: 403,
    errors.NotFoundError: 404,
    errors.ConflictError: 409,
    errors.EvaluationUnavailableError: 503,
    errors.BudgetMarkError: 503,
    errors.NetworkError: 502,
}

_HTTP_CODES = {
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    429: "rate_limited",
    503: "overloaded",
}


def status_for(exc: errors.DPNodeError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def _body(
    code: str,
    detail: str,
    status: int,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    if status == 401:
        headers = {"WWW-Authenticate": "Bearer", **(headers or {})}
    body = {"error": code, "detail": detail, **extra}
    return JSONResponse(body, status_code=status, headers=headers)


#: Why a JSON body could not be read, by what its parser raised (FastAPI answers 400 for
#: all but a syntax error, which is a 422 like any other malformed input).
_UNREADABLE: dict[type[Exception], str] = {
    RecursionError: "the JSON body is nested too deeply",
    UnicodeDecodeError: "the JSON body is not UTF-8 text",
}


def _unreadable_message(exc: StarletteHTTPException) -> str:
    cause = exc.__cause__
    why = next((m for cls, m in _UNREADABLE.items() if isinstance(cause, cls)), str(exc.detail))
    return f"invalid request: {why}"


def _syntax_error(exc: RequestValidationError, err: dict[str, Any]) -> str:
    """What is wrong in a JSON body its parser refused, and where (line and column), as the
    parser says it: FastAPI's own message is only "JSON decode error"."""
    loc, why = err.get("loc", ()), err.get("ctx", {}).get("error", "")
    position = loc[-1] if loc else None
    if isinstance(exc.body, str) and isinstance(position, int) and isinstance(why, str) and why:
        return f"the JSON body is not valid JSON: {json.JSONDecodeError(why, exc.body, position)}"
    return "the JSON body is not valid JSON"


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            parts.append(_syntax_error(exc, err))
            continue
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


#: Seconds a client is asked to wait after ``database_busy``.
DATABASE_BUSY_RETRY_AFTER = 1


def _locked(exc: OperationalError) -> bool:
    """SQLite's busy timeout ran out: another transaction held the write lock all along."""
    return "database is locked" in str(exc.orig)


def _database_busy(exc: Exception) -> JSONResponse:
    # The transaction that waited never began (no connection, no lock); an earlier one of the
    # same request may have committed, so only requests safe to repeat are resent (the SDK:
    # reads, and publishes under their idempotency key).
    log.warning("database busy: %s", exc)
    return _body(
        "database_busy",
        "the node's database is busy: the request did not complete; retry in a moment",
        503,
        {"Retry-After": str(DATABASE_BUSY_RETRY_AFTER)},
    )


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(errors.DPNodeError)
    async def _domain(_: Request, exc: errors.DPNodeError) -> JSONResponse:
        extra = exc.extra()
        headers = None
        if isinstance(exc, errors.RateLimitedError | errors.EvaluationUnavailableError):
            headers = {"Retry-After": str(exc.retry_after)}
        return _body(exc.code, exc.detail, status_for(exc), headers, **extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _body("invalid_request", _validation_message(exc), 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:  # a body FastAPI could not read: malformed input
            return _body("invalid_request", _unreadable_message(exc), 422)
        return _body(
            _HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail), exc.status_code
        )

    @app.exception_handler(CorruptBlobError)
    async def _corrupt(_: Request, exc: CorruptBlobError) -> JSONResponse:
        log.error("storage corruption: %s", exc)
        return _body(
            "storage_error", "stored data failed its integrity check; tell the node's operator", 500
        )

    @app.exception_handler(SQLAlchemyTimeoutError)
    async def _pool_timeout(_: Request, exc: SQLAlchemyTimeoutError) -> JSONResponse:
        return _database_busy(exc)

    @app.exception_handler(OperationalError)
    async def _operational(request: Request, exc: OperationalError) -> JSONResponse:
        if _locked(exc):
            return _database_busy(exc)
        return await _unexpected(request, exc)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return _body("internal_error", f"the node failed unexpectedly ({type(exc).__name__})", 500)


def check_mark(ctx: NodeContext) -> None:
    """Compare the database with the budget mark as the process starts, to say so in the log
    at once; publishes check it again (and refuse) until it is resolved."""
    try:
        with ctx.engine.connect() as connection:
            ctx.mark.verify(connection)
    except errors.BudgetMarkError as exc:
        log.error("publishes are refused: %s", exc.detail)
    except SQLAlchemyError as exc:  # e.g. not migrated yet: the first publish checks again
        log.warning("the budget mark could not be checked at start: %s", exc)


def sweep_jobs(ctx: NodeContext) -> None:
    """Mark failed the synthesis jobs a stopped process left running (their charge stands)."""
    try:
        synthesis_jobs.sweep(ctx.sessions)
    except SQLAlchemyError as exc:  # e.g. not migrated yet: no job can be running either
        log.warning("the synthesis jobs could not be swept at start: %s", exc)


class _Routes(Protocol):
    router: APIRouter


# Routes are matched in order: publish first, as a training loop calls it most.
_NODE_ROUTERS: tuple[_Routes, ...] = (
    *(publish, auth, users, datasets, uploads, models),
    *(search, approvals, runs, budget, policy, meta, audit, synthesis),
)
#: A network keeps accounts (its admins) and its directory, and no data.
_NETWORK_ROUTERS: tuple[_Routes, ...] = (network_routes, auth, users, meta, audit)


def create_app(settings: Settings | None = None, context: NodeContext | None = None) -> FastAPI:
    """Build the node's ASGI app (a network's, with ``role`` ``network``). The database must
    already be migrated."""
    ctx = context or NodeContext.from_settings(settings or get_settings())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        # a thread for every request admitted (see dpnode.node.api.backpressure)
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = max(
            limiter.total_tokens, thread_tokens(ctx.settings.max_requests_in_flight)
        )
        check_mark(ctx)
        if ctx.settings.role == "node":
            sweep_jobs(ctx)
        heartbeats = None
        if ctx.settings.role == "node":
            heartbeats = Heartbeats(ctx.sessions, ctx.settings.network_heartbeat_seconds)
            heartbeats.watch(ctx.sessions, ctx.serial_sessions)
            heartbeats.start()
        yield
        if heartbeats is not None:
            heartbeats.stop()
        if context is None:  # we made it, we close it
            ctx.close()
        else:
            # Return the budget mark's reservation here, at the server's clean stop: after
            # it, uvicorn re-raises the SIGTERM or SIGINT it caught, which ends the process
            # before the caller's own clean-up runs (the reservation would then count as
            # spent, and publishes wait for a carry-forward).
            ctx.mark.close()

    app = FastAPI(
        title="dpnode",
        version=__version__,
        summary="A differential-privacy data node",
        lifespan=lifespan,
        docs_url=None,  # served by dpnode.node.api.docs, without a CDN
        redoc_url=None,
        generate_unique_id_function=openapi.operation_id,
    )
    app.state.context = ctx
    network = ctx.settings.role == "network"
    modules = _NETWORK_ROUTERS if network else _NODE_ROUTERS
    for module in modules:
        app.include_router(module.router, prefix=API_PREFIX)
    app.include_router(console.router)  # the browser console, outside the OpenAPI schema
    install_error_handlers(app)
    app.add_middleware(RefuseNul)  # inside the in-flight limit: added first
    app.add_middleware(
        InFlightLimit,
        limit=ctx.settings.max_requests_in_flight,
        retry_after=ctx.settings.overload_retry_after_seconds,
    )
    openapi.install(
        app,
        [route for module in modules for route in module.router.routes],
        network_routes.openapi_components() if network else None,
    )
    docs.install(app)
    return app

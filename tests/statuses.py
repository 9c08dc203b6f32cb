"""Every status the app is seen to answer in the API tests must be in its OpenAPI document.

The ``http`` fixture (tests/conftest.py) records what each test's requests were answered
(:class:`RecordStatuses`) and, after the test, fails it if a status is missing from the
operation's documented responses (:func:`undocumented`). So the document of each route
grows with the tests that exercise it, and a client generated from it knows every answer.

Building the document takes a few tenths of a second and an app keeps it for its own life
only, while every API test builds an app of its own from the same routers: :func:`spec_of`
keeps one document per set of routes for the session (a test that adds a route gets its own).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import cache
from typing import Any

from fastapi import FastAPI
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: (method, path, status) of one answered request.
Seen = tuple[str, str, int]


class RecordStatuses:
    """ASGI middleware adding each request's (method, path, status) to ``seen``."""

    def __init__(self, app: ASGIApp, seen: set[Seen]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.seen.add((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, record)


_specs: dict[tuple[tuple[object, ...], ...], dict[str, Any]] = {}


def _route_key(route: BaseRoute) -> tuple[object, ...]:
    methods = getattr(route, "methods", None) or ()
    # by name: the app's own routes (its /openapi.json) have closures of their own as endpoints
    endpoint = getattr(route, "endpoint", None)
    name = f"{endpoint.__module__}.{endpoint.__qualname__}" if endpoint is not None else None
    return (type(route).__name__, getattr(route, "path", None), tuple(sorted(methods)), name)


def spec_of(app: FastAPI) -> dict[str, Any]:
    """``app.openapi()``, built once per session for apps with the same routes (read only)."""
    key = tuple(_route_key(route) for route in app.routes)
    if key not in _specs:
        _specs[key] = app.openapi()
    return _specs[key]


@cache
def _templates(paths: tuple[str, ...]) -> list[tuple[re.Pattern[str], str]]:
    compiled = [(re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", p) + "$"), p) for p in paths]
    # a literal segment beats a parameter (/users/me before /users/{user_id})
    return sorted(compiled, key=lambda c: c[1].count("{"))


def operation_of(spec: dict[str, Any], method: str, path: str) -> dict[str, Any] | None:
    """The documented operation answering ``method path``, or None (not an API route)."""
    for pattern, template in _templates(tuple(spec["paths"])):
        if pattern.match(path) and method.lower() in spec["paths"][template]:
            operation: dict[str, Any] = spec["paths"][template][method.lower()]
            return operation
    return None


def undocumented(spec: dict[str, Any], seen: Iterable[Seen]) -> list[str]:
    """The answers in ``seen`` whose status the operation does not document.

    >>> spec = {"paths": {"/a/{x}": {"get": {"operationId": "a", "responses": {"200": {}}}}}}
    >>> undocumented(spec, [("GET", "/a/1", 200), ("GET", "/a/1", 409), ("GET", "/b", 500)])
    ['GET /a/1 (a) answered 409, which its OpenAPI responses do not list']
    """
    problems = []
    for method, path, status in sorted(seen):
        operation = operation_of(spec, method, path)
        if operation is not None and str(status) not in operation["responses"]:
            problems.append(
                f"{method} {path} ({operation['operationId']}) answered {status}, "
                "which its OpenAPI responses do not list"
            )
    return problems

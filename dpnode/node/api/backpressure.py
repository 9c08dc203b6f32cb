"""Back-pressure: a bounded number of requests in flight, and ``503`` beyond it, at once.

A node that accepts every request queues them all: past a point each one waits longer
than its client will, the clients time out and resend, and the node spends its time on
answers nobody reads. Instead, each worker process handles at most
``max_requests_in_flight`` requests at a time; one more is answered at once with
``503 overloaded`` and ``Retry-After``, before its body is read, its token checked or
the database touched, so the refusal costs next to nothing and the node recovers as soon
as the requests in flight finish. The SDK waits ``Retry-After`` and sends the request
again (a publish with the same idempotency key, so it is never charged twice).

The decision reads one number: how many requests this process is handling. That depends
on how many requests arrive, never on any private value, so a 503 releases nothing.

The count covers a request from the moment the app receives it until its response and
its background tasks are done. The thread pool gets a thread for every request admitted
(see :func:`thread_tokens`): a request that holds a database transaction then never waits
for a thread that every other request is holding while it waits for that transaction.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

#: Paths never refused: a health check must not fail because the node is busy.
EXEMPT = frozenset({"/api/v1/health"})


def thread_tokens(max_in_flight: int) -> int:
    """Threads for sync routes and dependencies: one per request admitted, and a margin.

    >>> thread_tokens(64)
    72
    """
    return max_in_flight + 8


class InFlightLimit:
    """Pure ASGI middleware: at most ``limit`` HTTP requests at once, ``503`` beyond."""

    def __init__(self, app: ASGIApp, *, limit: int, retry_after: int) -> None:
        self.app = app
        self.limit = limit
        self.in_flight = 0
        #: requests refused since the process started (for logs and tests)
        self.refused = 0
        detail = (
            f"the node is handling as many requests as it takes at once ({limit}); "
            f"retry in {retry_after} s"
        )
        self._body = json.dumps({"error": "overloaded", "detail": detail}).encode()
        self._headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self._body)).encode()),
            (b"retry-after", str(retry_after).encode()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in EXEMPT:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.limit:  # one event loop: no lock needed
            self.refused += 1
            await self._refuse(send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _refuse(self, send: Send) -> None:
        start: dict[str, Any] = {
            "type": "http.response.start",
            "status": 503,
            "headers": self._headers,
        }
        await send(start)
        await send({"type": "http.response.body", "body": self._body})

"""Text with a NUL character is refused (422) before any route reads it.

PostgreSQL's text columns cannot hold the NUL character: a login, a search, an email, a
reason or a description that carried one failed in the database (``DataError``: a 500),
and an upload's finalize failed on every retry. SQLite stores it, so ``"ds@x\\0"`` was
another account there. No name, email or text of the node has a use for it, so a request
whose path, query or JSON body carries one is refused whole, on both databases. A tensor
frame's header is checked where frames are decoded (:mod:`dpnode.node.api.frames`).

A body sent as JSON is read here: it is small, the node's JSON requests being forms, not
data (one over :data:`MAX_JSON_BYTES` is refused, 413). It is handed on unchanged. Bodies of
other types, and of none (a tensor frame may come without one; FastAPI reads no JSON from
such a body either), pass through unread.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: A NUL as it appears in a URL or in JSON text (JSON cannot hold a raw one).
MARKS = (b"%00", b"\x00", b"\\u0000")
DETAIL = "text may not contain the NUL character (U+0000)"
#: The largest JSON body the node reads (a policy of thousands of users is far below it).
MAX_JSON_BYTES = 4 * 2**20


def carries_nul(data: bytes) -> bool:
    """Whether ``data`` (a path, a query string or JSON text) spells a NUL character.

    >>> carries_nul(b"email=a%00b"), carries_nul(b'{"a": "b\\\\u0000"}'), carries_nul(b"ok")
    (True, True, False)
    """
    lowered = data.lower()
    return any(mark in lowered for mark in MARKS)


class RefuseNul:
    """Pure ASGI middleware: ``422 invalid_request`` for a NUL in the URL or a JSON body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        url = scope.get("raw_path") or scope["path"].encode()
        if carries_nul(url) or carries_nul(scope.get("query_string", b"")):
            await _refuse(send, 422, "invalid_request", DETAIL)
            return
        headers = dict(scope.get("headers") or [])
        if b"json" not in headers.get(b"content-type", b"").lower():
            # a frame, or a body of no declared type (which may be a frame): not read
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            size += len(message.get("body", b""))
            if size > MAX_JSON_BYTES:
                detail = f"a JSON body may hold at most {MAX_JSON_BYTES} bytes"
                await _refuse(send, 413, "payload_too_large", detail)
                return
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        body = b"".join(m.get("body", b"") for m in messages)
        if carries_nul(body):
            await _refuse(send, 422, "invalid_request", DETAIL)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


async def _refuse(send: Send, status: int, code: str, detail: str) -> None:
    body = json.dumps({"error": code, "detail": detail}).encode()
    start: dict[str, Any] = {
        "type": "http.response.start",
        "status": status,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }
    await send(start)
    await send({"type": "http.response.body", "body": body})

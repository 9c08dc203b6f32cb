"""An httpx transport that serves requests from an ASGI app in this process.

For a node opened in the analyst's own process (a notebook on one machine, a script, a
benchmark): ``sdk.login(url, ..., transport=InProcessTransport(app))``. The app is the
node's (``dpnode.node.app.create_app``), but this module knows only ASGI: the SDK never
imports the node.

Why not starlette's ``TestClient`` transport: it runs the app in an event loop on another
thread and crosses to it several times a request (the call, each body message, the end),
and it answers only once the app has returned, background tasks included (a publish's
stored answer). Each crossing wakes a thread, which on a busy machine waits for a core.
Here the app runs on one event-loop thread that lives as long as the transport: a
request is handed to it once, and handed back as soon as the response's last byte is
sent, as a server answers; what the app does after (its background tasks) goes on in
that loop while the caller reads the answer. The app's lifespan runs when the transport
opens and when it is shut down.

Several clients may share one transport (an admin's, an owner's and an analyst's login):
closing a client leaves it running; :meth:`InProcessTransport.shutdown`, or leaving its
``with`` block, stops it once its requests in flight are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import MutableMapping
from concurrent.futures import Future
from typing import Any

import httpx

log = logging.getLogger("dpnode.sdk")

__all__ = ["InProcessTransport"]

Message = MutableMapping[str, Any]


class InProcessTransport(httpx.BaseTransport):
    """Send the SDK's requests to an ASGI ``app`` running in this process.

    A request waits for its answer as long as the client's read timeout says (no limit
    without one), then raises ``httpx.ReadTimeout``, which the SDK treats as a lost
    connection (a publish is sent again under its idempotency key).

    Args:
        app: an ASGI 3 application (the node's app).
        client: the address the app sees as the caller's (its login throttle counts by it).

    Raises:
        RuntimeError: the app's lifespan startup failed (raised when the transport opens).

    >>> async def app(scope, receive, send):
    ...     if scope["type"] == "http":
    ...         await send({"type": "http.response.start", "status": 200, "headers": []})
    ...         await send({"type": "http.response.body", "body": b"hello"})
    >>> with InProcessTransport(app) as transport:
    ...     httpx.Client(transport=transport).get("http://node/").text
    'hello'
    """

    #: seconds the lifespan's startup and shutdown may take
    LIFESPAN_TIMEOUT = 60.0

    def __init__(self, app: Any, *, client: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.app = app
        self.client = client
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="dpnode-in-process", daemon=True
        )
        self._thread.start()
        self._tasks: set[asyncio.Task[None]] = set()
        self._lifespan: _Lifespan | None = None
        self._closed = False
        try:
            self._lifespan = self._call(_Lifespan.start(app), self.LIFESPAN_TIMEOUT)
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coroutine: Any, timeout: float | None) -> Any:
        """Run ``coroutine`` on the app's loop and wait for its result (in this thread)."""
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise httpx.TransportError("the in-process transport is closed")
        body = request.read()
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": request.url.scheme,
            "path": request.url.path,
            "raw_path": request.url.raw_path.split(b"?", 1)[0],
            "query_string": request.url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": self.client,
            "server": (request.url.host, request.url.port or 80),
            "state": dict(self._lifespan.state) if self._lifespan is not None else {},
        }
        timeout = request.extensions.get("timeout", {}).get("read")
        try:
            status, headers, content = self._call(self._respond(scope, body), timeout)
        except TimeoutError:
            raise httpx.ReadTimeout("the in-process app did not answer in time") from None
        return httpx.Response(status, headers=headers, content=content, request=request)

    async def _respond(self, scope: Message, body: bytes) -> tuple[int, list[Any], bytes]:
        """Run the app on one request until its response is complete (it may go on after)."""
        answered: asyncio.Future[tuple[int, list[Any], bytes]] = self._loop.create_future()
        sent = asyncio.Event()
        chunks: list[bytes] = []
        start: Message = {}
        delivered = False

        async def receive() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await sent.wait()  # the client has its answer: then it is gone
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False) and not answered.done():
                    content = b"".join(chunks)
                    answered.set_result((start["status"], start.get("headers", []), content))
                    sent.set()

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except Exception as exc:
                if not answered.done():  # no answer: the caller gets the app's error
                    answered.set_exception(exc)
                    return
                log.exception("the in-process app failed after answering", exc_info=exc)
            finally:
                sent.set()
                if not answered.done():
                    answered.set_exception(
                        httpx.RemoteProtocolError("the in-process app returned no response")
                    )

        task = self._loop.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return await answered

    def close(self) -> None:
        """Nothing: a client closing leaves the transport to the others that share it
        (:meth:`shutdown` stops it)."""

    def shutdown(self) -> None:
        """Wait for the app's work in flight (background tasks too), run its lifespan's
        shutdown and stop its loop. Requests sent after raise ``httpx.TransportError``."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self._drain(), self.LIFESPAN_TIMEOUT)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.LIFESPAN_TIMEOUT)
        with contextlib.suppress(RuntimeError):
            self._loop.close()

    def __enter__(self) -> InProcessTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    async def _drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._lifespan is not None:
            await self._lifespan.stop()


class _Lifespan:
    """An ASGI app's lifespan: started when the transport opens, stopped when it closes."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, app: Any) -> _Lifespan | None:
        lifespan = cls(app)
        lifespan._task = asyncio.get_running_loop().create_task(lifespan._run())
        await lifespan._inbox.put({"type": "lifespan.startup"})
        await lifespan._started
        return lifespan

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": self.state}
        try:
            await self.app(scope, self._inbox.get, self._send)
        except BaseException:
            if not self._started.done():  # an app without a lifespan refuses the scope
                self._started.set_result(None)
        finally:
            for waiting in (self._started, self._stopped):
                if not waiting.done():
                    waiting.set_result(None)

    async def _send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self._started.set_result(None)
        elif kind == "lifespan.startup.failed":
            self._started.set_exception(
                RuntimeError(f"the app failed to start: {message.get('message', '')}")
            )
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            self._stopped.set_result(None)

    async def stop(self) -> None:
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._stopped

"""The node client: login, search, publishing and administration over HTTP.

Its searches are ``dpnode.sdk._client_search``, its uploads ``dpnode.sdk._client_uploads`` and
its budget, ledger and policy calls ``dpnode.sdk._client_budget`` (mixins :class:`Client`
inherits)."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import random
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import numpy.typing as npt
from safetensors.numpy import load

from dpnode.core import structures
from dpnode.sdk._client_budget import BudgetCalls
from dpnode.sdk._client_search import SearchCalls
from dpnode.sdk._client_uploads import (
    _MANIFEST_KEY,
    CHUNK_BYTES,
    CHUNKED_ABOVE,
    FRAME_TYPE,
    UploadCalls,
)
from dpnode.sdk._display import AuditLog, Columns
from dpnode.sdk._exceptions import (
    DatabaseBusyError,
    DPNodeError,
    InvalidRequestError,
    NodeBusyError,
    NodeUnreachableError,
    NotFoundError,
    PublishInProgressError,
    PublishLostError,
    UnknownStructureError,
    raise_for_error,
)
from dpnode.sdk._handles import AuditEvent, User
from dpnode.sdk._progress import _PUBLISH_BAR, _progress_bar, _wants_progress

if TYPE_CHECKING:
    from dpnode.sdk.query import QueryResult

__all__ = ["CHUNKED_ABOVE", "CHUNK_BYTES", "FRAME_TYPE", "Client", "_wants_progress"]

API_PREFIX = "/api/v1"
#: Ends of addresses that are a page of a node rather than the node (the SDK adds the prefix).
_NOT_THE_ROOT = (API_PREFIX, "/console", "/docs")


def node_url(url: str) -> str:
    """A node's root address, as ``dpnode serve`` prints it.

    >>> node_url("http://127.0.0.1:8000/")
    'http://127.0.0.1:8000'
    >>> try:
    ...     node_url("http://127.0.0.1:8000/api/v1")
    ... except InvalidRequestError as exc:
    ...     print(str(exc).split(": ")[1])
    use 'http://127.0.0.1:8000' (the SDK adds /api/v1 itself)

    Raises:
        InvalidRequestError: the address ends with the API's prefix, ``/console`` or ``/docs``.
    """
    root = url.rstrip("/")
    for page in _NOT_THE_ROOT:
        if root.endswith(page):
            raise InvalidRequestError(
                f"{url!r} is a page of the node, not its address: use "
                f"{root.removesuffix(page)!r} (the SDK adds {API_PREFIX} itself)"
            )
    return root


#: how many /sensitivity answers a client keeps (see Client.sensitivity_of_frame)
KEPT_SENSITIVITIES = 256


class Client(SearchCalls, BudgetCalls, UploadCalls):
    """A session with one node.

    Args:
        url: the node's base URL, e.g. ``"http://127.0.0.1:8000"``.
        token: an access token (``login`` fetches one).
        transport: an httpx transport, e.g. to talk to an in-process app in tests.
        timeout: seconds to wait for the node.
        publish_retries: how many times a publish that got no answer (a network error, a
            timeout) or was still running on the node is sent again, with the same
            idempotency key: the node answers a retry with the first answer, charged once.
        retry_backoff: seconds before the first retry; doubled before each next one.
        busy_retries: how many times a request the node answered ``503`` (too busy: it did
            nothing with it) is sent again, each after the node's ``Retry-After`` or the
            backoff, whichever is longer (a publish keeps its idempotency key, so it is
            charged once). Then :class:`NodeBusyError` is raised.
        upload_retries: how many times a chunk of a chunked upload is sent again after a
            lost connection (from where the node stands: nothing is sent twice).
        publish_wait: seconds to wait, polling its state, for a publish the node says is
            still running (charged, being evaluated) before :class:`PublishInProgressError`.
        progress: show a bar (tqdm) for publishes that take longer than ``progress_after``
            seconds and for chunked uploads; by default in a terminal or a notebook.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 120.0,
        publish_retries: int = 3,
        retry_backoff: float = 0.5,
        busy_retries: int = 5,
        upload_retries: int = 5,
        publish_wait: float = 3600.0,
        progress: bool | None = None,
    ) -> None:
        self.url = node_url(url)
        #: the node's name in a network's directory (set by ``sdk.network(...).login``)
        self.name: str | None = None
        self.token = token
        self.expires_at: datetime | None = None
        self._http = httpx.Client(
            base_url=self.url + API_PREFIX, transport=transport, timeout=timeout
        )
        self.publish_retries = publish_retries
        self.upload_retries = upload_retries
        self.retry_backoff = retry_backoff
        self.busy_retries = busy_retries
        self.publish_wait = publish_wait
        self.progress = progress
        #: seconds a publish runs before its bar shows
        self.progress_after = 2.0
        #: seconds between two polls of a running publish's state
        self.poll_interval = 1.0
        #: digests of the graph headers this node has accepted from us (see _post_graph)
        self._structures_sent: set[bytes] = set()
        #: the node's free /sensitivity answers kept by request (see sensitivity_of_frame)
        self._sensitivities: OrderedDict[bytes, dict[str, Any]] = OrderedDict()

    # -- plumbing ---------------------------------------------------------------------------

    def _request(
        self, method: str, path: str, *, repeatable: bool | None = None, **kwargs: Any
    ) -> httpx.Response:
        """Send a request; while the node answers 503 (busy), wait and send it again.

        ``overloaded`` means the node did nothing with the request: any request is resent.
        ``database_busy`` means it did not complete: only a ``repeatable`` one is resent
        (default: reads; a publish under its idempotency key says so).
        """
        if repeatable is None:
            repeatable = method in ("GET", "HEAD")
        attempt = 0
        while True:
            try:
                return self._send(method, path, **kwargs)
            except NodeBusyError as exc:
                resend = repeatable or not isinstance(exc, DatabaseBusyError)
                if not resend or attempt >= self.busy_retries:
                    raise
                time.sleep(_busy_wait(exc.retry_after, self.retry_backoff, attempt))
                attempt += 1

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}))
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = self._http.request(method, path, headers=headers, **kwargs)
        except httpx.TransportError as exc:
            raise NodeUnreachableError(f"cannot reach the node at {self.url}: {exc}") from exc
        raise_for_error(response)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _download_frame(self, path: str) -> Columns:
        """A downloaded frame's arrays, in the order its manifest lists them (the frame's own
        header keeps no order); ``synthetic``: a mock's provenance, if the manifest has one."""
        manifest, arrays = _read_frame(self._request("GET", path).content)
        order = [name for name in manifest.get("columns", ()) if name in arrays]
        order += [name for name in arrays if name not in order]
        columns = Columns({name: arrays[name] for name in order})
        columns.synthetic = manifest.get("synthetic")
        return columns

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<dpnode Client {self.url}>"

    # -- session ----------------------------------------------------------------------------

    def login(self, email: str, password: str) -> Client:
        """Fetch an access token; raises ``AuthenticationError`` on bad credentials."""
        try:
            body = self._json("POST", "/auth/login", json={"email": email, "password": password})
        except DPNodeError as exc:
            if exc.status != 404:
                raise
            raise NotFoundError(
                f"nothing answers {self.url}{API_PREFIX}/auth/login ({exc}): is {self.url!r} "
                "the node's address? Give its root, as `dpnode serve` prints it, such as "
                "http://127.0.0.1:8000",
                status=404,
            ) from exc
        self.token = body["access_token"]
        self.expires_at = datetime.fromisoformat(body["expires_at"])
        return self

    def me(self) -> User:
        return _user(self._json("GET", "/users/me"))

    def version(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/version")
        return result

    def sql(
        self,
        statement: str,
        *,
        epsilon: float,
        delta: float | None = None,
        description: str = "",
    ) -> QueryResult:
        """One SQL SELECT of aggregates through ``ds.query()``, published (docs/statistics.md).
        ``description``: what it is for, shown to an admin who approves it (as for
        ``publish``)."""
        from dpnode.sdk.query.sql import publish_sql

        return publish_sql(self, statement, epsilon=epsilon, delta=delta, description=description)

    # -- publishing -------------------------------------------------------------------------

    def publish_frame(
        self,
        frame: bytes,
        *,
        epsilon: float,
        delta: float | None = None,
        run_id: int | None = None,
        idempotency_key: str | None = None,
        description: str = "",
    ) -> tuple[list[npt.NDArray[Any]], dict[str, Any]]:
        """Send one graph (engine wire frame) and get its noised outputs and the receipt.

        This is the one request behind ``RemoteTensor.publish``; most code never calls it.
        ``run_id``: the planned training run this publish is a step of (:meth:`plan_run`).
        ``description``: what it is for (at most 500 characters), shown to the admin who
        approves it and kept in the ledger row.

        Every publish carries an idempotency key (``idempotency_key``, default a fresh
        random one). Without an answer (a network error, a timeout) it is sent again with
        the same key, up to ``publish_retries`` times: the node answers a copy of a request
        it already answered with that answer, charged once.

        Raises:
            BudgetExceededError: the release does not fit your budget (nothing released).
            GraphError: the node refused the computation (the message names the op).
            NodeUnreachableError: no answer after the retries; the publish may or may not
                have run, and calling again with ``idempotency_key=err.idempotency_key``
                is safe (its answer, charged once).
            PublishInProgressError: the node still runs the publish after the retries;
                call again with the same key later.
        """
        params: dict[str, Any] = {"epsilon": epsilon}
        if delta is not None:
            params["delta"] = delta
        if run_id is not None:
            params["run"] = run_id
        if description:
            params["description"] = description
        key = uuid.uuid4().hex if idempotency_key is None else idempotency_key
        response = self._post_publish(frame, params, key)
        manifest, arrays = _read_frame(response.content)
        outputs = [arrays[f"output/{i}"] for i in range(len(arrays))]
        return outputs, dict(manifest["receipt"])

    def sensitivity_of_frame(
        self,
        frame: bytes,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        keep: bool = False,
    ) -> dict[str, Any]:
        """Sensitivity of a graph's outputs (and the noise scale for ``epsilon``): free.

        ``keep``: the answer depends only on the frame and its datasets' public metadata
        (no model weights, which an owner may replace), which never changes once stored,
        under ids never reused: it is kept (the last :data:`KEPT_SENSITIVITIES`), and the
        same question again is answered here, without a request (the query builder asks
        one before each count). A refusal is never kept.
        """
        key = None
        if keep:
            key = hashlib.blake2b(frame, digest_size=32)
            key.update(repr((epsilon, delta)).encode())
            kept = self._sensitivities.get(key.digest())
            if kept is not None:
                self._sensitivities.move_to_end(key.digest())
                return copy.deepcopy(kept)
        params: dict[str, Any] = {}
        if epsilon is not None:
            params["epsilon"] = epsilon
        if delta is not None:
            params["delta"] = delta
        result: dict[str, Any] = self._post_graph("/sensitivity", frame, params).json()
        if key is not None:
            self._sensitivities[key.digest()] = copy.deepcopy(result)
            while len(self._sensitivities) > KEPT_SENSITIVITIES:
                self._sensitivities.popitem(last=False)
        return result

    def publish_state(self, key: str) -> str:
        """Where your publish under idempotency ``key`` stands on the node: ``"running"``
        (charged, being evaluated), ``"answered"`` (publish again with the same key to
        get its answer, charged once) or ``"lost"`` (charged, and the node process
        computing it stopped before storing its answer: it is not released again).

        Raises:
            NotFoundError: nothing was charged under ``key`` (not sent yet, still being
                decided, refused, or expired).
        """
        state: str = self._json("GET", f"/publish/keys/{quote(key, safe='')}")["state"]
        return state

    def _post_publish(self, frame: bytes, params: dict[str, Any], key: str) -> httpx.Response:
        """POST a publish; past ``progress_after`` seconds, show a bar with its state.

        The request runs in a thread; this one polls the key's state for the bar.
        """
        if not _wants_progress(self.progress):
            return self._send_publish(frame, params, key)
        pool = ThreadPoolExecutor(1, thread_name_prefix="dpnode-publish")
        try:
            sent = pool.submit(self._send_publish, frame, params, key)
            with contextlib.suppress(FutureTimeout):
                return sent.result(timeout=self.progress_after)
            bar = _progress_bar(None, True, desc="publish", unit="s", bar_format=_PUBLISH_BAR)
            try:
                while True:
                    bar.set_postfix_str(self._state_shown(key))  # and the time, refreshed
                    with contextlib.suppress(FutureTimeout):
                        return sent.result(timeout=self.poll_interval)
            finally:
                bar.close()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _state_shown(self, key: str) -> str:
        try:
            state = self.publish_state(key)
        except NotFoundError:
            return "being decided"
        except DPNodeError:
            return "waiting for the node"
        return {"running": "charged, evaluating", "lost": "lost by the node"}.get(state, state)

    def _send_publish(self, frame: bytes, params: dict[str, Any], key: str) -> httpx.Response:
        """POST a publish, sending it again with the same key while it gets no answer, and
        waiting (polling its state) while the node says it is still running."""
        headers = {"Idempotency-Key": key}
        attempts = 1 + max(0, self.publish_retries)
        attempt = 0
        while True:
            try:
                return self._post_graph("/publish", frame, params, headers)
            except PublishInProgressError as exc:
                exc.idempotency_key = key
                if not self._wait_answered(key):
                    raise
                continue  # answered, lost or gone: the same key is told which
            except PublishLostError as exc:
                exc.idempotency_key = key
                raise
            except NodeUnreachableError as exc:
                attempt += 1
                if attempt >= attempts:
                    raise NodeUnreachableError(
                        f"no answer from the node at {self.url} after {attempts} attempts "
                        f"({exc.detail}): the publish may or may not have run; publishing "
                        f"again with idempotency_key={key!r} is safe: if it ran, you get its "
                        "answer, charged once",
                        idempotency_key=key,
                    ) from exc
            time.sleep(self.retry_backoff * 2 ** (attempt - 1))

    def _wait_answered(self, key: str) -> bool:
        """Poll ``key``'s publish until it is no longer running; False after ``publish_wait``."""
        deadline = time.monotonic() + self.publish_wait
        while time.monotonic() < deadline:
            try:
                if self.publish_state(key) != "running":
                    return True
            except NotFoundError:
                return True  # purged, or never charged: sent again, it is decided again
            except (NodeUnreachableError, NodeBusyError):
                pass  # no state this time: ask again until the deadline
            time.sleep(min(self.poll_interval, max(0.0, deadline - time.monotonic())))
        return False

    def _post_graph(
        self,
        path: str,
        frame: bytes,
        params: dict[str, Any],
        extra_headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """POST a graph frame; once the node has its structure, send only the constants.

        A training loop records the same structure every step: the first request carries
        the whole frame, later ones a 36-byte reference plus the new constants. A node
        that lost the structure (restart, eviction) answers ``unknown_structure`` before
        doing anything, and the frame is sent whole again.
        """
        headers = {"Content-Type": "application/octet-stream", **(extra_headers or {})}
        digest = structures.header_digest(frame)  # None: not a frame, the node says why
        if digest is not None and digest in self._structures_sent:
            body = structures.reference(digest, structures.split(frame)[1])
            try:
                return self._request(
                    "POST", path, content=body, params=params, headers=headers, repeatable=True
                )
            except UnknownStructureError:
                self._structures_sent.discard(digest)
        # repeatable: a publish carries its idempotency key, a sensitivity changes nothing
        response = self._request(
            "POST", path, content=frame, params=params, headers=headers, repeatable=True
        )
        if digest is not None:
            self._structures_sent.add(digest)
        return response

    # -- administration ---------------------------------------------------------------------

    def create_user(self, email: str, password: str, role: str = "data_scientist") -> User:
        """Create an account (admins: any role; data owners: data scientists)."""
        body = {"email": email, "password": password, "role": role}
        return _user(self._json("POST", "/users", json=body))

    def users(self) -> list[User]:
        return [_user(u) for u in self._json("GET", "/users")]

    def update_user(
        self,
        user: int | str,
        *,
        role: str | None = None,
        active: bool | None = None,
        password: str | None = None,
    ) -> User:
        """Change a user's role, active flag or password (admins). ``user``: id or email."""
        user_id = user if isinstance(user, int) else self._user_id(user)
        changes = {"role": role, "is_active": active, "password": password}
        body = {k: v for k, v in changes.items() if v is not None}
        return _user(self._json("PATCH", f"/users/{user_id}", json=body))

    def _user_id(self, email: str) -> int:
        wanted = email.strip().lower()
        for u in self.users():
            if u.email == wanted:
                return u.id
        raise DPNodeError(f"no user with email {email}")

    def audit(
        self,
        *,
        action: str | None = None,
        actor: int | str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> AuditLog[AuditEvent]:
        """The audit log, newest first (admins): optionally one ``action`` (e.g.
        ``"privacy.charge"``, ``"policy.apply"``) or one ``actor`` (id or email);
        ``before_id`` pages backwards. A list with ``.to_pandas()``."""
        params: dict[str, Any] = {"limit": limit}
        if action:
            params["action"] = action
        if actor is not None:
            params["actor_id"] = actor if isinstance(actor, int) else self._user_id(actor)
        if before_id is not None:
            params["before_id"] = before_id
        return AuditLog(
            AuditEvent(
                id=e["id"],
                at=datetime.fromisoformat(e["at"]),
                actor_email=e["actor_email"],
                action=e["action"],
                target_type=e["target_type"],
                target_id=e["target_id"],
                detail=e["detail"],
            )
            for e in self._json("GET", "/audit", params=params)
        )


def _busy_wait(retry_after: int | None, backoff: float, attempt: int) -> float:
    """Seconds to wait before resending a request the node was too busy for: its
    ``Retry-After`` or the backoff, whichever is longer, stretched by up to a quarter at
    random so that clients turned away together do not all return together.

    >>> 1.0 <= _busy_wait(1, 0.5, 0) <= 1.25, 4.0 <= _busy_wait(None, 0.5, 3) <= 5.0
    (True, True)
    """
    wait: float = max(float(retry_after or 0), backoff * 2**attempt)
    return wait * (1 + random.random() / 4)


def _read_frame(data: bytes) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """A tensor frame's manifest and arrays."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    manifest = json.loads(header.get("__metadata__", {}).get(_MANIFEST_KEY, "{}"))
    return manifest, dict(load(data))


def _user(body: dict[str, Any]) -> User:
    return User(
        id=body["id"],
        email=body["email"],
        role=body["role"],
        is_active=body["is_active"],
        created_at=datetime.fromisoformat(body["created_at"]),
    )

"""The node client: login, search, uploads and administration over HTTP."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import random
import struct
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx
import numpy as np
import numpy.typing as npt
from safetensors.numpy import load, save

from dpnode.core import structures
from dpnode.core.errors import UploadRejectedError as NodeUploadRejected
from dpnode.core.ingest import (
    arrow_source,
    chunks_of,
    is_arrow_like,
    memory_source,
    session_request,
)
from dpnode.sdk._budget import (
    BudgetGrant,
    BudgetRequest,
    BudgetStatus,
    LedgerEntry,
    PolicyRevision,
    PublishApproval,
    TrainingRunPlan,
)
from dpnode.sdk._display import AuditLog, Columns, Grants, Ledger
from dpnode.sdk._exceptions import (
    ConflictError,
    DatabaseBusyError,
    DPNodeError,
    NodeBusyError,
    NodeUnreachableError,
    NotFoundError,
    PublishInProgressError,
    PublishLostError,
    UnknownStructureError,
    UploadOffsetError,
    UploadRejectedError,
    error_for,
)
from dpnode.sdk._handles import AuditEvent, DatasetHandle, ModelHandle, User
from dpnode.sdk._tables import columns_of, to_numpy

API_PREFIX = "/api/v1"
FRAME_TYPE = "application/vnd.dpnode.tensors"
_MANIFEST_KEY = "dpnode"
#: Tables larger than this (bytes) are uploaded in chunks unless ``chunked=False``.
CHUNKED_ABOVE = 256 * 1024 * 1024
#: The default size of one chunk of a chunked upload.
CHUNK_BYTES = 16 * 1024 * 1024


def _stream_size(request: Mapping[str, Any]) -> int:
    """The bytes of an upload session's stream, from the request that opens it."""
    rows = {"data": request["rows"], "mock": request.get("mock_rows") or 0}
    return sum(
        rows[t["name"].split("/")[0]] * np.dtype(t["dtype"]).itemsize * int(np.prod(t["shape"]))
        for t in request["tensors"]
    )


def _table_bytes(columns: Mapping[str, Any]) -> int:
    return sum(v.nbytes if hasattr(v, "nbytes") else 16 * len(v) for v in columns.values())


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


#: a publish's bar: how long it has run and its state on the node (no total: a publish
#: reports no progress of its own, which could depend on the data)
_PUBLISH_BAR = "{desc}: {elapsed} {postfix}"


def _wants_progress(progress: bool | None) -> bool:
    """``progress``, or by default: in a terminal or a notebook (a Jupyter kernel)."""
    if progress is None:
        return sys.stderr.isatty() or "ipykernel" in sys.modules
    return progress


def _progress_bar(total: int | None, progress: bool | None, **options: Any) -> Any:
    """A tqdm bar (in bytes unless ``options`` say otherwise), or a stand-in when it is off
    (or tqdm is not installed)."""
    if not _wants_progress(progress):
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _NoBar()
    options = {"unit": "B", "unit_scale": True, "unit_divisor": 1024, "desc": "upload"} | options
    return tqdm(total=total, **options)


def _frame(arrays: Mapping[str, npt.NDArray[Any]], manifest: Mapping[str, Any]) -> bytes:
    contiguous = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    return save(contiguous, metadata={_MANIFEST_KEY: json.dumps(manifest)})


def _split(columns: Mapping[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    arrays = {f"{prefix}/{k}": v for k, v in columns.items() if not isinstance(v, list)}
    strings = {k: v for k, v in columns.items() if isinstance(v, list)}
    return arrays, strings


class Client:
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
        self.url = url.rstrip("/")
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
        if response.is_error:
            body = None
            try:
                body = response.json()
                code, detail = body.get("error"), str(body.get("detail", response.text))
            except (ValueError, AttributeError):
                body, code, detail = None, None, response.text or response.reason_phrase
            raise error_for(response.status_code, code, detail, body, response.headers)
        return response

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._request(method, path, **kwargs).json()

    def _download_frame(self, path: str) -> Columns:
        return Columns(load(self._request("GET", path).content))

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
        body = self._json("POST", "/auth/login", json={"email": email, "password": password})
        self.token = body["access_token"]
        self.expires_at = datetime.fromisoformat(body["expires_at"])
        return self

    def me(self) -> User:
        return _user(self._json("GET", "/users/me"))

    def version(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/version")
        return result

    # -- discovery --------------------------------------------------------------------------

    def search(
        self,
        tags: Iterable[str] = (),
        text: str | None = None,
        kind: Literal["any", "dataset", "model"] = "any",
    ) -> list[DatasetHandle | ModelHandle]:
        """Datasets (first) and models carrying all of ``tags`` and matching ``text``."""
        params: dict[str, Any] = {"tags": list(_tags(tags)), "kind": kind}
        if text:
            params["text"] = text
        body = self._json("GET", "/search", params=params)
        found: list[DatasetHandle | ModelHandle] = [
            DatasetHandle.from_json(self, d) for d in body["datasets"]
        ]
        found += [ModelHandle.from_json(self, m) for m in body["models"]]
        return found

    def datasets(self, tags: Iterable[str] = (), text: str | None = None) -> list[DatasetHandle]:
        params: dict[str, Any] = {"tags": list(_tags(tags))}
        if text:
            params["text"] = text
        return [
            DatasetHandle.from_json(self, d) for d in self._json("GET", "/datasets", params=params)
        ]

    def dataset(self, ref: int | str) -> DatasetHandle:
        """A dataset by id or name."""
        return DatasetHandle.from_json(self, self._json("GET", f"/datasets/{ref}"))

    def models(self, tags: Iterable[str] = (), text: str | None = None) -> list[ModelHandle]:
        params: dict[str, Any] = {"tags": list(_tags(tags))}
        if text:
            params["text"] = text
        return [ModelHandle.from_json(self, m) for m in self._json("GET", "/models", params=params)]

    def model(self, ref: int | str) -> ModelHandle:
        """A model by id or name."""
        return ModelHandle.from_json(self, self._json("GET", f"/models/{ref}"))

    # -- uploads (data owners) --------------------------------------------------------------

    def upload_dataset(
        self,
        name: str,
        data: Any,
        *,
        bounds: Mapping[str, tuple[float, float]] | None = None,
        tags: Iterable[str] = (),
        description: str = "",
        categories: Mapping[str, Sequence[str]] | None = None,
        subject_id: str | None = None,
        mock: Any = None,
        clamp: bool | Sequence[str] = False,
        fill: Mapping[str, float] | None = None,
        columns: Sequence[str] | None = None,
        chunked: bool | None = None,
        chunk_bytes: int = CHUNK_BYTES,
        progress: bool | None = None,
        resume: str | None = None,
    ) -> DatasetHandle:
        """Upload a dataset; the node checks it against what you declare here.

        Args:
            name: unique dataset name.
            data: a pandas or Polars DataFrame, a ``pyarrow.Table`` or ``RecordBatchReader``,
                the path of a Parquet, Arrow IPC (``.arrow``/``.feather``) or CSV file, a
                dict of columns (1-D, or N-D with rows first), a structured array, or a 2-D
                array (name its columns with ``columns=``).
            bounds: public (low, high) for every numeric column: the privacy contract.
            tags: for search.
            categories: the public category list of each string column.
            subject_id: a column whose equal values mark rows of one person.
            mock: fake data with the same columns, for dry runs (downloadable by anyone).
            clamp: clip out-of-bounds values (True, or a list of columns) instead of refusing.
            fill: replacement for NaN/inf per column instead of refusing.
            columns: names for the columns of a plain 2-D array.
            chunked: send the table in resumable chunks (see ``docs/datasets.md``); by
                default, for Arrow data and files (read batch by batch) and for tables over
                ``CHUNKED_ABOVE`` bytes.
            chunk_bytes: the size of each chunk.
            progress: show a progress bar (tqdm) while sending chunks; by default the
                client's ``progress`` (in a terminal or a notebook).
            resume: the ``upload_id`` of a chunked upload that failed (the exception carries
                it) to go on with, with the same data and declarations: only the bytes the
                node does not hold yet are sent.

        Raises:
            UploadRejectedError: the data breaks the declarations; the message says where.
            PermissionDeniedError: data scientists cannot upload.
        """
        manifest: dict[str, Any] = {
            "name": name,
            "description": description,
            "tags": list(_tags(tags)),
            "bounds": {k: list(v) for k, v in (bounds or {}).items()},
            "categories": {k: list(v) for k, v in (categories or {}).items()},
            "clamp": clamp if isinstance(clamp, bool) else list(clamp),
            "fill": dict(fill or {}),
            "subject_id": subject_id,
        }
        arrow = is_arrow_like(data)
        try:  # reading Arrow data may find a column dpnode cannot store
            real = None if arrow else columns_of(data, columns)
            fake = columns_of(mock, columns) if mock is not None else None
        except NodeUploadRejected as exc:
            raise UploadRejectedError(exc.detail) from exc
        if chunked is None:
            chunked = arrow or resume is not None or _table_bytes(real or {}) > CHUNKED_ABOVE
        if chunked:
            return self._upload_chunked(
                manifest,
                data if arrow else real,
                fake,
                chunk_bytes=chunk_bytes,
                progress=progress,
                resume=resume,
            )
        if real is None:
            try:
                real = columns_of(data, columns)
            except NodeUploadRejected as exc:
                raise UploadRejectedError(exc.detail) from exc
        arrays, strings = _split(real, "data")
        manifest |= {"columns": list(real), "strings": strings}
        if fake is not None:
            mock_arrays, mock_strings = _split(fake, "mock")
            arrays |= mock_arrays
            manifest |= {"mock_columns": list(fake), "mock_strings": mock_strings}
        body = _frame(arrays, manifest)
        created = self._json(
            "POST", "/datasets", content=body, headers={"Content-Type": FRAME_TYPE}
        )
        return DatasetHandle.from_json(self, created)

    def _upload_chunked(
        self,
        manifest: dict[str, Any],
        data: Any,
        mock: Mapping[str, Any] | None,
        *,
        chunk_bytes: int,
        progress: bool | None,
        resume: str | None,
    ) -> DatasetHandle:
        categories, subject_id = manifest["categories"], manifest["subject_id"]
        source = None
        try:
            try:
                if isinstance(data, Mapping):
                    source = memory_source(data, categories, subject_id)
                else:
                    source = arrow_source(data, categories, subject_id)
                fake = memory_source(mock, categories, subject_id) if mock is not None else None
            except NodeUploadRejected as exc:  # found while reading, before sending
                raise UploadRejectedError(exc.detail) from exc
            request, stream = session_request(manifest, source, fake)
            if resume is None:
                created = self._json("POST", "/uploads", json=request)
            else:
                created = self._retrying(lambda: self._json("GET", f"/uploads/{resume}"))
                if created["size"] != _stream_size(request):
                    raise DPNodeError(
                        f"upload {resume} expects {created['size']} bytes, this table makes "
                        f"{_stream_size(request)}: resume with the same data and declarations"
                    )
            upload_id = created["id"]
            try:
                self._send_chunks(
                    upload_id, stream, created["size"], chunk_bytes, progress, created["received"]
                )
                body = self._retrying(lambda: self._json("POST", f"/uploads/{upload_id}/finalize"))
            except NodeUploadRejected as exc:  # a later batch broke the contract: give up
                with contextlib.suppress(DPNodeError):
                    self._request("DELETE", f"/uploads/{upload_id}")
                raise UploadRejectedError(exc.detail) from exc
            except NodeUnreachableError as exc:
                exc.upload_id = upload_id  # for upload_dataset(..., resume=upload_id)
                raise
        finally:
            if source is not None and source.cleanup is not None:
                source.cleanup()
        return DatasetHandle.from_json(self, body)

    def uploads(self) -> list[dict[str, Any]]:
        """Your open upload sessions (``id``, ``received``, ``size``, ``expires_at``, ...)."""
        found: list[dict[str, Any]] = self._json("GET", "/uploads")
        return found

    def delete_upload(self, upload_id: str) -> None:
        """Abandon an upload session and free the node's disk."""
        self._request("DELETE", f"/uploads/{upload_id}")

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """``call``, again after a lost connection (``upload_retries`` times, backing off)."""
        for attempt in itertools.count():
            try:
                return call()
            except NodeUnreachableError:
                if attempt >= self.upload_retries:
                    raise
                time.sleep(self.retry_backoff * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send_chunks(
        self,
        upload_id: str,
        pieces: Iterable[bytes],
        size: int,
        chunk_bytes: int,
        progress: bool | None,
        start: int = 0,
    ) -> None:
        """Send a stream in chunks from ``start`` (bytes before it are skipped); after a lost
        connection, resume where the node stands."""
        bar = _progress_bar(size, self.progress if progress is None else progress)
        bar.update(start)
        offset = start

        def send(chunk: bytes) -> None:
            nonlocal offset
            digest = hashlib.sha256(chunk).hexdigest()
            for attempt in itertools.count():
                try:
                    self._request(
                        "PUT",
                        f"/uploads/{upload_id}",
                        params={"offset": offset},
                        content=chunk,
                        headers={"X-Content-SHA256": digest},
                    )
                    break
                except (NodeUnreachableError, ConflictError) as exc:
                    # Lost (or still running) on the node: ask where the stream stands.
                    busy = isinstance(exc, UploadOffsetError) or "busy" in exc.detail
                    if isinstance(exc, ConflictError) and not busy:
                        raise
                    if attempt >= self.upload_retries:
                        raise
                    time.sleep(self.retry_backoff * 2**attempt)
                    status = self._retrying(lambda: self._json("GET", f"/uploads/{upload_id}"))
                    received = int(status["received"])
                    if not offset <= received <= offset + len(chunk):
                        raise DPNodeError(
                            f"the node holds {received} bytes of upload {upload_id}, but "
                            f"{offset} were acknowledged: start the upload again"
                        ) from exc
                    if received == offset + len(chunk):  # it arrived; the answer did not
                        break
                    # Part of it may have arrived: send the rest only.
                    chunk = chunk[received - offset :]
                    bar.update(received - offset)
                    offset = received
                    digest = hashlib.sha256(chunk).hexdigest()
            bar.update(len(chunk))
            offset += len(chunk)

        try:
            skipped = 0
            for chunk in chunks_of(pieces, chunk_bytes):
                if skipped + len(chunk) <= start:  # the node holds it already
                    skipped += len(chunk)
                    continue
                chunk = chunk[start - skipped :] if skipped < start else chunk
                skipped = start
                send(chunk)
        finally:
            bar.close()

    def upload_model(
        self,
        name: str,
        weights: Any,
        *,
        tags: Iterable[str] = (),
        description: str = "",
        public: bool = False,
        architecture: str | bytes | Path | None = None,
    ) -> ModelHandle:
        """Upload a model's weights (a ``state_dict``, a module, or a dict of arrays).

        Args:
            architecture: an optional file describing the model (a path, or its text/bytes);
                the node stores it and never runs it.
            public: whether anyone may download the weights; private weights are usable
                only as remote tensors.
        """
        if hasattr(weights, "state_dict"):
            weights = weights.state_dict()
        arrays = {f"weight/{k}": to_numpy(v, f"weight {k!r}") for k, v in dict(weights).items()}
        manifest: dict[str, Any] = {
            "name": name,
            "description": description,
            "tags": list(_tags(tags)),
            "public": public,
            "tensors": [k.split("/", 1)[1] for k in arrays],
        }
        if architecture is not None:
            filename, raw = _architecture(architecture)
            arrays["architecture"] = np.frombuffer(raw, dtype=np.uint8)
            manifest["architecture_filename"] = filename
        body = _frame(arrays, manifest)
        created = self._json("POST", "/models", content=body, headers={"Content-Type": FRAME_TYPE})
        return ModelHandle.from_json(self, created)

    def delete_dataset(self, ref: int | str) -> None:
        self._request("DELETE", f"/datasets/{ref}")

    def delete_model(self, ref: int | str) -> None:
        self._request("DELETE", f"/models/{ref}")

    # -- publishing -------------------------------------------------------------------------

    def publish_frame(
        self,
        frame: bytes,
        *,
        epsilon: float,
        delta: float | None = None,
        run_id: int | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[list[npt.NDArray[Any]], dict[str, Any]]:
        """Send one graph (engine wire frame) and get its noised outputs and the receipt.

        This is the one request behind ``RemoteTensor.publish``; most code never calls it.
        ``run_id``: the planned training run this publish is a step of (:meth:`plan_run`).

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
        key = uuid.uuid4().hex if idempotency_key is None else idempotency_key
        response = self._post_publish(frame, params, key)
        manifest, arrays = _read_frame(response.content)
        outputs = [arrays[f"output/{i}"] for i in range(len(arrays))]
        return outputs, dict(manifest["receipt"])

    def sensitivity_of_frame(
        self, frame: bytes, *, epsilon: float | None = None, delta: float | None = None
    ) -> dict[str, Any]:
        """Sensitivity of a graph's outputs (and the noise scale for ``epsilon``): free."""
        params: dict[str, Any] = {}
        if epsilon is not None:
            params["epsilon"] = epsilon
        if delta is not None:
            params["delta"] = delta
        result: dict[str, Any] = self._post_graph("/sensitivity", frame, params).json()
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

    # -- privacy budget ---------------------------------------------------------------------

    def budget(self, *, user_id: int | None = None) -> BudgetStatus:
        """Your budget: total, spent and remaining (admins: anyone's, by ``user_id``)."""
        params = {"user_id": user_id} if user_id is not None else {}
        status = BudgetStatus.from_json(self._json("GET", "/budget", params=params))
        return dataclasses.replace(status, _ledger=lambda: self._window_ledger(status, user_id))

    def _window_ledger(self, status: BudgetStatus, user_id: int | None) -> list[LedgerEntry]:
        """The charges of ``status``'s renewal window (all of them when budgets never renew),
        oldest first, paging back through the ledger."""
        entries: list[LedgerEntry] = []
        before: int | None = None
        while True:
            page = self.ledger(user_id=user_id, before_id=before, limit=1000)
            entries += page
            inside = status.period_start is None or (page and page[-1].at >= status.period_start)
            if len(page) < 1000 or not inside:
                break
            before = page[-1].id
        start = status.period_start
        return [e for e in reversed(entries) if start is None or e.at >= start]

    def ledger(
        self,
        *,
        user_id: int | None = None,
        user: int | str | None = None,
        dataset: int | str | None = None,
        everyone: bool = False,
        before_id: int | None = None,
        limit: int = 100,
    ) -> Ledger[LedgerEntry]:
        """Charges, newest first: yours, or (admins) one user's (``user``: id or email) or
        ``everyone``'s; ``dataset`` (id or name) keeps those that read it. Each entry names
        the policy revision that allowed it. A list, shown as a table in a notebook;
        ``.to_pandas()`` makes a DataFrame."""
        params: dict[str, Any] = {"limit": limit}
        if user is not None:
            user_id = user if isinstance(user, int) else self._user_id(user)
        if user_id is not None:
            params["user_id"] = user_id
        if everyone:
            params["all_users"] = True
        if dataset is not None:
            params["dataset_id"] = dataset if isinstance(dataset, int) else self.dataset(dataset).id
        if before_id is not None:
            params["before_id"] = before_id
        return Ledger(LedgerEntry.from_json(e) for e in self._json("GET", "/ledger", params=params))

    def request_budget(self, *, epsilon: float, delta: float = 0.0, reason: str) -> BudgetRequest:
        """Ask the node's admins for more budget, saying why; see ``budget_requests()`` for
        the answer. An approval adds to your allocation from then on.

        Raises:
            InvalidRequestError: a negative or non-finite amount, or no reason.
        """
        body = {"epsilon": epsilon, "delta": delta, "reason": reason}
        return BudgetRequest.from_json(self._json("POST", "/budget/requests", json=body))

    def budget_requests(
        self, *, status: str | None = None, user: int | str | None = None, limit: int = 100
    ) -> list[BudgetRequest]:
        """Budget requests, newest first: yours, or (admins) everyone's or one ``user``'s;
        ``status`` is ``"pending"``, ``"approved"`` or ``"denied"``."""
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        if user is not None:
            params["user_id"] = user if isinstance(user, int) else self._user_id(user)
        rows = self._json("GET", "/budget/requests", params=params)
        return [BudgetRequest.from_json(r) for r in rows]

    def approve_budget_request(
        self,
        request_id: int,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        reason: str,
    ) -> BudgetRequest:
        """Approve a pending request (admins), granting what was asked or ``epsilon``/``delta``.

        Raises:
            ConflictError: it was already answered.
        """
        body: dict[str, Any] = {"reason": reason}  # required: the audit log says why
        if epsilon is not None:
            body["epsilon"] = epsilon
        if delta is not None:
            body["delta"] = delta
        answer = self._json("POST", f"/budget/requests/{request_id}/approve", json=body)
        return BudgetRequest.from_json(answer)

    def deny_budget_request(self, request_id: int, *, reason: str) -> BudgetRequest:
        """Deny a pending request, saying why (admins)."""
        body = {"reason": reason}
        answer = self._json("POST", f"/budget/requests/{request_id}/deny", json=body)
        return BudgetRequest.from_json(answer)

    def grant_budget(
        self, user: int | str, *, epsilon: float, delta: float = 0.0, reason: str
    ) -> BudgetGrant:
        """Add budget to a user's allocation without a request (admins). ``user``: id or email."""
        body = {"user": user, "epsilon": epsilon, "delta": delta, "reason": reason}
        return BudgetGrant.from_json(self._json("POST", "/budget/grants", json=body))

    def grants(self, *, user: int | str | None = None, limit: int = 100) -> Grants[BudgetGrant]:
        """Budget grants, newest first: yours (admins: everyone's, or one ``user``'s); a list
        with ``.to_pandas()``."""
        params: dict[str, Any] = {"limit": limit}
        if user is not None:
            params["user_id"] = user if isinstance(user, int) else self._user_id(user)
        return Grants(
            BudgetGrant.from_json(g) for g in self._json("GET", "/budget/grants", params=params)
        )

    def plan_run(
        self,
        *,
        steps: int,
        epsilon: float,
        delta: float,
        values: int,
        dataset_ids: Sequence[int] = (),
        description: str = "",
    ) -> TrainingRunPlan:
        """Plan a training run on the node before its first step; the policy judges it whole.

        ``steps`` Gaussian publishes at ``(epsilon, delta)`` each, each noising at most
        ``values`` values and reading only ``dataset_ids``. ``sdk.private_training`` calls
        this for you. Nothing is charged: each step is, when it is published with the
        returned ``run_id``.

        Raises:
            BudgetExceededError: the run's total does not fit your budget or a dataset's cap.
            PolicyRefusedError: a step is over a per-publish cap, or an admin denied the run
                (``rule`` ``"approval"``; the message quotes the admin's reason).
            ApprovalRequiredError: the run's total is above the policy's approval threshold:
                request ``approval_id`` waits for an admin; plan the same run again once it
                is approved.
        """
        body = {
            "steps": steps,
            "epsilon": epsilon,
            "delta": delta,
            "values": values,
            "dataset_ids": list(dataset_ids),
            "description": description,
        }
        return TrainingRunPlan.from_json(self._json("POST", "/publish/runs", json=body))

    def publish_approvals(
        self, *, status: str | None = None, limit: int = 100
    ) -> list[PublishApproval]:
        """Publishes and training runs that waited for an admin, newest first (yours;
        admins: everyone's)."""
        params: dict[str, Any] = {"limit": limit}
        if status is not None:
            params["status"] = status
        rows = self._json("GET", "/publish/approvals", params=params)
        return [PublishApproval.from_json(a) for a in rows]

    def approve_publish(self, approval_id: int, *, reason: str) -> PublishApproval:
        """Approve a waiting publish (admins): the user's next identical publish runs, once."""
        answer = self._json(
            "POST", f"/publish/approvals/{approval_id}/approve", json={"reason": reason}
        )
        return PublishApproval.from_json(answer)

    def deny_publish(self, approval_id: int, *, reason: str) -> PublishApproval:
        """Deny a waiting publish, saying why (admins)."""
        answer = self._json(
            "POST", f"/publish/approvals/{approval_id}/deny", json={"reason": reason}
        )
        return PublishApproval.from_json(answer)

    # -- budget policy (admins) -------------------------------------------------------------

    def policy(self) -> PolicyRevision:
        """The budget policy in force (admins)."""
        return PolicyRevision.from_json(self._json("GET", "/policy"))

    def set_policy(self, policy: str | Path | Mapping[str, Any], *, reason: str) -> PolicyRevision:
        """Apply a budget policy (admins): in force from the next publish, no restart.

        Args:
            policy: TOML text, a path to a TOML file (a ``Path``, or a one-line string
                ending in ``.toml``), or the same shape as a mapping (see
                ``dpnode/policies/default.toml`` for every key).
            reason: why, for the audit log.

        Raises:
            InvalidPolicyError: the document is malformed; the message names every bad key.
        """
        body: dict[str, Any] = {"reason": reason}
        if isinstance(policy, Mapping):
            body["document"] = dict(policy)
        elif isinstance(policy, Path) or ("\n" not in policy and policy.endswith(".toml")):
            body["toml"] = Path(policy).read_text(encoding="utf-8")  # a file name
        else:
            body["toml"] = policy
        return PolicyRevision.from_json(self._json("PUT", "/policy", json=body))

    def policy_history(self, *, limit: int = 100) -> list[PolicyRevision]:
        """Every revision of the policy, newest first (admins)."""
        rows = self._json("GET", "/policy/revisions", params={"limit": limit})
        return [PolicyRevision.from_json(r) for r in rows]

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


def _tags(tags: Iterable[str]) -> Iterable[str]:
    return [tags] if isinstance(tags, str) else tags


def _user(body: dict[str, Any]) -> User:
    return User(
        id=body["id"],
        email=body["email"],
        role=body["role"],
        is_active=body["is_active"],
        created_at=datetime.fromisoformat(body["created_at"]),
    )


def _architecture(source: str | bytes | Path) -> tuple[str, bytes]:
    if isinstance(source, bytes):
        return "architecture", source
    path = Path(source)
    if isinstance(source, Path) or (len(source) < 4096 and "\n" not in source and path.is_file()):
        return path.name, path.read_bytes()
    return "architecture.py", source.encode()

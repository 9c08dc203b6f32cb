"""The client's uploads (data owners): datasets, in one request or in resumable chunks, and
models."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import httpx
import numpy as np
import numpy.typing as npt
from safetensors.numpy import save

from dpnode.core.errors import UploadRejectedError as NodeUploadRejected
from dpnode.core.ingest import (
    arrow_source,
    chunks_of,
    is_arrow_like,
    memory_source,
    session_request,
)
from dpnode.sdk._exceptions import (
    ConflictError,
    DPNodeError,
    NodeUnreachableError,
    UploadOffsetError,
    UploadRejectedError,
)
from dpnode.sdk._handles import DatasetHandle, ModelHandle
from dpnode.sdk._progress import _progress_bar
from dpnode.sdk._tables import columns_of, to_numpy

if TYPE_CHECKING:
    from dpnode.sdk._client import Client

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


def _frame(arrays: Mapping[str, npt.NDArray[Any]], manifest: Mapping[str, Any]) -> bytes:
    contiguous = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    return save(contiguous, metadata={_MANIFEST_KEY: json.dumps(manifest)})


def _split(columns: Mapping[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    arrays = {f"{prefix}/{k}": v for k, v in columns.items() if not isinstance(v, list)}
    strings = {k: v for k, v in columns.items() if isinstance(v, list)}
    return arrays, strings


class UploadCalls:
    """:class:`~sdk.Client`'s uploads (a mixin: it sends through the client's requests)."""

    progress: bool | None
    upload_retries: int
    retry_backoff: float

    def _as_client(self) -> Client:
        """This object as what it is, a client (handles keep theirs to publish through)."""
        return cast("Client", self)

    if TYPE_CHECKING:

        def _json(self, method: str, path: str, **kwargs: Any) -> Any: ...

        def _request(
            self, method: str, path: str, *, repeatable: bool | None = None, **kwargs: Any
        ) -> httpx.Response: ...

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
        return DatasetHandle.from_json(self._as_client(), created)

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
        return DatasetHandle.from_json(self._as_client(), body)

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
        return ModelHandle.from_json(self._as_client(), created)

    def delete_dataset(self, ref: int | str) -> None:
        self._request("DELETE", f"/datasets/{ref}")

    def delete_model(self, ref: int | str) -> None:
        self._request("DELETE", f"/models/{ref}")


def _tags(tags: Iterable[str]) -> Iterable[str]:
    return [tags] if isinstance(tags, str) else tags


def _architecture(source: str | bytes | Path) -> tuple[str, bytes]:
    if isinstance(source, bytes):
        return "architecture", source
    path = Path(source)
    if isinstance(source, Path) or (len(source) < 4096 and "\n" not in source and path.is_file()):
        return path.name, path.read_bytes()
    return "architecture.py", source.encode()

"""Chunked, resumable dataset uploads: a session on disk, chunks at offsets, then finalize.

A table too big for one request travels as one byte stream, sent in chunks. The stream
is laid out in blocks of rows: for each block of ``block_rows`` rows, every column's
raw bytes for those rows, in the declared order (then the same for the mock data, if
any). A client can therefore stream a table it reads batch by batch (Parquet, Arrow,
CSV) without holding it, and the node splits each chunk into one file per column as it
arrives (positional writes), never holding more than a chunk.

The session's state lives in files under ``<data_dir>/uploads/<id>/``: the plan
(``session.json``), the bytes received so far (``received``, written after the chunk's
bytes are synced, so it never runs ahead of them) and the column files. A dropped
connection loses nothing the node acknowledged: the client asks for ``received`` and
goes on from there. Finalize (:mod:`dpnode.node.services.finalize`) holds each column to its
declared contract block by block, streams it into the blob store, and registers the
dataset; a second finalize of the same session answers the same dataset.
Sessions untouched for ``upload_session_ttl_seconds`` are removed.

Everything a session answers (offsets, sizes, refusals) is decided from what the client
sent and declared, never from values already stored.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from dpnode.core.errors import (
    ChecksumMismatchError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    QuotaExceededError,
    UploadOffsetError,
    UploadRejectedError,
)
from dpnode.node.db.models import Dataset, User
from dpnode.node.services.catalog import require_uploader
from dpnode.node.services.datasets import get_dataset
from dpnode.node.services.finalize import store_received
from dpnode.node.services.tabular import (
    STORABLE_DTYPES,
    ColumnSpec,
    check_bounds,
    check_name,
    check_undeclared,
)
from dpnode.node.storage import BlobStore

_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{24}$")
#: The smallest block a client may declare (tiny blocks would cost a loop step per row).
_MIN_BLOCK_BYTES = 64 * 1024


@dataclass(frozen=True)
class UploadLimits:
    max_elements: int
    max_columns: int
    max_session_bytes: int
    max_sessions: int
    ttl_seconds: int


@dataclass(frozen=True)
class UploadPart:
    """One tensor of the stream: ``data/<column>`` or ``mock/<column>``."""

    name: str
    dtype: str
    row_shape: list[int]

    @property
    def row_bytes(self) -> int:
        return np.dtype(self.dtype).itemsize * math.prod(self.row_shape)


@dataclass(frozen=True)
class UploadPlan:
    """What a session will register: the declarations, and the stream's layout."""

    name: str
    description: str
    tags: list[str]
    columns: list[str]
    bounds: dict[str, tuple[float, float]]
    categories: dict[str, list[str]]
    clamp: bool | list[str]
    fill: dict[str, float]
    subject_id: str | None
    rows: int
    block_rows: int
    parts: list[UploadPart]
    mock_columns: list[str] | None = None
    mock_rows: int | None = None
    user_id: int = 0
    created: float = field(default=0.0)

    @property
    def spec(self) -> ColumnSpec:
        clamp = self.clamp if isinstance(self.clamp, bool) else frozenset(self.clamp)
        return ColumnSpec(self.bounds, self.categories, clamp, self.fill, self.subject_id)

    def sections(self) -> list[tuple[int, list[UploadPart]]]:
        data = [p for p in self.parts if p.name.startswith("data/")]
        mock = [p for p in self.parts if p.name.startswith("mock/")]
        return [(self.rows, data)] + ([(self.mock_rows or 0, mock)] if mock else [])

    @property
    def size(self) -> int:
        return sum(rows * sum(p.row_bytes for p in parts) for rows, parts in self.sections())

    def pieces(self, offset: int, length: int) -> Iterator[tuple[int, int, int, int]]:
        """Where the stream's bytes ``[offset, offset + length)`` go.

        Yields ``(part index, offset in the part's file, offset in the chunk, length)``.
        """
        end = offset + length
        first_part = 0
        section_start = 0
        for rows, parts in self.sections():
            widths = [p.row_bytes for p in parts]
            block_bytes = self.block_rows * sum(widths)
            lo, hi = max(offset, section_start), min(end, section_start + rows * sum(widths))
            while lo < hi:
                pos = lo - section_start
                block = pos // block_bytes
                block_rows = min(self.block_rows, rows - block * self.block_rows)
                within_block = pos - block * block_bytes
                start = 0
                for index, width in enumerate(widths):
                    span = width * block_rows
                    if within_block < start + span:
                        within = within_block - start
                        n = min(span - within, hi - lo)
                        at = block * self.block_rows * width + within
                        yield first_part + index, at, lo - offset, n
                        lo += n
                        break
                    start += span
            first_part += len(parts)
            section_start += rows * sum(widths)


@dataclass(frozen=True)
class UploadStatus:
    id: str
    received: int
    size: int
    block_rows: int
    expires_at: float
    dataset_id: int | None = None


def _check_plan(plan: UploadPlan, limits: UploadLimits) -> None:
    if plan.rows <= 0 or (plan.mock_rows is not None and plan.mock_rows <= 0):
        raise UploadRejectedError("an upload needs a positive number of rows (and mock rows)")
    if len(plan.columns) > limits.max_columns:
        raise UploadRejectedError(
            f"a dataset may have at most {limits.max_columns} columns; this one has "
            f"{len(plan.columns)}"
        )
    names = [p.name for p in plan.parts]
    if len(names) > 2 * limits.max_columns:
        raise UploadRejectedError(f"an upload may carry at most {2 * limits.max_columns} tensors")
    if len(set(names)) != len(names):
        raise UploadRejectedError("an upload names a tensor twice")
    data = [n.removeprefix("data/") for n in names if n.startswith("data/")]
    mock = [n.removeprefix("mock/") for n in names if n.startswith("mock/")]
    if len(data) + len(mock) != len(names):
        raise UploadRejectedError("upload tensors are named data/<column> or mock/<column>")
    if any(n.startswith("mock/") for n in names[: len(data)]):
        # the stream is laid out data first (UploadPlan.sections): a mock tensor listed
        # before a data one numbered the files otherwise, and real values became the mock
        raise UploadRejectedError("list the data tensors first, then the mock tensors")
    if data != plan.columns:
        raise UploadRejectedError(
            f"the data tensors {data[:10]} must be the declared columns, in order: "
            f"{plan.columns[:10]}"
        )
    if mock and (plan.mock_rows is None or mock != (plan.mock_columns or mock)):
        raise UploadRejectedError("mock tensors need mock_rows and must follow mock_columns")
    if not mock and plan.mock_rows is not None:
        raise UploadRejectedError("mock_rows declared, but no mock tensors")
    for name in plan.columns:
        check_name("column", name)
    for name, bounds in plan.bounds.items():  # before any chunk is sent, not at finalize
        check_bounds(name, bounds)
    parts = {p.name.removeprefix("data/"): p for p in plan.parts if p.name.startswith("data/")}
    check_undeclared(
        {name: np.dtype(p.dtype) for name, p in parts.items() if p.dtype in STORABLE_DTYPES},
        plan.spec,
    )
    for part in plan.parts:
        if part.dtype not in STORABLE_DTYPES:
            raise UploadRejectedError(
                f"tensor {part.name!r} has dtype {part.dtype!r}; a chunked upload carries one "
                f"of {', '.join(sorted(STORABLE_DTYPES))} (strings as int64 category indices)"
            )
        if any(d <= 0 for d in part.row_shape):
            raise UploadRejectedError(f"tensor {part.name!r} has an empty row shape")
        rows = plan.rows if part.name.startswith("data/") else plan.mock_rows or 0
        if rows * math.prod(part.row_shape) > limits.max_elements:
            raise UploadRejectedError(
                f"tensor {part.name!r} has {rows * math.prod(part.row_shape)} elements, over "
                f"the limit of {limits.max_elements}"
            )
    widest = max(sum(p.row_bytes for p in parts) for _, parts in plan.sections())
    if plan.block_rows <= 0 or (
        plan.block_rows * widest < _MIN_BLOCK_BYTES and plan.block_rows < plan.rows
    ):
        raise UploadRejectedError(
            f"block_rows must be positive and a block at least {_MIN_BLOCK_BYTES} bytes "
            "(or all the rows)"
        )
    if plan.size > limits.max_session_bytes:
        raise PayloadTooLargeError(
            f"this upload is {plan.size} bytes, over the {limits.max_session_bytes}-byte limit "
            "of one upload session"
        )


class UploadSessions:
    """The upload sessions kept under ``root`` (one directory each)."""

    def __init__(self, root: Path, limits: UploadLimits) -> None:
        self.root = root
        self.limits = limits

    # --- files -------------------------------------------------------------------------
    def _dir(self, upload_id: str) -> Path:
        if not _SESSION_ID.match(upload_id):
            raise NotFoundError(f"unknown or expired upload session {upload_id[:40]!r}")
        return self.root / upload_id

    def _received(self, path: Path) -> int:
        return int((path / "received").read_text())

    def _set_received(self, path: Path, received: int) -> None:
        tmp = path / "received.tmp"
        tmp.write_text(str(received))
        os.replace(tmp, path / "received")

    def _expires(self, path: Path) -> float:
        return (path / "received").stat().st_mtime + self.limits.ttl_seconds

    def _load(self, path: Path) -> UploadPlan:
        raw = json.loads((path / "session.json").read_text())
        raw["parts"] = [UploadPart(**p) for p in raw["parts"]]
        raw["bounds"] = {k: tuple(v) for k, v in raw["bounds"].items()}
        return UploadPlan(**raw)

    @contextmanager
    def _open(self, actor: User, upload_id: str) -> Iterator[tuple[Path, UploadPlan]]:
        """A session of ``actor``'s, locked for this request (someone else's is unknown)."""
        path = self._dir(upload_id)
        unknown = NotFoundError(f"unknown or expired upload session {upload_id!r}")
        try:
            lock = os.open(path / "lock", os.O_RDWR)
        except FileNotFoundError:
            raise unknown from None
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ConflictError(
                    f"upload session {upload_id!r} is busy with another request; ask for its "
                    "offset and retry"
                ) from None
            try:
                plan = self._load(path)
            except FileNotFoundError:
                raise unknown from None
            if plan.user_id != actor.id:
                raise unknown
            if self._expires(path) < time.time():
                shutil.rmtree(path, ignore_errors=True)
                raise unknown
            yield path, plan
        finally:
            os.close(lock)

    def _status(self, upload_id: str, path: Path, plan: UploadPlan) -> UploadStatus:
        done = path / "dataset"
        return UploadStatus(
            id=upload_id,
            received=self._received(path),
            size=plan.size,
            block_rows=plan.block_rows,
            expires_at=self._expires(path),
            dataset_id=int(done.read_text()) if done.exists() else None,
        )

    # --- the API ----------------------------------------------------------------------
    def sweep(self, now: float | None = None) -> int:
        """Remove the sessions untouched for longer than the time to live; how many."""
        now = time.time() if now is None else now
        removed = 0
        if not self.root.exists():
            return 0
        for path in self.root.iterdir():
            try:
                expired = self._expires(path) < now
            except FileNotFoundError:  # half-created or half-removed
                expired = path.stat().st_mtime + self.limits.ttl_seconds < now
            if expired:
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        return removed

    def create(self, actor: User, plan: UploadPlan) -> UploadStatus:
        """Open a session for ``plan`` (data owners and admins).

        Raises:
            UploadRejectedError: the plan is inconsistent or over a limit.
            PayloadTooLargeError: the stream is over ``max_session_bytes``.
            QuotaExceededError: ``actor`` has too many sessions open.
        """
        require_uploader(actor, "dataset")
        _check_plan(plan, self.limits)
        self.sweep()
        self.root.mkdir(parents=True, exist_ok=True)
        mine = 0
        for existing in self.root.iterdir():
            try:
                other = self._load(existing)
            except (FileNotFoundError, ValueError, TypeError):
                continue
            if other.user_id == actor.id and not (existing / "dataset").exists():
                mine += 1
        if mine >= self.limits.max_sessions:
            raise QuotaExceededError(
                f"you have {mine} upload sessions open, the most allowed; finish or delete one "
                "(DELETE /uploads/<id>) or wait for it to expire"
            )
        upload_id = secrets.token_urlsafe(18)
        path = self.root / upload_id
        path.mkdir()
        plan = replace(plan, user_id=actor.id, created=time.time())
        for index, part in enumerate(plan.parts):
            rows = plan.rows if part.name.startswith("data/") else plan.mock_rows or 0
            with (path / f"part-{index}").open("wb") as f:
                f.truncate(rows * part.row_bytes)  # sparse until written
        (path / "lock").touch()
        (path / "session.json").write_text(json.dumps(asdict(plan)))
        self._set_received(path, 0)
        return self._status(upload_id, path, plan)

    def list(self, actor: User) -> list[UploadStatus]:
        """``actor``'s sessions, oldest first (finalized ones until they expire)."""
        found = []
        if self.root.exists():
            for path in self.root.iterdir():
                try:
                    plan = self._load(path)
                    if plan.user_id == actor.id and self._expires(path) >= time.time():
                        found.append((plan.created, self._status(path.name, path, plan)))
                except (FileNotFoundError, ValueError, TypeError):
                    continue  # half-created or half-removed
        return [status for _, status in sorted(found, key=lambda f: f[0])]

    def status(self, actor: User, upload_id: str) -> UploadStatus:
        """How many bytes the node holds, to resume from."""
        with self._open(actor, upload_id) as (path, plan):
            return self._status(upload_id, path, plan)

    def write(
        self, actor: User, upload_id: str, offset: int, data: bytes, sha256: str | None
    ) -> UploadStatus:
        """Write one chunk of the stream at ``offset``.

        Raises:
            UploadOffsetError: ``offset`` is not where the stream stands (the body says where).
            ChecksumMismatchError: the chunk does not match its SHA-256.
            PayloadTooLargeError: the chunk runs past the declared size.
        """
        if sha256 is None:
            raise InvalidRequestError("send the chunk's SHA-256 (hex) in X-Content-SHA256")
        with self._open(actor, upload_id) as (path, plan):
            received = self._received(path)
            if (path / "dataset").exists():
                raise ConflictError(f"upload session {upload_id!r} is already finalized")
            if offset != received:
                raise UploadOffsetError(
                    f"this upload session holds {received} bytes: send the chunk at offset "
                    f"{received}, not {offset}",
                    offset=received,
                )
            if offset + len(data) > plan.size:
                raise PayloadTooLargeError(
                    f"a chunk of {len(data)} bytes at offset {offset} runs past the upload's "
                    f"declared size of {plan.size} bytes"
                )
            if hashlib.sha256(data).hexdigest() != sha256.strip().lower():
                raise ChecksumMismatchError(
                    "the chunk does not match its X-Content-SHA256: it was damaged on the way; "
                    "nothing was written, send it again"
                )
            view = memoryview(data)
            touched: dict[int, int] = {}
            try:
                for part, at, start, n in plan.pieces(offset, len(data)):
                    if part not in touched:
                        touched[part] = os.open(path / f"part-{part}", os.O_WRONLY)
                    os.pwrite(touched[part], view[start : start + n], at)
                for fd in touched.values():
                    os.fsync(fd)
            finally:
                for fd in touched.values():
                    os.close(fd)
            self._set_received(path, offset + len(data))
            return self._status(upload_id, path, plan)

    def delete(self, actor: User, upload_id: str) -> None:
        """Abandon a session and remove what it received."""
        with self._open(actor, upload_id) as (path, _):
            shutil.rmtree(path, ignore_errors=True)

    def finalize(self, session: Session, store: BlobStore, actor: User, upload_id: str) -> Dataset:
        """Check the received table against its declarations, store it, register it.

        Values outside the bounds are clamped or refused, as in a one-request upload. A
        refused upload's session is removed (its declarations cannot change); a finalized
        one answers the same dataset again until it expires.

        Raises:
            InvalidRequestError: the stream is incomplete.
            UploadRejectedError: the data breaks its declarations (the message says where).
            ConflictError: the name was taken meanwhile.
        """
        with self._open(actor, upload_id) as (path, plan):
            done = path / "dataset"
            if done.exists():
                return get_dataset(session, int(done.read_text()))
            received = self._received(path)
            if received != plan.size:
                raise InvalidRequestError(
                    f"upload session {upload_id!r} holds {received} of {plan.size} bytes: send "
                    "the rest before finalizing"
                )
            try:
                dataset = store_received(
                    session, store, actor, path, plan, self.limits.max_elements
                )
            except (UploadRejectedError, ConflictError):  # it stored nothing: the session goes
                shutil.rmtree(path, ignore_errors=True)
                raise
            for part in path.glob("part-*"):
                part.unlink()
            done.write_text(str(dataset.id))
            os.utime(path / "received")
            return dataset


def plan_from_request(raw: dict[str, Any], parts: Sequence[dict[str, Any]]) -> UploadPlan:
    """An :class:`UploadPlan` from a validated request (see ``dpnode.node.api.routes.uploads``)."""
    return UploadPlan(
        **raw,
        parts=[UploadPart(p["name"], p["dtype"], list(p["shape"])) for p in parts],
    )

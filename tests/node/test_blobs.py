"""Blobs shared by content: a release racing an upload of the same bytes keeps them.

The interleaving that lost a new dataset's blob on PostgreSQL: the upload stores its bytes
(finding them already stored), the deletion of the old item commits and checks references
(none yet), deletes the file, and then the upload commits a row referring to it. The store
here pauses each upload right after its first blob is stored, until the deletion is done or
:data:`PAUSE` has passed, so that interleaving is tried every time rather than by chance;
with the blob held by the upload, the deletion waits for it instead and the pause runs out.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from sqlalchemy.orm import Session

from dpnode.core.errors import ConflictError
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services import datasets, finalize, models
from dpnode.node.services.datasets import DatasetUpload
from dpnode.node.services.models import ModelUpload
from dpnode.node.services.tabular import ColumnSpec
from dpnode.node.services.uploads import UploadPart, UploadPlan
from dpnode.node.storage import BlobStore, FileBlobStore, Staged, array_to_bytes
from tests.conftest import make_user
from tests.node.conftest import blob_files, write_elsewhere

#: How long an upload waits, after storing its first blob, for a deletion to finish.
PAUSE = 0.5
VALUES = np.linspace(0.0, 1.0, 7)


class PausingStore:
    """``store``, calling ``pause`` once, after the first blob written through it is stored."""

    def __init__(self, store: BlobStore, pause: Callable[[], None]) -> None:
        self.store = store
        self.pause = pause
        self.paused = False

    def _after(self, digest: str) -> str:
        if not self.paused:
            self.paused = True
            self.pause()
        return digest

    def put(self, data: bytes, **options: Any) -> str:
        return self._after(self.store.put(data, **options))

    def put_stream(self, chunks: Iterable[bytes | memoryview], **options: Any) -> str:
        return self._after(self.store.put_stream(chunks, **options))

    def keep(self, staged: Staged, **options: Any) -> str:  # a staged blob (chunked uploads)
        return self._after(self.store.keep(staged, **options))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def _dataset(name: str, columns: dict[str, np.ndarray[Any, Any]]) -> DatasetUpload:
    spec = ColumnSpec({c: (0.0, 1.0) for c in columns}, {})
    return DatasetUpload(name, "", [], spec, list(columns), columns)


def _one_request(
    context: NodeContext, session: Session, store: BlobStore, owner: User, name: str
) -> str:
    dataset = datasets.create_dataset(
        session, store, owner, _dataset(name, {"x": VALUES}), max_elements=100
    )
    return dataset.columns[0].blob


def _model(context: NodeContext, session: Session, store: BlobStore, owner: User, name: str) -> str:
    upload = ModelUpload(name, "", [], False, ["x"], {"x": VALUES})
    return models.create_model(session, store, owner, upload, max_elements=100).tensors[0].blob


def _chunked(
    context: NodeContext, session: Session, store: BlobStore, owner: User, name: str
) -> str:
    part = UploadPart("data/x", "float64", [])
    plan = UploadPlan(
        name,
        "",
        [],
        ["x"],
        {"x": (0.0, 1.0)},
        {},
        False,
        {},
        None,
        len(VALUES),
        len(VALUES),
        [part],
    )
    created = context.uploads.create(owner, plan)
    data = array_to_bytes(VALUES)
    context.uploads.write(owner, created.id, 0, data, hashlib.sha256(data).hexdigest())
    return context.uploads.finalize(session, store, owner, created.id).columns[0].blob


UPLOADS = {"one request": _one_request, "model": _model, "chunked": _chunked}


@pytest.mark.parametrize("kind", UPLOADS)
def test_deleting_an_item_while_its_bytes_are_uploaded_again_keeps_them(
    context: NodeContext, kind: str
) -> None:
    owner = make_user(context, "racer@example.org", "data_owner")
    with context.sessions() as session:
        digest = _one_request(context, session, context.store, owner, "old")
    stored, released = threading.Event(), threading.Event()

    def pause() -> None:
        stored.set()
        released.wait(PAUSE)

    def upload_again() -> str:
        store = PausingStore(context.store, pause)
        with context.sessions() as session:
            return UPLOADS[kind](context, session, store, owner, "new")

    with ThreadPoolExecutor(1) as pool:
        new = pool.submit(upload_again)
        assert stored.wait(10)
        with context.sessions() as session:
            datasets.delete_dataset(session, context.store, owner, "old")
        released.set()
        assert new.result() == digest
    # Read from disk, past this process's cache of verified blobs.
    assert FileBlobStore(context.settings.blob_dir).get(digest) == array_to_bytes(VALUES)


def test_uploads_of_the_same_bytes_in_opposite_orders_do_not_wait_for_each_other(
    context: NodeContext,
) -> None:
    # Each holds its first column's blob while it stores the other's: had uploads held blobs
    # exclusively, each would wait for the other (PostgreSQL: a deadlock, one upload failed).
    owner = make_user(context, "racer@example.org", "data_owner")
    meet = threading.Barrier(2, timeout=PAUSE)

    def pause() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            meet.wait()

    def upload(name: str, order: list[str]) -> int:
        columns = {c: VALUES if c == "x" else 1 - VALUES for c in order}
        store = PausingStore(context.store, pause)
        with context.sessions() as session:
            upload = _dataset(name, columns)
            return datasets.create_dataset(session, store, owner, upload, max_elements=100).id

    with ThreadPoolExecutor(2) as pool:
        ids = list(pool.map(upload, ["xy", "yx"], [["x", "y"], ["y", "x"]]))
    assert len(set(ids)) == 2


@pytest.mark.parametrize("kind", UPLOADS)
def test_an_item_whose_name_is_taken_at_the_last_moment_leaves_no_blob(
    context: NodeContext, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A concurrent upload may take the name between the check and the rows (PostgreSQL; on
    SQLite the write lock orders them): simulated by skipping the check. The refused item's
    blobs are released, the winner's stay."""
    owner = make_user(context, "racer@example.org", "data_owner")
    with context.sessions() as session:
        shared = UPLOADS[kind](context, session, context.store, owner, "taken")
    before = blob_files(context)

    def unchecked(session: Session, actor: User, name: str, tags: Any) -> tuple[str, list[str]]:
        return name, []

    monkeypatch.setattr(datasets, "check_new_dataset", unchecked)
    monkeypatch.setattr(finalize, "check_new_dataset", unchecked)
    monkeypatch.setattr(models, "check_model_name", lambda session, name: None)
    monkeypatch.setattr(sys.modules[__name__], "VALUES", np.linspace(0.0, 0.5, 7))
    with context.sessions() as session, pytest.raises(ConflictError, match="already exists"):
        UPLOADS[kind](context, session, context.store, owner, "taken")
    assert blob_files(context) == before
    assert FileBlobStore(context.settings.blob_dir).get(shared)  # the winner's, still there
    assert not list(context.settings.blob_dir.rglob(".tmp-*"))


def test_a_one_request_upload_stores_its_bytes_without_holding_the_write_lock(
    context: NodeContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On SQLite another writer commits while an upload's blobs are written and hashed: the
    upload's transaction (the write lock every publish waits for) begins after."""
    if context.engine.dialect.name != "sqlite":
        pytest.skip("PostgreSQL has no database-wide write lock")
    owner = make_user(context, "owner@example.org", "data_owner")
    writes: list[str] = []
    real = FileBlobStore.stage

    def stage(self: FileBlobStore, chunks: Iterable[bytes | memoryview]) -> Staged:
        writes.append(write_elsewhere(context))
        return real(self, chunks)

    monkeypatch.setattr(FileBlobStore, "stage", stage)
    for kind in ("one request", "model"):
        with context.sessions() as session:
            UPLOADS[kind](context, session, context.store, owner, kind)
    assert writes and set(writes) == {"committed"}, writes

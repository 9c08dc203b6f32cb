"""Blobs and the rows that refer to them: written and released without losing one in use.

Blobs are content-addressed, so items with the same bytes share one, and a blob is released
(deleted from the store) once no row refers to it. A release checks the references after
the deleting commit; an upload of the same bytes stores them (or finds them stored) before
its row commits. Unchecked, a release could check between the two and delete the blob the
new row then names. So a writer *holds* each blob from the moment its digest is known (the
store calls back before looking for a stored copy) until its transaction ends, and a release
holds a blob before it checks the references and until it has deleted it:

- PostgreSQL: a transaction-scoped advisory lock on a key taken from the digest, which every
  node process sharing the database takes part in, whatever machine it runs on. Writers hold
  it shared (uploads of the same bytes never wait for each other, whatever their column
  order); a release holds it exclusively, one blob per transaction, so it never waits for a
  blob while holding another that a writer waits for.
- SQLite: a writing transaction begins ``IMMEDIATE`` (``dpnode.node.db.session``) and holds
  the database's write lock, in every process on the machine, so holding a blob is beginning
  the transaction: a writer's put, its row and its commit, and a release's check and delete,
  each run under that lock, one after another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import TypeVar

from sqlalchemy import select, text, union_all
from sqlalchemy.orm import Session

from dpnode.node.db.models import Dataset, DatasetColumn, Model, ModelTensor
from dpnode.node.db.session import SQLITE_BEGIN
from dpnode.node.storage import BlobStore, Staged

C = TypeVar("C")
T = TypeVar("T")

#: Every column that names a blob.
_REFERRING = (
    DatasetColumn.blob,
    DatasetColumn.mock_blob,
    Dataset.subjects_blob,
    ModelTensor.blob,
    Model.architecture_blob,
)


def lock_key(digest: str) -> int:
    """The advisory lock key of a blob: the first 64 bits of its digest, as a signed bigint.

    >>> lock_key("ff" * 32), lock_key("00" * 31 + "01"), lock_key("7f" + "ff" * 31)
    (-1, 0, 9223372036854775807)
    """
    return int.from_bytes(bytes.fromhex(digest[:16]), "big", signed=True)


def _hold(session: Session, digest: str, *, exclusive: bool = False) -> None:
    """Keep ``digest`` from being released (or, ``exclusive``, from being written) by anyone
    else until ``session``'s transaction ends."""
    connection = session.connection()  # begins the transaction: on SQLite, the write lock
    if connection.dialect.name == "sqlite":
        if connection.get_execution_options().get(SQLITE_BEGIN) == "DEFERRED":
            raise RuntimeError("blobs are written and released in a writing transaction")
        return
    lock = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
    connection.execute(text(f"SELECT {lock}(:key)"), {"key": lock_key(digest)})


def put(session: Session, store: BlobStore, data: bytes) -> str:
    """Store ``data`` for a row ``session`` will commit; its digest, held until then."""
    return store.put(data, claim=partial(_hold, session))


def stage(store: BlobStore, blobs: Iterable[Iterable[bytes | memoryview]]) -> list[Staged]:
    """Write and hash each blob (its chunks) beside the store, before any transaction: the
    long part of storing, done without holding anything. None is left if one fails."""
    staged: list[Staged] = []
    try:
        for chunks in blobs:
            staged.append(store.stage(chunks))
    except BaseException:
        discard(store, staged)
        raise
    return staged


def discard(store: BlobStore, staged: Iterable[Staged]) -> None:
    """Drop staged blobs that will not be kept."""
    for blob in staged:
        store.discard(blob)


def register_with(
    session: Session,
    store: BlobStore,
    staged: Sequence[Staged],
    check: Callable[[], C],
    register: Callable[[C, list[str]], T],
) -> T:
    """Call ``check`` (the refusals that read ``session``'s transaction, a name taken, say),
    then put staged blobs in the store, each held as :func:`put` holds it, then call
    ``register`` with what ``check`` returned and the digests (in order) to write and commit
    the rows naming them.

    Whatever fails (``check``, or a name taken by a concurrent upload at the rows), nothing is
    left behind: the staged blobs not kept are dropped, the transaction is rolled back, and
    those kept are released unless another row uses them.
    """
    digests: list[str] = []
    try:
        checked = check()
        for blob in staged:
            digests.append(store.keep(blob, claim=partial(_hold, session)))
        return register(checked, digests)
    except BaseException:
        discard(store, staged[len(digests) :])  # a failed keep dropped its own already
        if digests:
            session.rollback()
            release(session, store, digests)
        raise


def _referenced(session: Session, digest: str) -> bool:
    uses = union_all(*(select(column).where(column == digest) for column in _REFERRING))
    return session.scalar(uses.limit(1)) is not None


def release(session: Session, store: BlobStore, digests: Iterable[str | None]) -> None:
    """Delete the blobs no row refers to any more (call after the deleting commit).

    Each blob in a transaction of its own: held, checked, deleted if unused, committed.
    """
    for digest in sorted({d for d in digests if d}):
        _hold(session, digest, exclusive=True)
        if not _referenced(session, digest):
            store.delete(digest)
        session.commit()

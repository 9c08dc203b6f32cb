"""Datasets: upload under the contract, listing, search, deletion and mock download."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import bindparam, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.orm.interfaces import LoaderOption

from dpnode.core.errors import (
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    UploadRejectedError,
)
from dpnode.core.privacy import Subjects
from dpnode.core.privacy.subjects import KeptByBytes
from dpnode.node.db.models import (
    Dataset,
    DatasetColumn,
    DatasetTag,
    LedgerEntryDataset,
    Role,
    User,
)
from dpnode.node.services import audit, blobs
from dpnode.node.services.catalog import (
    check_item_name,
    delete_item,
    filter_catalog,
    get_item,
    normalise_tags,
    require_owner,
    require_uploader,
)
from dpnode.node.services.tabular import ColumnSpec, PreparedTable, prepare_table
from dpnode.node.storage import BlobStore, SizedLru, array_from_bytes, array_to_bytes


@dataclass(frozen=True)
class DatasetUpload:
    """One upload, decoded: declarations plus real (and optionally mock) columns."""

    name: str
    description: str
    tags: Sequence[str]
    spec: ColumnSpec
    order: Sequence[str]
    columns: Mapping[str, npt.NDArray[Any]]
    mock_order: Sequence[str] | None = None
    mock: Mapping[str, npt.NDArray[Any]] | None = None


def _load_options() -> list[LoaderOption]:
    return [
        selectinload(Dataset.columns),
        selectinload(Dataset.tags),
        selectinload(Dataset.owner),
    ]


def prepare_mock(upload: DatasetUpload, real: PreparedTable, max_elements: int) -> PreparedTable:
    assert upload.mock is not None
    spec = upload.spec
    if spec.subject_id is not None and spec.subject_id not in upload.mock:
        spec = ColumnSpec(spec.bounds, spec.categories, spec.clamp, spec.fill, None)
    order = upload.mock_order
    if order is None:
        # Frames list tensors by name, not as sent: without a declared mock order, the mock
        # follows the data's column order (extra mock columns last, refused below).
        order = [c for c in upload.order if c in upload.mock]
        order += [c for c in upload.mock if c not in order]
    mock = prepare_table(upload.mock, spec, order=order, max_elements=max_elements, what="mock ")
    real_names = [c.name for c in real.columns]
    if [c.name for c in mock.columns] != real_names:
        raise UploadRejectedError(
            f"mock data must have the same columns as the data, in order: {real_names[:10]}"
        )
    columns = []
    for r, m in zip(real.columns, mock.columns, strict=True):
        if r.row_shape != m.row_shape:
            raise UploadRejectedError(
                f"mock column {r.name!r} has row shape {m.row_shape}, the data {r.row_shape}"
            )
        if m.values.dtype != r.values.dtype:
            cast = m.values.astype(r.values.dtype)
            if not np.array_equal(cast, m.values):
                raise UploadRejectedError(
                    f"mock column {r.name!r} ({m.values.dtype}) cannot be stored as the data's "
                    f"dtype {r.values.dtype} without changing its values"
                )
            m = replace(m, values=cast)
        columns.append(m)
    return replace(mock, columns=columns)


@dataclass(frozen=True)
class StoredColumn:
    """One column as registered: its public metadata and the digests of its bytes."""

    name: str
    dtype: str
    row_shape: list[int]
    lower: float
    upper: float
    categories: list[str] | None
    blob: str
    mock_blob: str | None


@dataclass(frozen=True)
class StoredTable:
    """A validated table whose bytes are in the store, ready to register."""

    columns: list[StoredColumn]
    row_count: int
    mock_row_count: int | None
    subjects_blob: str | None
    subject_count: int
    max_rows_per_subject: int


def check_new_dataset(
    session: Session, actor: User, name: str, tags: Sequence[str]
) -> tuple[str, list[str]]:
    """The checks made before any byte is stored: who uploads, the name free, the tags valid.

    Raises:
        PermissionDeniedError: ``actor`` is a data scientist.
        ConflictError: a dataset with this name exists.
    """
    require_uploader(actor, "dataset")
    name = check_item_name("dataset", name)
    normalised = normalise_tags(tags)
    if session.scalar(select(Dataset.id).where(Dataset.name == name)) is not None:
        raise ConflictError(f"a dataset named {name!r} already exists")
    return name, normalised


def create_dataset(
    session: Session,
    store: BlobStore,
    actor: User,
    upload: DatasetUpload,
    *,
    max_elements: int,
) -> Dataset:
    """Validate an upload against its declared contract and store it.

    The table is checked and its blobs staged before ``session`` begins the transaction
    that registers it (on SQLite that one holds the write lock the node's publishes wait
    for), and a failure leaves nothing behind (:func:`blobs.register_with`).

    Raises:
        PermissionDeniedError: ``actor`` is a data scientist.
        ConflictError: a dataset with this name exists.
        UploadRejectedError: the data breaks its declarations (the message says where).
    """
    require_uploader(actor, "dataset")  # the cheap refusals before the work (again below)
    check_item_name("dataset", upload.name)
    table = prepare_table(
        upload.columns, upload.spec, order=upload.order, max_elements=max_elements
    )
    mock = prepare_mock(upload, table, max_elements) if upload.mock is not None else None
    arrays = [column.values for column in table.columns]
    arrays += [column.values for column in mock.columns] if mock else []
    arrays += [table.subjects] if table.subjects is not None else []
    staged = blobs.stage(store, ((array_to_bytes(a),) for a in arrays))
    count = len(table.columns)

    def register(checked: tuple[str, list[str]], digests: list[str]) -> Dataset:
        name, tags = checked
        stored = StoredTable(
            columns=[
                StoredColumn(
                    name=column.name,
                    dtype=column.values.dtype.name,
                    row_shape=column.row_shape,
                    lower=column.lower,
                    upper=column.upper,
                    categories=column.categories,
                    blob=digests[position],
                    mock_blob=digests[count + position] if mock else None,
                )
                for position, column in enumerate(table.columns)
            ],
            row_count=table.row_count,
            mock_row_count=mock.row_count if mock else None,
            subjects_blob=digests[-1] if table.subjects is not None else None,
            subject_count=table.subject_count,
            max_rows_per_subject=table.max_rows_per_subject,
        )
        return register_dataset(session, actor, upload, stored, name=name, tags=tags)

    return blobs.register_with(
        session,
        store,
        staged,
        lambda: check_new_dataset(session, actor, upload.name, upload.tags),
        register,
    )


def register_dataset(
    session: Session,
    actor: User,
    upload: DatasetUpload,
    table: StoredTable,
    *,
    name: str,
    tags: list[str],
    provenance: dict[str, Any] | None = None,
) -> Dataset:
    """Record a stored table as a dataset, with its audit line, in one transaction.

    ``provenance``: where a synthetic dataset came from (``None`` for an upload).

    Raises:
        ConflictError: a concurrent upload took the name.
    """
    dataset = Dataset(
        name=name,
        description=upload.description,
        owner_id=actor.id,
        row_count=table.row_count,
        mock_row_count=table.mock_row_count,
        subject_column=upload.spec.subject_id,
        subjects_blob=table.subjects_blob,
        subject_count=table.subject_count,
        max_rows_per_subject=table.max_rows_per_subject,
        tags=[DatasetTag(tag=t) for t in tags],
        provenance=provenance,
    )
    for position, column in enumerate(table.columns):
        dataset.columns.append(
            DatasetColumn(
                position=position,
                name=column.name,
                dtype=column.dtype,
                row_shape=column.row_shape,
                lower=column.lower,
                upper=column.upper,
                categories=column.categories,
                blob=column.blob,
                mock_blob=column.mock_blob,
            )
        )
    session.add(dataset)
    try:
        session.flush()
    except IntegrityError:  # a concurrent request took the name after the check above
        session.rollback()
        raise ConflictError(f"a dataset named {name!r} already exists") from None
    audit.record(
        session,
        actor,
        "dataset.upload" if provenance is None else "dataset.synthesize",
        target_type="dataset",
        target_id=dataset.id,
        name=name,
        rows=table.row_count,
        columns=len(table.columns),
        tags=tags,
        clamp=sorted(upload.spec.clamp)
        if isinstance(upload.spec.clamp, frozenset)
        else upload.spec.clamp,
    )
    session.commit()
    return get_dataset(session, dataset.id)


def get_dataset(session: Session, ref: int | str) -> Dataset:
    """A dataset by id or by name."""
    return get_item(session, Dataset, ref, _load_options())


@dataclass(frozen=True)
class ReadColumn:
    """A column's public metadata and where its values are."""

    name: str
    dtype: str
    row_shape: tuple[int, ...]
    lower: float
    upper: float
    blob: str
    mock_blob: str | None


@dataclass(frozen=True)
class ReadDataset:
    """A dataset as a computation reads it: its rows, subjects and columns (no owner, tags)."""

    id: int
    name: str
    row_count: int
    mock_row_count: int | None
    subjects_blob: str | None
    columns: tuple[ReadColumn, ...]


#: Built once, plain rows (no ORM objects): every publish runs it for each dataset it reads.
_D, _C = Dataset.__table__.c, DatasetColumn.__table__.c
_WITH_COLUMNS = (
    select(
        _D.id,
        _D.name,
        _D.row_count,
        _D.mock_row_count,
        _D.subjects_blob,
        _C.name,
        _C.dtype,
        _C.row_shape,
        _C.lower,
        _C.upper,
        _C.blob,
        _C.mock_blob,
    )
    .select_from(Dataset.__table__.outerjoin(DatasetColumn.__table__))
    .where(_D.id == bindparam("dataset_id"))
    .order_by(_C.position)
)


def get_dataset_columns(session: Session, dataset_id: int) -> ReadDataset:
    """A dataset with its columns only, in one query: what a computation reads."""
    rows = session.connection().execute(_WITH_COLUMNS, {"dataset_id": dataset_id}).all()
    if not rows:
        raise NotFoundError(f"no dataset {dataset_id!r}")
    first = rows[0]
    columns = tuple(
        ReadColumn(r[5], r[6], tuple(r[7] or ()), r[8], r[9], r[10], r[11])
        for r in rows
        if r[5] is not None  # a dataset without columns: one row of NULLs
    )
    return ReadDataset(first[0], first[1], first[2], first[3], first[4], columns)


def _width(dataset: ReadDataset) -> int:
    return max(len(dataset.columns), 1)


class KnownDatasets(SizedLru[int, ReadDataset]):
    """The datasets this process has read for a computation (:class:`ReadDataset`), by id, so
    that a publish on them reads no metadata from the database.

    Sound because a dataset's metadata never changes once stored (nothing updates a dataset or
    its columns but its mock, which a synthetic mock replaces and no computation reads from
    here: ``mock_row_count`` and ``mock_blob`` of an entry may be older) and ids are never
    reused (``NEVER_REUSE_IDS``): an entry is right for as long
    as its dataset exists. Whether it still does is decided by the charge of every publish,
    under its lock (``budget.charge`` refuses a dataset deleted meanwhile, charging nothing),
    so every process of a node may keep its own. At most ``max_columns`` columns' metadata
    (a few hundred bytes each), least recently used out; a dataset wider than that is read each
    time. Safe to share between threads.

    >>> known = KnownDatasets(max_columns=3)
    >>> column = ReadColumn("x", "float64", (), 0.0, 1.0, "0" * 64, None)
    >>> for ident in (1, 2, 3):
    ...     known.keep(ReadDataset(ident, f"d{ident}", 10, None, None, (column,) * ident))
    >>> known.get(1), known.get(2), known.get(3) is not None  # 1 and 2 made way for 3
    (None, None, True)
    """

    def __init__(self, max_columns: int = 100_000) -> None:
        super().__init__(max_columns, _width)

    def keep(self, dataset: ReadDataset) -> None:
        self.add(dataset.id, dataset)

    def forget(self, idents: Iterable[int]) -> None:
        for ident in idents:
            self.discard(ident)


def search_datasets(
    session: Session, *, tags: Sequence[str] = (), text: str | None = None, limit: int = 100
) -> list[Dataset]:
    """Datasets carrying all of ``tags`` whose name or description contains ``text``."""
    query = filter_catalog(
        select(Dataset), Dataset, DatasetTag.dataset_id, DatasetTag.tag, tags, text
    )
    query = query.options(*_load_options()).order_by(Dataset.name).limit(limit)
    return list(session.scalars(query))


def charges_on(session: Session, dataset_id: int) -> int:
    """How many ledger rows read the dataset (they outlive it: ``LedgerEntryDataset``)."""
    query = select(func.count()).where(LedgerEntryDataset.dataset_id == dataset_id)
    return session.scalar(query) or 0


def delete_dataset(
    session: Session,
    store: BlobStore,
    actor: User | None,
    ref: int | str,
    *,
    uncharged_only: bool = False,
    **detail: Any,
) -> None:
    """Delete a dataset and the array bytes nothing else uses, and audit it.

    Args:
        actor: its owner or an admin; ``None`` for the node's operator on the command line.
        uncharged_only: refuse when the ledger has charges on it (the charges stay, and
            count against its name's caps, but its columns and bounds would be gone).
        detail: more for the audit event (the operator's name).

    Raises:
        NotFoundError: no such dataset.
        PermissionDeniedError: ``actor`` neither owns it nor is an admin.
        ConflictError: ``uncharged_only`` and the ledger has charges on it.
    """
    dataset = get_dataset(session, ref)
    charges = charges_on(session, dataset.id)
    if uncharged_only and charges:
        raise ConflictError(
            f"dataset {dataset.name!r} has {charges} privacy charge(s) in the ledger; the "
            "ledger keeps them after a delete, but no longer the columns and bounds they read. "
            "Delete it anyway with `dpnode dataset delete --charged`"
        )
    digests = [dataset.subjects_blob]
    for column in dataset.columns:
        digests += [column.blob, column.mock_blob]
    delete_item(session, store, actor, dataset, digests, charges=charges, **detail)


def download_mock(
    session: Session, store: BlobStore, actor: User, ref: int | str
) -> tuple[Dataset, dict[str, npt.NDArray[Any]]]:
    """A dataset's mock columns (fake by definition) for ``actor``, the download audited."""
    dataset = get_dataset(session, ref)
    arrays = read_columns(store, dataset, mock=True)
    audit.record(
        session, actor, "dataset.mock_download", target_type="dataset", target_id=dataset.id
    )
    session.commit()
    return dataset, arrays


def read_columns(store: BlobStore, dataset: Dataset, *, mock: bool) -> dict[str, npt.NDArray[Any]]:
    """The stored (encoded) columns of a dataset, real or mock, verified by hash."""
    return {c.name: read_column(store, dataset, c, mock=mock) for c in dataset.columns}


def read_column(
    store: BlobStore,
    dataset: Dataset | ReadDataset,
    column: DatasetColumn | ReadColumn,
    *,
    mock: bool = False,
) -> npt.NDArray[Any]:
    """One stored column, real or mock, verified by hash, read-only and mapped from its file
    (not read into memory: a computation reads the pages it touches)."""
    rows = dataset.mock_row_count if mock else dataset.row_count
    digest = column.mock_blob if mock else column.blob
    if rows is None or digest is None:
        raise NotFoundError(f"dataset {dataset.name!r} has no mock data")
    return store.open_array(digest, column.dtype, (rows, *column.row_shape))


def read_subjects(store: BlobStore, dataset: Dataset | ReadDataset) -> npt.NDArray[np.int64] | None:
    """The subject index of every row, or None when each row is its own subject."""
    if dataset.subjects_blob is None:
        return None
    # read into (immutable, verified) bytes, not mapped: the subject structure analysed from
    # it is kept by digest (below), and an index whose bytes cannot change is used as is
    # (dpnode.core.privacy.subjects), where a mapped one would be copied
    data = store.get(dataset.subjects_blob)
    return array_from_bytes(data, "int64", (dataset.row_count,))


#: Subject structures of recent subject indexes, by blob digest: blobs are content-addressed
#: and immutable, so a digest always has the same structure. Kept up to 64 MiB (an index,
#: its per-subject counts and run starts take up to 24 bytes a row) so that a publish does
#: not redo the O(rows) analysis.
_STRUCTURES: KeptByBytes[tuple[str, int], Subjects] = KeptByBytes(64 * 1024 * 1024)


def subject_structure(store: BlobStore, dataset: Dataset | ReadDataset) -> Subjects:
    """The structure of the dataset's subject index (the tracker's view of its rows)."""
    digest = dataset.subjects_blob
    if digest is None:
        return Subjects.identity(dataset.row_count)

    def analyse() -> Subjects:
        index = read_subjects(store, dataset)
        assert index is not None
        return Subjects.of(index)

    return _STRUCTURES.get((digest, dataset.row_count), 24 * dataset.row_count, analyse)


def download_real(
    session: Session, store: BlobStore, actor: User, dataset: Dataset
) -> dict[str, npt.NDArray[Any]]:
    """The stored values, for the dataset's owner and admins only; data scientists get
    only the synthetic datasets they made (differentially private releases), never real
    values."""
    if actor.role is Role.DATA_SCIENTIST and dataset.provenance is None:
        raise PermissionDeniedError(
            "data scientists never receive real values: compute on remote tensors and "
            "call .publish(epsilon=...) for a noised result, download the mock data, or "
            "make a synthetic copy with ds.synthesize(epsilon=..., delta=...)"
        )
    require_owner(actor, dataset.owner_id, f"dataset {dataset.name!r}")
    audit.record(session, actor, "dataset.download", target_type="dataset", target_id=dataset.id)
    session.commit()
    return read_columns(store, dataset, mock=False)

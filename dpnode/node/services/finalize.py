"""Finalizing an upload session: hold the received columns to their contract and store them.

Each numeric column is read back from its file a block of rows at a time, held to its
contract (:func:`dpnode.node.services.tabular.encode_block`: the same elementwise steps as a
one-request upload, so the stored bytes are the same) and streamed into the blob store;
refused values are counted over the whole column before the refusal is raised, inside the
blob store's stream, which then keeps nothing. The subject ids and the mock data are read
whole (the subject structure needs every id; mock data is small).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from dpnode.core.errors import UploadRejectedError
from dpnode.node.db.models import Dataset, User
from dpnode.node.services import blobs
from dpnode.node.services.datasets import (
    DatasetUpload,
    StoredColumn,
    StoredTable,
    check_new_dataset,
    prepare_mock,
    register_dataset,
)
from dpnode.node.services.tabular import (
    ColumnSpec,
    PreparedColumn,
    PreparedTable,
    Violations,
    check_declarations,
    encode_block,
    numeric_contract,
    subject_index,
)
from dpnode.node.storage import BlobStore, Staged, array_chunks, array_to_bytes

if TYPE_CHECKING:
    from dpnode.node.services.uploads import UploadPart, UploadPlan

#: Rows of a column encoded at once (about 8 MiB).
_ENCODE_BYTES = 8 * 1024 * 1024


def _part_array(path: Path, index: int, part: UploadPart, rows: int) -> npt.NDArray[Any]:
    """One received column, whole (the subject ids, the mock data)."""
    values = np.fromfile(path / f"part-{index}", dtype=part.dtype)
    return values.reshape(rows, *part.row_shape)


def _part_blocks(path: Path, index: int, part: UploadPart, rows: int) -> Iterator[npt.NDArray[Any]]:
    """One received column, read a block of rows at a time (about 8 MiB).

    Plain reads rather than a memory map: the pages of a map would count as the node's
    memory until unmapped, and a column may be far larger than what the node should hold.
    """
    step = max(1, _ENCODE_BYTES // max(1, part.row_bytes))
    with (path / f"part-{index}").open("rb") as f:
        for start in range(0, rows, step):
            count = min(step, rows - start)
            block = np.fromfile(f, dtype=part.dtype, count=count * math.prod(part.row_shape))
            yield block.reshape(count, *part.row_shape)


def _encoded_chunks(
    name: str, blocks: Iterator[npt.NDArray[Any]], spec: ColumnSpec, dtype: np.dtype[Any]
) -> Iterator[memoryview]:
    contract = numeric_contract(name, dtype, spec)
    violations = Violations()
    for raw in blocks:
        block = encode_block(name, raw, contract, spec, violations)
        if not (violations.non_finite or violations.outside):
            yield from array_chunks(block)
    # Raised inside the store's stage, which then keeps nothing of this column.
    violations.check(name, contract)


def store_received(
    session: Session,
    store: BlobStore,
    actor: User,
    path: Path,
    plan: UploadPlan,
    max_elements: int,
) -> Dataset:
    """Store the received columns and register them.

    Every blob is staged first (:meth:`~dpnode.node.storage.FileBlobStore.stage`: encoded,
    hashed and written beside the store), before ``session`` begins its transaction; the
    transaction then checks the name, keeps the staged blobs and registers the dataset. On
    SQLite that transaction holds the database's write lock, which the node's publishes
    wait for: it is held for the renames, not for streaming the table. Nothing is left
    behind on a refusal or a failure (:func:`~dpnode.node.services.blobs.register_with`).
    """
    spec = plan.spec
    upload = DatasetUpload(
        name=plan.name,
        description=plan.description,
        tags=plan.tags,
        spec=spec,
        order=plan.columns,
        columns={},
    )
    check_declarations(plan.columns, plan.columns, spec)
    staged: list[Staged] = []
    try:
        stored = _stage_table(store, path, plan, upload, max_elements, staged)
    except BaseException:
        blobs.discard(store, staged)
        raise

    def register(checked: tuple[str, list[str]], digests: list[str]) -> Dataset:
        name, tags = checked
        return register_dataset(session, actor, upload, stored(digests), name=name, tags=tags)

    return blobs.register_with(
        session,
        store,
        staged,
        lambda: check_new_dataset(session, actor, plan.name, plan.tags),
        register,
    )


def _stage_table(
    store: BlobStore,
    path: Path,
    plan: UploadPlan,
    upload: DatasetUpload,
    max_elements: int,
    staged: list[Staged],
) -> Callable[[list[str]], StoredTable]:
    """Stage every blob of the received table (appending each to ``staged``, in the order
    they are to be kept), reading nothing from the database; and how to make the stored
    table from the digests they are kept under (by position in ``staged``)."""
    spec = plan.spec
    subjects_at: int | None = None
    subject_count, max_rows = plan.rows, 1
    columns: list[tuple[StoredColumn, int]] = []
    kept: list[PreparedColumn] = []
    mock_arrays: dict[str, npt.NDArray[Any]] = {}
    for index, part in enumerate(plan.parts):
        if part.name.startswith("mock/"):
            rows = plan.mock_rows or 0
            mock_arrays[part.name[5:]] = _part_array(path, index, part, rows)
            continue
        name_ = part.name[5:]
        if name_ == spec.subject_id:
            values = _part_array(path, index, part, plan.rows)
            subjects, subject_count, max_rows = subject_index(name_, values)
            staged.append(store.stage((array_to_bytes(subjects),)))
            subjects_at = len(staged) - 1
            continue
        dtype = np.dtype(part.dtype)
        contract = numeric_contract(name_, dtype, spec)
        stored_dtype = encode_block(
            name_, np.empty((0, *part.row_shape), dtype), contract, spec, Violations()
        ).dtype
        blocks = _part_blocks(path, index, part, plan.rows)
        staged.append(store.stage(_encoded_chunks(name_, blocks, spec, dtype)))
        column = StoredColumn(
            name_,
            stored_dtype.name,
            list(part.row_shape),
            contract.lower,
            contract.upper,
            contract.categories,
            "",
            None,
        )
        columns.append((column, len(staged) - 1))
        kept.append(
            PreparedColumn(
                name_,
                np.empty((0, *part.row_shape), stored_dtype),
                contract.lower,
                contract.upper,
                contract.categories,
            )
        )
    if not columns:
        raise UploadRejectedError("a dataset needs at least one column besides the subject id")
    mock_rows = None
    mock_at: list[int] = []
    if mock_arrays:
        real = PreparedTable(kept, plan.rows, None, subject_count, max_rows)
        with_mock = replace(upload, mock_order=plan.mock_columns, mock=mock_arrays)
        mock = prepare_mock(with_mock, real, max_elements=max_elements)
        mock_rows = mock.row_count
        for m in mock.columns:
            staged.append(store.stage((array_to_bytes(m.values),)))
            mock_at.append(len(staged) - 1)

    mocks: list[int | None] = list(mock_at) if mock_at else [None] * len(columns)

    def stored(digests: list[str]) -> StoredTable:
        named = [
            replace(c, blob=digests[at], mock_blob=None if m is None else digests[m])
            for (c, at), m in zip(columns, mocks, strict=True)
        ]
        subjects_blob = None if subjects_at is None else digests[subjects_at]
        return StoredTable(named, plan.rows, mock_rows, subjects_blob, subject_count, max_rows)

    return stored

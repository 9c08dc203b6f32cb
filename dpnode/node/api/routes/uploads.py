"""Chunked, resumable dataset uploads (``dpnode.node.services.uploads``, docs/datasets.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Header, Query, status

from dpnode.node.api.deps import ChunkBody, CurrentUser, SessionDep, StoreDep, UploadsDep
from dpnode.node.api.numbers import IntegerText
from dpnode.node.api.openapi import errors
from dpnode.node.api.routes.datasets import dataset_public
from dpnode.node.api.schemas import DatasetPublic, UploadCreate, UploadPublic
from dpnode.node.services.uploads import UploadStatus, plan_from_request

router = APIRouter(prefix="/uploads", tags=["datasets"])


def _public(found: UploadStatus) -> UploadPublic:
    return UploadPublic(
        id=found.id,
        received=found.received,
        size=found.size,
        block_rows=found.block_rows,
        expires_at=datetime.fromtimestamp(found.expires_at, UTC),
        dataset_id=found.dataset_id,
    )


@router.post("", status_code=status.HTTP_201_CREATED, responses=errors(403, 413, 422))
def create_upload(request: UploadCreate, uploads: UploadsDep, actor: CurrentUser) -> UploadPublic:
    """Open an upload session for a table sent in chunks; data owners and admins."""
    raw = request.model_dump(exclude={"tensors"})
    plan = plan_from_request(raw, [t.model_dump() for t in request.tensors])
    return _public(uploads.create(actor, plan))


@router.get("")
def list_uploads(uploads: UploadsDep, actor: CurrentUser) -> list[UploadPublic]:
    """Your upload sessions, oldest first."""
    return [_public(found) for found in uploads.list(actor)]


@router.get("/{upload_id}", responses=errors(404, 409))
def get_upload(upload_id: str, uploads: UploadsDep, actor: CurrentUser) -> UploadPublic:
    """How many bytes the node holds: where to resume."""
    return _public(uploads.status(actor, upload_id))


@router.put("/{upload_id}", responses=errors(404, 409, 413, 422))
def put_chunk(
    upload_id: str,
    body: ChunkBody,
    uploads: UploadsDep,
    actor: CurrentUser,
    offset: Annotated[int, Query(ge=0), IntegerText],
    sha256: Annotated[str | None, Header(alias="X-Content-SHA256")] = None,
) -> UploadPublic:
    """Write the chunk ``body`` at ``offset`` of the stream, checked against its SHA-256."""
    return _public(uploads.write(actor, upload_id, offset, body, sha256))


@router.post(
    "/{upload_id}/finalize", status_code=status.HTTP_201_CREATED, responses=errors(404, 409, 422)
)
def finalize_upload(
    upload_id: str,
    session: SessionDep,
    store: StoreDep,
    uploads: UploadsDep,
    actor: CurrentUser,
) -> DatasetPublic:
    """Check the whole table against its declarations and register the dataset."""
    return dataset_public(uploads.finalize(session, store, actor, upload_id))


@router.delete("/{upload_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(404, 409))
def delete_upload(upload_id: str, uploads: UploadsDep, actor: CurrentUser) -> None:
    """Abandon an upload session and free its disk space."""
    uploads.delete(actor, upload_id)

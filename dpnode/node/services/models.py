"""Models: named weight tensors, an optional architecture file, public or private."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.orm.interfaces import LoaderOption

from dpnode.core.errors import (
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    UploadRejectedError,
)
from dpnode.node.db.models import Model, ModelTag, ModelTensor, Role, User
from dpnode.node.services import audit, blobs
from dpnode.node.services.catalog import (
    check_item_name,
    delete_item,
    filter_catalog,
    get_item,
    normalise_tags,
    require_uploader,
)
from dpnode.node.services.tabular import check_array, check_name
from dpnode.node.storage import BlobStore, array_from_bytes, array_to_bytes

#: An architecture file is kept as an opaque attachment; the node never runs it.
MAX_ARCHITECTURE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ModelUpload:
    name: str
    description: str
    tags: Sequence[str]
    public: bool
    order: Sequence[str]
    weights: Mapping[str, npt.NDArray[Any]]
    architecture: bytes | None = None
    architecture_filename: str | None = None


def _load_options() -> list[LoaderOption]:
    return [selectinload(Model.tensors), selectinload(Model.tags), selectinload(Model.owner)]


def create_model(
    session: Session, store: BlobStore, actor: User, upload: ModelUpload, *, max_elements: int
) -> Model:
    """Store a model's weights (finite values only) and metadata.

    Every tensor is checked and its blob staged before ``session`` begins the transaction
    that registers the model, and a failure leaves nothing behind
    (:func:`blobs.register_with`), as for a dataset.

    Raises:
        PermissionDeniedError: ``actor`` is a data scientist.
        ConflictError: a model with this name exists.
        UploadRejectedError: bad names, dtypes, sizes or non-finite weights.
    """
    require_uploader(actor, "model")
    name = check_item_name("model", upload.name)
    tags = normalise_tags(upload.tags)
    if len(set(upload.order)) != len(upload.order) or set(upload.order) != set(upload.weights):
        raise UploadRejectedError("the weight names declared do not match the tensors sent")
    if not upload.weights:
        raise UploadRejectedError("a model needs at least one weight tensor")
    if upload.architecture is not None and len(upload.architecture) > MAX_ARCHITECTURE_BYTES:
        raise UploadRejectedError(f"the architecture file is over {MAX_ARCHITECTURE_BYTES} bytes")
    # Check every tensor before writing any bytes, so a refused upload leaves no blobs behind.
    for tensor_name in upload.order:
        check_name("weight", tensor_name)
        array = upload.weights[tensor_name]
        check_array("weight", tensor_name, array, max_elements)
        if array.dtype.kind == "f" and not np.all(np.isfinite(array)):
            raise UploadRejectedError(f"weight {tensor_name!r} has NaN or infinite values")
    pieces = [array_to_bytes(upload.weights[t]) for t in upload.order]
    if upload.architecture is not None:
        pieces.append(upload.architecture)
    staged = blobs.stage(store, ((piece,) for piece in pieces))

    def register(_: None, digests: list[str]) -> Model:
        architecture_blob = digests[-1] if upload.architecture is not None else None
        model = Model(
            name=name,
            description=upload.description,
            owner_id=actor.id,
            is_public=upload.public,
            architecture_filename=upload.architecture_filename if architecture_blob else None,
            architecture_blob=architecture_blob,
            tags=[ModelTag(tag=t) for t in tags],
        )
        for position, tensor_name in enumerate(upload.order):
            array = upload.weights[tensor_name]
            model.tensors.append(
                ModelTensor(
                    position=position,
                    name=tensor_name,
                    dtype=array.dtype.name,
                    shape=list(array.shape),
                    blob=digests[position],
                )
            )
        session.add(model)
        try:
            session.flush()
        except IntegrityError:  # a concurrent request took the name after the check above
            session.rollback()
            raise ConflictError(f"a model named {name!r} already exists") from None
        audit.record(
            session,
            actor,
            "model.upload",
            target_type="model",
            target_id=model.id,
            name=name,
            tensors=len(upload.order),
            public=upload.public,
            tags=tags,
        )
        session.commit()
        return get_model(session, model.id)

    return blobs.register_with(
        session, store, staged, lambda: check_model_name(session, name), register
    )


def check_model_name(session: Session, name: str) -> None:
    """Refuse a name another model has (in ``session``'s transaction, before the rows).

    Raises:
        ConflictError: a model with this name exists.
    """
    if session.scalar(select(Model.id).where(Model.name == name)) is not None:
        raise ConflictError(f"a model named {name!r} already exists")


def get_model(session: Session, ref: int | str) -> Model:
    """A model by id or by name."""
    return get_item(session, Model, ref, _load_options())


def search_models(
    session: Session, *, tags: Sequence[str] = (), text: str | None = None, limit: int = 100
) -> list[Model]:
    """Models carrying all of ``tags`` whose name or description contains ``text``."""
    query = filter_catalog(select(Model), Model, ModelTag.model_id, ModelTag.tag, tags, text)
    query = query.options(*_load_options()).order_by(Model.name).limit(limit)
    return list(session.scalars(query))


def delete_model(session: Session, store: BlobStore, actor: User, ref: int | str) -> None:
    """Delete a model and the array bytes nothing else uses (owner or admin)."""
    model = get_model(session, ref)
    delete_item(
        session, store, actor, model, [model.architecture_blob, *(t.blob for t in model.tensors)]
    )


def _may_read(actor: User, model: Model) -> None:
    if model.is_public or actor.role is Role.ADMIN or actor.id == model.owner_id:
        return
    raise PermissionDeniedError(
        f"model {model.name!r} is private: its weights stay on the node; use them as remote "
        "tensors and publish results"
    )


def read_weights(store: BlobStore, actor: User, model: Model) -> dict[str, npt.NDArray[Any]]:
    """Weights of a public model, or of one's own (or any, for an admin)."""
    _may_read(actor, model)
    return {
        t.name: array_from_bytes(store.get(t.blob), t.dtype, tuple(t.shape)) for t in model.tensors
    }


def read_architecture(store: BlobStore, actor: User, model: Model) -> bytes:
    _may_read(actor, model)
    if model.architecture_blob is None:
        raise NotFoundError(f"model {model.name!r} has no architecture file")
    return store.get(model.architecture_blob)


def download_weights(
    session: Session, store: BlobStore, actor: User, model: Model
) -> dict[str, npt.NDArray[Any]]:
    """``read_weights`` for a client, recorded in the audit log."""
    _may_read(actor, model)
    audit.record(session, actor, "model.download", target_type="model", target_id=model.id)
    session.commit()
    return read_weights(store, actor, model)


def download_architecture(session: Session, store: BlobStore, actor: User, model: Model) -> bytes:
    """``read_architecture`` for a client, recorded in the audit log."""
    _may_read(actor, model)
    if model.architecture_blob is None:
        raise NotFoundError(f"model {model.name!r} has no architecture file")
    audit.record(
        session, actor, "model.architecture_download", target_type="model", target_id=model.id
    )
    session.commit()
    return read_architecture(store, actor, model)

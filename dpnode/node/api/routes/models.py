from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Query, Response, status
from pydantic import ValidationError

from dpnode.core.errors import InvalidRequestError
from dpnode.node.api import frames
from dpnode.node.api.deps import (
    CurrentUser,
    Limit,
    LimitedBody,
    SessionDep,
    SettingsDep,
    StoreDep,
    item_ref,
)
from dpnode.node.api.openapi import MODEL_FRAME, errors, frame_body, frame_response
from dpnode.node.api.schemas import ModelManifest, ModelPublic, TensorPublic
from dpnode.node.db.models import Model
from dpnode.node.services import models

router = APIRouter(prefix="/models", tags=["models"])

ARCHITECTURE_TENSOR = "architecture"


def model_public(model: Model) -> ModelPublic:
    return ModelPublic(
        id=model.id,
        name=model.name,
        description=model.description,
        tags=[t.tag for t in model.tags],
        owner=model.owner.email,
        public=model.is_public,
        tensors=[TensorPublic(name=t.name, dtype=t.dtype, shape=t.shape) for t in model.tensors],
        architecture_filename=model.architecture_filename,
        created_at=model.created_at,
        updated_at=model.updated_at,
    )


def content_disposition(filename: str) -> str:
    """An attachment header for any filename (RFC 6266): headers carry only latin-1, so a
    name outside printable ASCII gets a sanitised fallback plus the exact UTF-8 name.

    >>> content_disposition('net.py')
    'attachment; filename="net.py"'
    >>> print(content_disposition('é.py'))
    attachment; filename="_.py"; filename*=UTF-8''%C3%A9.py
    """
    fallback = "".join(
        c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename
    )
    header = f'attachment; filename="{fallback}"'
    if fallback != filename:
        header += f"; filename*=UTF-8''{quote(filename, safe='')}"
    return header


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses=errors(403, 409),
    openapi_extra=frame_body(MODEL_FRAME),
)
def upload_model(
    body: LimitedBody,
    session: SessionDep,
    store: StoreDep,
    settings: SettingsDep,
    actor: CurrentUser,
) -> ModelPublic:
    """Upload weights (``weight/<name>`` tensors) and an optional architecture file."""
    raw, arrays = frames.decode(body, max_elements=settings.max_upload_elements)
    try:
        manifest = ModelManifest.model_validate(raw)
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid model manifest: {exc}") from None
    architecture = arrays.get(ARCHITECTURE_TENSOR)
    upload = models.ModelUpload(
        name=manifest.name,
        description=manifest.description,
        tags=manifest.tags,
        public=manifest.public,
        order=manifest.tensors,
        weights=frames.split(arrays, "weight"),
        architecture=architecture.tobytes() if architecture is not None else None,
        architecture_filename=manifest.architecture_filename,
    )
    model = models.create_model(
        session, store, actor, upload, max_elements=settings.max_upload_elements
    )
    return model_public(model)


@router.get("")
def list_models(
    session: SessionDep,
    _user: CurrentUser,
    tags: Annotated[list[str], Query()] = [],  # noqa: B006  (FastAPI copies defaults)
    text: str | None = None,
    limit: Limit = 100,
) -> list[ModelPublic]:
    """Models with all the given tags whose name or description contains ``text``."""
    return [
        model_public(m) for m in models.search_models(session, tags=tags, text=text, limit=limit)
    ]


@router.get("/{model_ref}", responses=errors(404))
def get_model(model_ref: str, session: SessionDep, _user: CurrentUser) -> ModelPublic:
    return model_public(models.get_model(session, item_ref(model_ref)))


@router.delete("/{model_ref}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(403, 404))
def delete_model(model_ref: str, session: SessionDep, store: StoreDep, actor: CurrentUser) -> None:
    """Delete a model (its owner or an admin)."""
    models.delete_model(session, store, actor, item_ref(model_ref))


@router.get(
    "/{model_ref}/weights",
    response_class=Response,
    responses=frame_response("the weights, `<name>` tensors") | errors(403, 404),
)
def download_weights(
    model_ref: str, session: SessionDep, store: StoreDep, actor: CurrentUser
) -> Response:
    """Weights of a public model (private ones: the owner and admins only)."""
    model = models.get_model(session, item_ref(model_ref))
    weights = models.download_weights(session, store, actor, model)
    body = frames.encode(weights, {"model": model.name, "tensors": list(weights)})
    return Response(body, media_type=frames.MEDIA_TYPE)


@router.get(
    "/{model_ref}/architecture",
    response_class=Response,
    responses={
        200: {
            "description": "the architecture file as uploaded",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        },
        **errors(403, 404),
    },
)
def download_architecture(
    model_ref: str, session: SessionDep, store: StoreDep, actor: CurrentUser
) -> Response:
    """The architecture file as uploaded (public models, or the owner and admins)."""
    model = models.get_model(session, item_ref(model_ref))
    data = models.download_architecture(session, store, actor, model)
    filename = model.architecture_filename or "architecture"
    return Response(
        data,
        media_type="application/octet-stream",
        headers={"Content-Disposition": content_disposition(filename)},
    )

"""The OpenAPI document, as a client generator needs it.

FastAPI documents its own 422 body and nothing else; the node answers every error as
``{"error": code, "detail": message}`` (see ``dpnode.node.app``). Routes name the errors their
services raise with :func:`errors`; the ones every route of a kind can answer are derived
here from its dependencies (a token: 401; an admin: 403; a size-limited body: 413;
parameters or a body: 422), so a new route cannot forget them. Binary bodies are read by a
dependency, which FastAPI cannot see: routes describe them with :func:`frame_body`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from dpnode.node.api import deps, frames
from dpnode.node.api.schemas import ErrorBody

ERROR_REF = {"$ref": "#/components/schemas/Error"}

#: What each status means on this node (the body's ``error`` code says which case).
DESCRIPTIONS: dict[int, str] = {
    401: "Not logged in, or the token is bad, expired, or of a deactivated account "
    "(`unauthenticated`).",
    403: "Logged in but not allowed (`forbidden`); for publishes also a budget policy's "
    "refusal (`policy_refused`, `budget_exceeded`, `approval_required`), whose body names "
    "the rule and policy revision.",
    404: "No such item (`not_found`, `unknown_structure`).",
    409: "Conflicts with the node's state: a name taken, a request already answered, a "
    "retried publish still running (`conflict`, `publish_in_progress`) or charged and lost "
    "with the node process computing it (`publish_lost`).",
    413: "The request body is over the node's size limit (`payload_too_large`).",
    422: "Malformed or inconsistent input, or a graph the engine refuses (`invalid_request`, "
    "`upload_rejected`, `invalid_graph`, `evaluation_error`, `quota_exceeded`, ...).",
    429: "Too many attempts: wait the seconds the `Retry-After` header says (`rate_limited`).",
    500: "The node failed unexpectedly (`internal_error`, `storage_error`).",
    503: "Too busy: nothing was done; send it again after the seconds the `Retry-After` "
    "header says (`overloaded`, `database_busy`; for a publish also `evaluation_unavailable`: "
    "the node's compute cluster is out of reach, nothing was charged).",
}

_AUTHENTICATED = {deps.get_current_user, deps.get_token_user_id}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route for error statuses its service raises.

    >>> sorted(errors(404, 409))
    [404, 409]
    """
    return {status: {"description": DESCRIPTIONS[status]} for status in statuses}


_TENSOR_FRAME = (
    "A tensor frame is a safetensors file: an 8-byte little-endian header length, a JSON "
    "header naming each tensor's dtype, shape and byte range, then the raw bytes; nothing in "
    "it can execute. Its JSON manifest rides in the header's `__metadata__` under "
    f"`{frames.MANIFEST_KEY}`. Media type `{frames.MEDIA_TYPE}` (the node reads the body "
    "whatever its Content-Type). See docs/api.md, Tensor frames."
)

DATASET_FRAME = (
    "A tensor frame of the dataset: tensors `data/<column>` and optionally `mock/<column>`; "
    'manifest `{"name", "description", "tags", "columns", "bounds", "categories", "clamp", '
    '"fill", "subject_id", "strings", "mock_columns", "mock_strings"}`.\n\n' + _TENSOR_FRAME
)

MODEL_FRAME = (
    "A tensor frame of the model: tensors `weight/<name>` and optionally `architecture` (the "
    'file\'s bytes as uint8); manifest `{"name", "description", "tags", "public", "tensors", '
    '"architecture_filename"}`.\n\n' + _TENSOR_FRAME
)

GRAPH_FRAME = (
    "A graph frame, as the SDK records it: `DPG\\x01`, a u64 little-endian header length, "
    'a canonical JSON header `{"version", "nodes", "outputs"}` (each node an `op` of the '
    "prim vocabulary with its `args`, `attrs` and public `constant`s), then the constants' "
    "raw little-endian bytes at 16-aligned offsets. Nothing in it is executed, unpickled or "
    "imported. See dpnode/core/engine/wire.py and docs/prims.md."
)


def frame_body(description: str) -> dict[str, Any]:
    """The ``openapi_extra=`` of a route whose body is a binary frame (read by
    ``LimitedBody``, which FastAPI cannot describe)."""
    return {
        "requestBody": {
            "required": True,
            "description": description,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    }


def frame_response(description: str) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` entry of a route that answers with a tensor frame."""
    binary = {"schema": {"type": "string", "format": "binary"}}
    return {200: {"description": description, "content": {frames.MEDIA_TYPE: binary}}}


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any]]:
    for sub in dependant.dependencies:
        if sub.call is not None:
            yield sub.call
        yield from _calls(sub)


def derived_statuses(route: APIRoute) -> set[int]:
    """The error statuses a route answers because of its dependencies and parameters."""
    calls = set(_calls(route.dependant))
    # any request may meet a full node (InFlightLimit) or carry a NUL in its URL (RefuseNul)
    statuses = {422, 500, 503}
    if calls & _AUTHENTICATED:
        statuses.add(401)
    if deps.get_admin in calls:
        statuses.add(403)
    if calls & {deps.read_limited_body, deps.read_catalog_body}:
        statuses |= {413, 422}
    if route.dependant.body_params:  # a JSON body, read whole by RefuseNul up to its limit
        statuses.add(413)
    return statuses


def operation_id(route: APIRoute) -> str:
    """A route's operationId: its endpoint's name (``list_datasets``, ``publish``)."""
    return route.name


def build(
    app: FastAPI, routes: Iterable[BaseRoute], components: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The app's OpenAPI document, with the node's error bodies on every operation.

    ``routes`` are the API routes as their routers declared them (their dependencies are
    read there; operations are matched by their unique operationId); ``components``: the
    schemas of bodies that routes read themselves.
    """
    schema = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(components or {})
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Error"] = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    error_content = {"application/json": {"schema": ERROR_REF}}
    by_id = {operation_id(r): r for r in routes if isinstance(r, APIRoute)}
    for operations in schema["paths"].values():
        for operation in operations.values():
            # a route added to the app without its router here still gets the error body
            route = by_id.get(operation["operationId"])
            derived = {500, 503} if route is None else derived_statuses(route)
            responses = operation.setdefault("responses", {})
            for status in derived | {int(s) for s in responses if s.isdigit()}:
                if status < 400:
                    continue
                entry = responses.setdefault(str(status), {})
                entry["description"] = DESCRIPTIONS[status]
                entry["content"] = error_content
            operation["responses"] = dict(sorted(responses.items()))
    return schema


def install(
    app: FastAPI, routes: Iterable[BaseRoute], components: dict[str, Any] | None = None
) -> None:
    """Serve :func:`build`'s document (computed once) as the app's ``/openapi.json``."""
    declared = list(routes)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app, declared, components)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

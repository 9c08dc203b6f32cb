from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Query, Response, status
from pydantic import ValidationError

from dpnode.core.errors import InvalidRequestError, UploadRejectedError
from dpnode.node.api import frames
from dpnode.node.api.deps import (
    ContextDep,
    CurrentUser,
    IdempotencyKey,
    Limit,
    LimitedBody,
    SessionDep,
    SettingsDep,
    StoreDep,
    item_ref,
)
from dpnode.node.api.openapi import DATASET_FRAME, errors, frame_body, frame_response
from dpnode.node.api.routes.approvals import budget_public
from dpnode.node.api.schemas import (
    ColumnPublic,
    DatasetBudgetPublic,
    DatasetManifest,
    DatasetPublic,
    MockSynthesisCreate,
    SynthesisCreate,
    SynthesisJobPublic,
    SynthesisPublic,
)
from dpnode.node.context import NodeContext
from dpnode.node.db.models import Dataset
from dpnode.node.services import dataset_budgets, datasets, mock_synthesis, publish, synthesis
from dpnode.node.services.tabular import ColumnSpec

router = APIRouter(prefix="/datasets", tags=["datasets"])


def dataset_public(dataset: Dataset) -> DatasetPublic:
    return DatasetPublic(
        id=dataset.id,
        name=dataset.name,
        description=dataset.description,
        tags=[t.tag for t in dataset.tags],
        owner=dataset.owner.email,
        row_count=dataset.row_count,
        columns=[
            ColumnPublic(
                name=c.name,
                dtype=c.dtype,
                shape=c.row_shape,
                bounds=(c.lower, c.upper),
                categories=c.categories,
            )
            for c in dataset.columns
        ],
        subject_id=dataset.subject_column,
        subject_count=dataset.subject_count,
        max_rows_per_subject=dataset.max_rows_per_subject,
        has_mock=dataset.mock_row_count is not None,
        mock_row_count=dataset.mock_row_count,
        created_at=dataset.created_at,
        updated_at=dataset.updated_at,
        synthetic=dataset.provenance,
        mock_synthetic=mock_synthesis.mock_public(dataset),
    )


def parse_manifest(raw: dict[str, Any]) -> DatasetManifest:
    try:
        return DatasetManifest.model_validate(raw)
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid dataset manifest: {exc}") from None


def _with_strings(arrays: dict[str, Any], strings: dict[str, list[str | None]]) -> dict[str, Any]:
    clash = set(arrays) & set(strings)
    if clash:
        raise InvalidRequestError(f"columns sent both as tensors and as strings: {sorted(clash)}")
    return arrays | {k: np.array(v, dtype=object) for k, v in strings.items()}


def upload_from_frame(body: bytes, max_elements: int) -> datasets.DatasetUpload:
    """Decode an upload frame: tensors ``data/<column>`` and ``mock/<column>``, plus a manifest."""
    raw_manifest, arrays = frames.decode(body, max_elements=max_elements)
    m = parse_manifest(raw_manifest)
    real = _with_strings(frames.split(arrays, "data"), m.strings)
    mock_arrays = frames.split(arrays, "mock")
    has_mock = bool(mock_arrays or m.mock_strings)
    return datasets.DatasetUpload(
        name=m.name,
        description=m.description,
        tags=m.tags,
        spec=ColumnSpec(
            bounds=m.bounds,
            categories=m.categories,
            clamp=m.clamp if isinstance(m.clamp, bool) else frozenset(m.clamp),
            fill=m.fill,
            subject_id=m.subject_id,
        ),
        order=m.columns,
        columns=real,
        mock_order=m.mock_columns if has_mock else None,
        mock=_with_strings(mock_arrays, m.mock_strings) if has_mock else None,
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses=errors(403, 409),
    openapi_extra=frame_body(DATASET_FRAME),
)
def upload_dataset(
    body: LimitedBody,
    session: SessionDep,
    store: StoreDep,
    settings: SettingsDep,
    actor: CurrentUser,
) -> DatasetPublic:
    """Upload a dataset as a tensor frame (see ``docs/api.md``); data owners and admins."""
    upload = upload_from_frame(body, settings.max_upload_elements)
    if len(upload.order) > settings.max_columns:
        raise UploadRejectedError(
            f"a dataset may have at most {settings.max_columns} columns; this one has "
            f"{len(upload.order)}"
        )
    dataset = datasets.create_dataset(
        session, store, actor, upload, max_elements=settings.max_upload_elements
    )
    return dataset_public(dataset)


@router.get("")
def list_datasets(
    session: SessionDep,
    _user: CurrentUser,
    tags: Annotated[list[str], Query()] = [],  # noqa: B006  (FastAPI copies defaults)
    text: str | None = None,
    limit: Limit = 100,
) -> list[DatasetPublic]:
    """Datasets with all the given tags whose name or description contains ``text``."""
    found = datasets.search_datasets(session, tags=tags, text=text, limit=limit)
    return [dataset_public(d) for d in found]


@router.get("/{dataset_ref}", responses=errors(404))
def get_dataset(
    dataset_ref: str, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> DatasetPublic:
    """One dataset's public metadata, by id or name; for its owner and admins also its cap
    and what all users spent of it (``budget``; null for anyone else)."""
    dataset = datasets.get_dataset(session, item_ref(dataset_ref))
    public = dataset_public(dataset)
    if dataset_budgets.may_see(user, dataset):
        found = dataset_budgets.dataset_budget(session, settings, user, dataset)
        public.budget = budget_public(found)
    return public


@router.get("/{dataset_ref}/budget", responses=errors(403, 404))
def get_dataset_budget(
    dataset_ref: str, session: SessionDep, settings: SettingsDep, user: CurrentUser
) -> DatasetBudgetPublic:
    """The dataset's cap under the policy in force and what all users together spent of it
    (its owner and admins: the figure tells how much others queried it)."""
    dataset = datasets.get_dataset(session, item_ref(dataset_ref))
    return budget_public(dataset_budgets.dataset_budget(session, settings, user, dataset))


@router.delete("/{dataset_ref}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(403, 404))
def delete_dataset(
    dataset_ref: str, session: SessionDep, store: StoreDep, actor: CurrentUser
) -> None:
    """Delete a dataset (its owner or an admin)."""
    datasets.delete_dataset(session, store, actor, item_ref(dataset_ref))


def _frame_response(dataset: Dataset, arrays: dict[str, Any], kind: str) -> Response:
    manifest: dict[str, Any] = {"dataset": dataset.name, "kind": kind, "columns": list(arrays)}
    if kind == "mock":  # where it came from, with it: a handle read before may be older
        manifest["synthetic"] = mock_synthesis.mock_public(dataset)
    return Response(frames.encode(arrays, manifest), media_type=frames.MEDIA_TYPE)


@router.get(
    "/{dataset_ref}/mock",
    response_class=Response,
    responses=frame_response("the mock columns, `<column>` tensors") | errors(404),
)
def download_mock(
    dataset_ref: str, session: SessionDep, store: StoreDep, actor: CurrentUser
) -> Response:
    """The dataset's mock data (fake by definition), as a tensor frame."""
    dataset, arrays = datasets.download_mock(session, store, actor, item_ref(dataset_ref))
    return _frame_response(dataset, arrays, "mock")


@router.get(
    "/{dataset_ref}/data",
    response_class=Response,
    responses=frame_response("the real columns, `<column>` tensors") | errors(403, 404),
)
def download_data(
    dataset_ref: str, session: SessionDep, store: StoreDep, actor: CurrentUser
) -> Response:
    """Real values, for the dataset's owner and admins; data scientists are refused."""
    dataset = datasets.get_dataset(session, item_ref(dataset_ref))
    arrays = datasets.download_real(session, store, actor, dataset)
    return _frame_response(dataset, arrays, "data")


@router.post(
    "/{dataset_ref}/synthesize",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=SynthesisJobPublic,
    response_class=Response,
    responses=errors(403, 404, 409, 422, 503),
)
def synthesize(
    dataset_ref: str,
    body: SynthesisCreate,
    context: ContextDep,
    actor: CurrentUser,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """A differentially private synthetic copy of the dataset (MST or AIM), charged to the
    caller's budget as one ledger row, then computed as a job: answered ``202`` with its id,
    followed at ``GET /synthesis/{job}`` until it holds the new dataset the caller owns and
    may download (``GET /datasets/{ref}/data``). Refused with nothing charged, before any
    value is read, on a bad request, several rows per subject, a domain beyond the memory
    quota (``quota_exceeded``), or by the policy and the budget."""
    request = synthesis.SynthesisRequest(**body.model_dump())

    def answer(done: synthesis.Synthesized) -> dict[str, Any]:
        made = SynthesisPublic(dataset=dataset_public(done.dataset), receipt=done.receipt)
        return made.model_dump(mode="json")

    started = synthesis.synthesize(
        context, actor.id, item_ref(dataset_ref), request, answer, idempotency_key
    )
    return _accepted(context, actor.id, idempotency_key, started)


def _accepted(
    context: NodeContext,
    actor_id: int,
    idempotency_key: str | None,
    started: synthesis.Started | synthesis.Replayed,
) -> Response:
    """A started synthesis's ``202``: its job (the answer stored under the key), or the
    answer stored under it already."""
    accepted = status.HTTP_202_ACCEPTED
    if isinstance(started, synthesis.Replayed):
        return Response(started.response, status_code=accepted, media_type="application/json")
    content = SynthesisJobPublic(job=started.job, state="running").model_dump_json().encode()
    if idempotency_key is not None:
        publish.answered(context, actor_id, idempotency_key, content)
    return Response(content, status_code=accepted, media_type="application/json")


@router.post(
    "/{dataset_ref}/mock/synthesize",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=SynthesisJobPublic,
    response_class=Response,
    responses=errors(403, 404, 409, 422, 503),
)
def synthesize_mock(
    dataset_ref: str,
    body: MockSynthesisCreate,
    context: ContextDep,
    actor: CurrentUser,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Make the dataset's mock a differentially private synthetic table (MST or AIM), for
    its owner or an admin, paid from the dataset's cap (not the caller's budget) as one
    ledger row, then computed as a job: answered ``202`` with its id, followed at
    ``GET /synthesis/{job}`` until it holds the dataset, whose ``mock_synthetic`` says
    where its mock came from. Refused with nothing charged, before any value is read, on a
    bad request, a dataset the caller does not own (403), one the policy does not cap
    (``policy_refused``, rule ``datasets.NAME``), or a mock that does not fit the cap."""
    request = synthesis.SynthesisRequest(**body.model_dump())

    def answer(dataset: Dataset, receipt: dict[str, Any]) -> dict[str, Any]:
        made = SynthesisPublic(dataset=dataset_public(dataset), receipt=receipt)
        return made.model_dump(mode="json")

    started = mock_synthesis.synthesize_mock(
        context, actor.id, item_ref(dataset_ref), request, answer, idempotency_key
    )
    return _accepted(context, actor.id, idempotency_key, started)

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from dpnode.node.api.deps import CurrentUser, Limit, ReadSessionDep
from dpnode.node.api.routes.datasets import dataset_public
from dpnode.node.api.routes.models import model_public
from dpnode.node.api.schemas import SearchResults
from dpnode.node.services import datasets, models

router = APIRouter(tags=["search"])


@router.get("/search")
def search(
    session: ReadSessionDep,
    _user: CurrentUser,
    tags: Annotated[list[str], Query()] = [],  # noqa: B006  (FastAPI copies defaults)
    text: str | None = None,
    kind: Literal["any", "dataset", "model"] = "any",
    limit: Limit = 100,
) -> SearchResults:
    """Datasets and models carrying all of ``tags`` and matching ``text`` (name, description)."""
    found_datasets = (
        datasets.search_datasets(session, tags=tags, text=text, limit=limit)
        if kind in ("any", "dataset")
        else []
    )
    found_models = (
        models.search_models(session, tags=tags, text=text, limit=limit)
        if kind in ("any", "model")
        else []
    )
    return SearchResults(
        datasets=[dataset_public(d) for d in found_datasets],
        models=[model_public(m) for m in found_models],
    )

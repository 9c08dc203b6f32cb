from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from node import API_VERSION, __version__
from node.api.deps import SessionDep
from node.api.schemas import Health, Version
from node.engine import PRIM_VERSION

router = APIRouter(tags=["meta"])


@router.get("/health")
def health(session: SessionDep) -> Health:
    """Liveness and database reachability (used by the container's healthcheck)."""
    session.execute(text("SELECT 1"))
    return Health(status="ok", database=session.get_bind().dialect.name)


@router.get("/version")
def version() -> Version:
    return Version(dpnode=__version__, api=API_VERSION, prims=PRIM_VERSION)

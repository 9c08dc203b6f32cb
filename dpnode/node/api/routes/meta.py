from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from dpnode import __version__
from dpnode.core.engine import PRIM_VERSION
from dpnode.node import API_VERSION
from dpnode.node.api.deps import ReadSessionDep
from dpnode.node.api.schemas import Health, Version

router = APIRouter(tags=["meta"])


@router.get("/health")
def health(session: ReadSessionDep) -> Health:
    """Liveness and database reachability (used by the container's healthcheck)."""
    session.execute(text("SELECT 1"))
    return Health(status="ok", database=session.get_bind().dialect.name)


@router.get("/version")
def version() -> Version:
    return Version(dpnode=__version__, api=API_VERSION, prims=PRIM_VERSION)

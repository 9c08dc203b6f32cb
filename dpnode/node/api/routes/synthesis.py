"""Synthesis jobs: where a charged synthesis stands (``dpnode.node.services.synthesis_jobs``)."""

from __future__ import annotations

from fastapi import APIRouter

from dpnode.node.api.deps import CurrentUser, SessionDep
from dpnode.node.api.openapi import errors
from dpnode.node.api.schemas import SynthesisJobPublic
from dpnode.node.services import synthesis_jobs

router = APIRouter(prefix="/synthesis", tags=["datasets"])


@router.get("/{job_id}", responses=errors(404))
def synthesis_job(job_id: int, session: SessionDep, actor: CurrentUser) -> SynthesisJobPublic:
    """A synthesis job, for its requester or an admin: ``running`` with its ``progress``
    (rounds or steps ``done`` of ``total``, and the ``phase``), ``answered`` with the new
    ``dataset`` and the charge's ``receipt``, or ``failed`` with an ``error`` (the charge
    stands). Another user's job is ``not_found``."""
    job = synthesis_jobs.load(session, actor, job_id)
    return SynthesisJobPublic.model_validate(synthesis_jobs.job_public(job))

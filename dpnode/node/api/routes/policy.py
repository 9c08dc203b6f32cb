from __future__ import annotations

from fastapi import APIRouter

from dpnode.node.api.deps import AdminUser, Limit, PathId, SessionDep
from dpnode.node.api.openapi import errors
from dpnode.node.api.schemas import PolicyApply, PolicyRevisionPublic
from dpnode.node.db.models import PolicyRevision
from dpnode.node.services import policy as service

router = APIRouter(prefix="/policy", tags=["policy"])


def revision_public(row: PolicyRevision, **more: object) -> PolicyRevisionPublic:
    return PolicyRevisionPublic(
        revision=row.id,
        at=row.at,
        created_by=row.created_by,
        reason=row.reason,
        name=row.name,
        content_hash=row.content_hash,
        document=row.document,
        source=row.source,
        **more,  # type: ignore[arg-type]
    )


@router.get("")
def get_policy(session: SessionDep, _admin: AdminUser) -> PolicyRevisionPublic:
    """The budget policy in force (admins)."""
    in_force = service.current(session)
    if in_force.revision is None:
        policy = in_force.policy
        return PolicyRevisionPublic(
            revision=None,
            at=None,
            created_by="",
            reason="no policy was applied: the built-in default is in force",
            name=policy.name,
            content_hash=policy.content_hash(),
            document=policy.to_dict(),
            source="",
        )
    return revision_public(service.get_revision(session, in_force.revision))


@router.put("")
def apply_policy(session: SessionDep, admin: AdminUser, body: PolicyApply) -> PolicyRevisionPublic:
    """Apply a new policy (TOML text or a document), in force from the next publish (admins).

    Applying the policy already in force stores nothing (``changed`` is false).
    """
    policy = service.parse(body.toml, body.document)
    source = body.toml if body.toml is not None else ""
    applied = service.apply(session, admin, policy, reason=body.reason, source=source)
    return revision_public(applied.revision, changed=applied.changed, warnings=applied.warnings)


@router.get("/revisions")
def list_revisions(
    session: SessionDep,
    _admin: AdminUser,
    limit: Limit = 100,
) -> list[PolicyRevisionPublic]:
    """Every policy revision, newest first (admins)."""
    return [revision_public(r) for r in service.history(session, limit=limit)]


@router.get("/revisions/{revision}", responses=errors(404))
def get_revision(session: SessionDep, _admin: AdminUser, revision: PathId) -> PolicyRevisionPublic:
    """One policy revision (admins)."""
    return revision_public(service.get_revision(session, revision))

from __future__ import annotations

from fastapi import APIRouter

from dpnode.node.api.deps import AdminUser, Limit, QueryId, SessionDep
from dpnode.node.api.schemas import AuditEventPublic
from dpnode.node.services import audit

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get("")
def list_audit_events(
    session: SessionDep,
    _admin: AdminUser,
    action: str | None = None,
    actor_id: QueryId = None,
    before_id: QueryId = None,
    limit: Limit = 100,
) -> list[AuditEventPublic]:
    """The audit log, newest first (admins)."""
    events = audit.list_events(
        session, action=action, actor_id=actor_id, before_id=before_id, limit=limit
    )
    return [AuditEventPublic.model_validate(e) for e in events]

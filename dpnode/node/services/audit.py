"""The append-only audit log: who did what, when. Written in the caller's transaction."""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import Connection, insert, select
from sqlalchemy.orm import Session

from dpnode.node.db.base import table_of, utcnow
from dpnode.node.db.direct import Direct, connection_of
from dpnode.node.db.models import AuditEvent


class Actor(Protocol):
    """Who acted: a ``User``, or a plain row with the same fields (the publish transaction's)."""

    @property
    def id(self) -> int: ...

    @property
    def email(self) -> str: ...


def record(
    session: Session,
    actor: Actor | None,
    action: str,
    *,
    target_type: str | None = None,
    target_id: int | None = None,
    **detail: Any,
) -> AuditEvent:
    """Add one audit line; it commits with the change it describes."""
    event = AuditEvent(
        actor_id=actor.id if actor is not None else None,
        actor_email=actor.email if actor is not None else None,
        action=action,
        target_type=target_type,
        target_id=target_id,
        detail=detail,
    )
    session.add(event)
    return event


_AUDIT = table_of(AuditEvent)
_KEYS = ("at", "actor_id", "actor_email", "action", "target_type", "target_id", "detail")
_INSERT = Direct(insert(_AUDIT), _KEYS)


def append(
    on: Session | Connection,
    actor: Actor | None,
    action: str,
    *,
    target_type: str | None = None,
    target_id: int | None = None,
    **detail: Any,
) -> None:
    """:func:`record`, written at once with one INSERT on the cursor (:class:`Direct`) rather
    than by the ORM at the next flush: for the publish transaction, which writes its few rows
    without a unit of work."""
    row = {
        "at": utcnow(),
        "actor_id": actor.id if actor is not None else None,
        "actor_email": actor.email if actor is not None else None,
        "action": action,
        "target_type": target_type,
        "target_id": target_id,
        "detail": detail,
    }
    _INSERT.execute(connection_of(on), row)


def list_events(
    session: Session,
    *,
    action: str | None = None,
    actor_id: int | None = None,
    limit: int = 100,
    before_id: int | None = None,
) -> list[AuditEvent]:
    """Newest first, optionally filtered; ``before_id`` pages backwards."""
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if action is not None:
        query = query.where(AuditEvent.action == action)
    if actor_id is not None:
        query = query.where(AuditEvent.actor_id == actor_id)
    if before_id is not None:
        query = query.where(AuditEvent.id < before_id)
    return list(session.scalars(query))

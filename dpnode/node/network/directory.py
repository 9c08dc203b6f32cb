"""A network's directory: join tokens, members, their catalogs, and search across them.

Each function owns its transaction (it commits), and every change a person makes (a token
issued or revoked, a member joining, leaving or removed) writes an audit line in it.
Heartbeats are not audited: one a member every few seconds would bury the log; the member's
``last_seen_at`` says when it last answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dpnode.core.errors import (
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
)
from dpnode.node.db.models import NetworkJoinToken, NetworkMember, User
from dpnode.node.network.schemas import (
    CREDENTIAL_PREFIX,
    TOKEN_PREFIX,
    Catalog,
    JoinRequest,
    catalog_digest,
)
from dpnode.node.services import audit
from dpnode.node.services.catalog import normalise_tags
from dpnode.node.services.security import new_secret, secret_digest
from dpnode.node.settings import Settings


def _now() -> datetime:
    return datetime.now(UTC)


def issue_token(
    session: Session, settings: Settings, actor: User | None, note: str, operator: str = ""
) -> tuple[NetworkJoinToken, str]:
    """A new join token (its row, and the token itself, which is shown once)."""
    token = new_secret(TOKEN_PREFIX)
    row = NetworkJoinToken(
        digest=secret_digest(token),
        note=note,
        created_by=actor.email if actor is not None else f"command line ({operator})",
        expires_at=_now() + timedelta(seconds=settings.network_token_lifetime_seconds),
    )
    session.add(row)
    session.flush()
    audit.record(
        session, actor, "network.token.issue", target_type="join_token", target_id=row.id,
        note=note, operator=operator or None,
    )  # fmt: skip
    session.commit()
    return row, token


def list_tokens(session: Session) -> list[NetworkJoinToken]:
    """Every join token, newest first."""
    return list(session.scalars(select(NetworkJoinToken).order_by(NetworkJoinToken.id.desc())))


def revoke_token(
    session: Session, actor: User | None, token_id: int, operator: str = ""
) -> NetworkJoinToken:
    """Revoke a join token: it can no longer be used to join (a member that joined with it
    stays; remove it with :func:`remove_member`).

    Raises:
        NotFoundError: no such token.
    """
    row = session.get(NetworkJoinToken, token_id)
    if row is None:
        raise NotFoundError(f"no join token {token_id}; see 'dpnode network token list'")
    if row.revoked_at is None:
        row.revoked_at = _now()
        audit.record(
            session, actor, "network.token.revoke", target_type="join_token", target_id=row.id,
            operator=operator or None,
        )  # fmt: skip
    session.commit()
    return row


def check_catalog(settings: Settings, catalog: Catalog) -> None:
    """Refuse a catalog over the network's limits, or with tags a node would not accept.

    Raises:
        InvalidRequestError: too many datasets or columns, or a malformed tag.
    """
    if len(catalog.datasets) > settings.network_max_datasets:
        raise InvalidRequestError(
            f"a catalog of {len(catalog.datasets)} datasets is over this network's limit of "
            f"{settings.network_max_datasets}; share fewer datasets"
        )
    for dataset in catalog.datasets:
        if len(dataset.columns) > settings.network_max_columns:
            raise InvalidRequestError(
                f"dataset {dataset.name!r} has {len(dataset.columns)} columns, over this "
                f"network's limit of {settings.network_max_columns}"
            )


def join(session: Session, settings: Settings, request: JoinRequest) -> tuple[NetworkMember, str]:
    """Exchange a join token for a member credential; the member's catalog is stored.

    Raises:
        AuthenticationError: the token is unknown, used, revoked or expired.
        ConflictError: a member of that name exists.
        InvalidRequestError: the catalog is over the network's limits.
    """
    check_catalog(settings, request.catalog)
    token = session.scalar(
        select(NetworkJoinToken)
        .where(NetworkJoinToken.digest == secret_digest(request.token))
        .with_for_update()
    )
    now = _now()
    if token is None or token.revoked_at or token.used_at or token.expires_at <= now:
        raise AuthenticationError(
            "the join token is unknown, already used, revoked or expired; ask the network's "
            "admin for a new one ('dpnode network token create' on the network)"
        )
    if session.scalar(select(NetworkMember.id).where(NetworkMember.name == request.name)):
        raise ConflictError(
            f"a member named {request.name!r} is already in this network; join under another "
            "name (--name), or leave first"
        )
    credential = new_secret(CREDENTIAL_PREFIX)
    member = NetworkMember(
        name=request.name,
        url=request.url.rstrip("/"),
        credential_digest=secret_digest(credential),
        joined_at=now,
        last_seen_at=now,
        catalog=request.catalog.model_dump(mode="json")["datasets"],
        catalog_digest=catalog_digest(request.catalog),
        catalog_updated_at=now,
    )
    # Claimed by a conditional update, so that two joins racing with one token cannot both
    # see it unused (SQLite takes no row lock for the read above).
    claimed = session.execute(
        update(NetworkJoinToken)
        .where(NetworkJoinToken.id == token.id, NetworkJoinToken.used_at.is_(None))
        .values(used_at=now, used_by=request.name)
    )
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        raise AuthenticationError("the join token was used by another node a moment ago")
    session.add(member)
    try:
        session.flush()
    except IntegrityError:  # the same name joined at the same moment
        session.rollback()
        raise ConflictError(f"a member named {request.name!r} is already in this network") from None
    audit.record(
        session, None, "network.join", target_type="network_member", target_id=member.id,
        name=member.name, url=member.url, token_id=token.id,
        datasets=len(request.catalog.datasets),
    )  # fmt: skip
    session.commit()
    return member, credential


def member_of(session: Session, credential: str) -> NetworkMember:
    """The member a credential belongs to.

    Raises:
        AuthenticationError: no member holds it (never issued, left, or removed).
    """
    member = session.scalar(
        select(NetworkMember).where(NetworkMember.credential_digest == secret_digest(credential))
    )
    if member is None:
        raise AuthenticationError(
            "this node is not a member of the network (it left or was removed); join again "
            "with a new token: dpnode network join URL --token ..."
        )
    return member


def heartbeat(session: Session, member: NetworkMember) -> str:
    """Note that ``member`` answered; the digest of the catalog the network holds for it."""
    member.last_seen_at = _now()
    session.commit()
    return member.catalog_digest


def push_catalog(
    session: Session, settings: Settings, member: NetworkMember, catalog: Catalog
) -> str:
    """Replace a member's catalog (a heartbeat too); its digest.

    Raises:
        InvalidRequestError: the catalog is over the network's limits (nothing is stored).
    """
    check_catalog(settings, catalog)
    now = _now()
    member.catalog = catalog.model_dump(mode="json")["datasets"]
    member.catalog_digest = catalog_digest(catalog)
    member.catalog_updated_at = member.last_seen_at = now
    audit.record(
        session, None, "network.catalog", target_type="network_member", target_id=member.id,
        name=member.name, datasets=len(catalog.datasets),
    )  # fmt: skip
    session.commit()
    return member.catalog_digest


def leave(session: Session, member: NetworkMember) -> None:
    """A member leaves: its entry and catalog are deleted."""
    audit.record(
        session, None, "network.leave", target_type="network_member", target_id=member.id,
        name=member.name, url=member.url,
    )  # fmt: skip
    session.delete(member)
    session.commit()


def remove_member(
    session: Session, actor: User | None, ref: int | str, operator: str = ""
) -> NetworkMember:
    """The network's admin removes a member (by id or name): its credential stops working.

    Raises:
        NotFoundError: no such member.
    """
    column = NetworkMember.id if isinstance(ref, int) else NetworkMember.name
    member = session.scalar(select(NetworkMember).where(column == ref))
    if member is None:
        raise NotFoundError(f"no member {ref!r}; see 'dpnode network members'")
    audit.record(
        session, actor, "network.remove", target_type="network_member", target_id=member.id,
        name=member.name, url=member.url, operator=operator or None,
    )  # fmt: skip
    session.delete(member)
    session.commit()
    return member


@dataclass(frozen=True)
class MemberState:
    member: NetworkMember
    reachable: bool

    def public(self) -> dict[str, Any]:
        m = self.member
        return {
            "id": m.id,
            "name": m.name,
            "url": m.url,
            "reachable": self.reachable,
            "last_seen_at": m.last_seen_at,
            "joined_at": m.joined_at,
            "catalog_updated_at": m.catalog_updated_at,
            "datasets": len(m.catalog),
        }


def members(session: Session, settings: Settings) -> list[MemberState]:
    """Every member by name, with whether it answered within the unreachable interval."""
    since = _now() - timedelta(seconds=settings.network_unreachable_after_seconds)
    rows = session.scalars(select(NetworkMember).order_by(NetworkMember.name))
    return [MemberState(m, m.last_seen_at > since) for m in rows]


def search(
    session: Session, settings: Settings, tags: list[str], text: str | None
) -> list[tuple[NetworkMember, dict[str, Any]]]:
    """Datasets of reachable members carrying all of ``tags`` whose name or description
    contains ``text``, by member then dataset name.

    Raises:
        InvalidRequestError: a malformed tag.
    """
    wanted = set(normalise_tags(tags))
    needle = (text or "").strip().lower()
    found = []
    for state in members(session, settings):
        if not state.reachable:
            continue
        for dataset in state.member.catalog:
            if not wanted <= set(dataset["tags"]):
                continue
            if needle and needle not in f"{dataset['name']}\n{dataset['description']}".lower():
                continue
            found.append((state.member, dataset))
    found.sort(key=lambda pair: (pair[0].name, pair[1]["name"]))
    return found

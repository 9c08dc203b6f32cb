"""What datasets and models share: tags, ownership checks and deletion."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from sqlalchemy import Select, func, select
from sqlalchemy.orm import QueryableAttribute, Session
from sqlalchemy.orm.interfaces import LoaderOption

from dpnode.core.errors import (
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    UploadRejectedError,
)
from dpnode.node.db.models import Dataset, Model, Role, User
from dpnode.node.numbers import looks_like_id
from dpnode.node.services import audit, blobs
from dpnode.node.services.tabular import check_name
from dpnode.node.storage import BlobStore

_TAG = re.compile(r"^[a-z0-9][a-z0-9_.:+-]{0,63}$")
MAX_TAGS = 50


def normalise_tags(tags: Iterable[str]) -> list[str]:
    """Lower-cased, de-duplicated, sorted tags; refused when malformed.

    >>> normalise_tags(["Health", "tabular", "health"])
    ['health', 'tabular']
    """
    out = sorted({t.strip().lower() for t in tags})
    for tag in out:
        if not _TAG.match(tag):
            raise InvalidRequestError(
                f"tag {tag!r} is not allowed: use 1-64 letters, digits or _ . : + - "
                "(starting with a letter or digit)"
            )
    if len(out) > MAX_TAGS:
        raise InvalidRequestError(f"at most {MAX_TAGS} tags, got {len(out)}")
    return out


def check_item_name(kind: str, name: str) -> str:
    """A dataset or model name that ``/{kind}s/{name}`` can reach: no ``/``, not ASCII digits
    alone (:func:`~dpnode.node.numbers.looks_like_id`). ``isdigit()`` refused other scripts'
    digits too, which no reader takes for an id.

    >>> check_item_name("dataset", "diabetes-2024"), check_item_name("dataset", "\u0661\u0662")
    ('diabetes-2024', '١٢')
    """
    check_name(kind, name)
    if "/" in name or looks_like_id(name):
        raise UploadRejectedError(
            f"{kind} name {name!r} cannot be used in URLs: it must not contain '/' nor be all "
            "digits 0-9 (those are read as ids)"
        )
    return name


Item = TypeVar("Item", Dataset, Model)


def get_item(
    session: Session, entity: type[Item], ref: int | str, options: Sequence[LoaderOption]
) -> Item:
    """A dataset or model by id (an int) or by name (a str)."""
    column = entity.id if isinstance(ref, int) else entity.name
    item = session.scalar(select(entity).options(*options).where(column == ref))
    if item is None:
        raise NotFoundError(f"no {entity.__tablename__[:-1]} {ref!r}")
    return item


def delete_item(
    session: Session,
    store: BlobStore,
    actor: User | None,
    item: Dataset | Model,
    digests: Iterable[str | None],
    **detail: Any,
) -> None:
    """Delete ``item`` (its owner, an admin, or the operator's command line: ``actor`` None),
    audit it with ``detail``, then free its unused blobs."""
    kind = item.__tablename__[:-1]
    if actor is not None:
        require_owner(actor, item.owner_id, f"{kind} {item.name!r}")
    # Lock the row and read it again: on PostgreSQL concurrent deletes of one item each read
    # it before any deleted it, and each answered 204 and wrote its audit event.
    entity = type(item)
    locked = select(entity.id).where(entity.id == item.id).with_for_update()
    if session.scalar(locked) is None:
        raise NotFoundError(f"no {kind} {item.id}")
    audit.record(
        session,
        actor,
        f"{kind}.delete",
        target_type=kind,
        target_id=item.id,
        name=item.name,
        **detail,
    )
    session.delete(item)
    session.commit()
    blobs.release(session, store, digests)


def filter_catalog(
    query: Select[Any],
    entity: type[Dataset] | type[Model],
    tag_owner: QueryableAttribute[int],
    tag: QueryableAttribute[str],
    tags: Sequence[str],
    text: str | None,
) -> Select[Any]:
    """Keep items carrying *all* of ``tags`` whose name or description contains ``text``."""
    wanted = normalise_tags(tags)
    if wanted:
        having_all = (
            select(tag_owner)
            .where(tag.in_(wanted))
            .group_by(tag_owner)
            .having(func.count() == len(wanted))
        )
        query = query.where(entity.id.in_(having_all))
    if text and text.strip():
        needle = text.strip().lower()
        query = query.where(
            func.lower(entity.name).contains(needle, autoescape=True)
            | func.lower(entity.description).contains(needle, autoescape=True)
        )
    return query


def require_uploader(actor: User, kind: str) -> None:
    """Only data owners and admins upload."""
    if actor.role is Role.DATA_SCIENTIST:
        raise PermissionDeniedError(
            f"data scientists cannot upload {kind}s; ask a data owner or an admin"
        )


def require_owner(actor: User, owner_id: int, what: str) -> None:
    """The owner of an item, or an admin."""
    if actor.role is not Role.ADMIN and actor.id != owner_id:
        raise PermissionDeniedError(f"only the owner of {what} or an admin may do this")

"""Idempotency keys: a retried publish is answered with its first answer, charged once.

A client that lost a publish's answer (a timeout, a dropped connection) cannot tell whether
the node ran it. It sends every publish with a key it chose and retries with the same key:

- the key is claimed in the transaction that charges the publish (``budget.charge``, which
  is serialised per user), and the table is unique on (user, key), so that one key is
  charged at most once however many copies race;
- once the release is answered, its encoded response is stored on the key's row; the values
  and receipt were released already, so storing them releases nothing new;
- a retry's key is looked up with the account when the publish reads its inputs, else when
  its charge finds the key taken (a refusal looks first: ``ensure_free``; a charge fails on
  the unique index and is rolled back): a stored answer is returned as it is, neither
  evaluated nor charged again; a claimed key without an answer yet is refused as still
  running, or as lost once its lease lapsed (the node process computing it stopped:
  ``dpnode.node.services.leases``); a key that names another request is refused.

A refused publish claims nothing, so its retry is decided again. Rows older than
``publish_key_ttl_seconds`` are purged by the process that charges publishes, on the rounds
of its lease renewals (:func:`purge`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from dpnode.core.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PublishInProgressError,
    PublishLostError,
)
from dpnode.node.db.base import table_of, utcnow
from dpnode.node.db.direct import Direct, connection_of
from dpnode.node.db.models import PublishKey

#: Printable ASCII without spaces, as an HTTP header carries it untouched.
_KEY = re.compile(r"[\x21-\x7e]{1,128}")

_INSERT = Direct(
    insert(table_of(PublishKey)),
    ("user_id", "key", "request_hash", "ledger_id", "created_at", "lease_until"),
)
#: A user's key, bound as ``user_id`` and ``key``.
_THIS_KEY = (PublishKey.user_id == bindparam("user_id"), PublishKey.key == bindparam("key"))
#: Run on the session's connection (Core execution, no ORM unit of work): in every publish.
_TAKEN = select(PublishKey.id).where(*_THIS_KEY)
#: What :func:`replay` reads of a key (see :func:`answer_of`).
ANSWER = (PublishKey.request_hash, PublishKey.response, PublishKey.lease_until)
_REPLAY = select(*ANSWER).where(*_THIS_KEY)
_STATE = select(
    PublishKey.ledger_id,
    PublishKey.created_at,
    PublishKey.response.is_not(None),
    PublishKey.lease_until,
).where(*_THIS_KEY)
_STORE = Direct(
    update(table_of(PublishKey))
    .where(PublishKey.user_id == bindparam("of_user"), PublishKey.key == bindparam("of_key"))
    .values(response=bindparam("answer"))
)


@dataclass(frozen=True)
class Claim:
    """An idempotency key and the hash of the request it came with."""

    key: str
    request_hash: str


class AlreadyClaimed(Exception):
    """Raised by :func:`claim` when the key was claimed by another request meanwhile."""


def check_key(key: str) -> str:
    """``key`` if it is 1 to 128 printable ASCII characters (no spaces).

    >>> check_key("3f2a9c")
    '3f2a9c'
    >>> check_key("a b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    dpnode.core.errors.InvalidRequestError: an idempotency key is 1 to 128 ... got 'a b'
    """
    if not _KEY.fullmatch(key):
        shown = key if len(key) <= 40 else key[:40] + "..."
        raise InvalidRequestError(
            "an idempotency key is 1 to 128 printable ASCII characters without spaces, "
            f"got {shown!r}"
        )
    return key


def request_hash(frame: bytes, epsilon: float, delta: float | None, run_id: int | None) -> str:
    """What identifies a publish request: its full graph frame and its parameters.

    >>> request_hash(b"g", 0.5, None, None) == request_hash(b"g", 0.5, None, None)
    True
    >>> request_hash(b"g", 0.5, None, None) == request_hash(b"g", 0.25, None, None)
    False
    """
    digest = hashlib.sha256(frame)
    digest.update(f"\0{epsilon!r}\0{delta!r}\0{run_id!r}".encode())
    return digest.hexdigest()


def replay(session: Session, user_id: int, claim: Claim) -> bytes | None:
    """The stored answer of the publish ``claim`` names, or ``None`` if the key is unused.

    Raises:
        PublishInProgressError: the key was charged and its answer is not stored yet.
        PublishLostError: the key was charged and its lease lapsed without an answer.
        ConflictError: the key names another request of this user.
    """
    row = session.connection().execute(_REPLAY, {"user_id": user_id, "key": claim.key}).first()
    return None if row is None else answer_of(row, claim)


def answer_of(row: Any, claim: Claim) -> bytes | None:
    """:func:`replay`'s answer from the key's :data:`ANSWER` columns, read by the caller (all
    ``None``: an unused key, as an outer join reads it).

    Raises: as :func:`replay`.
    """
    if row.request_hash is None:  # never NULL in a stored key
        return None
    if row.request_hash != claim.request_hash:
        raise ConflictError(
            f"idempotency key {claim.key!r} already names another publish (a different "
            "graph, constants, epsilon, delta or run): a key names one request; send a new "
            "publish with a new key"
        )
    if row.response is None and _lapsed(row.lease_until):
        raise PublishLostError(
            f"the publish with idempotency key {claim.key!r} was charged, and the node "
            "process computing it stopped before its answer was stored: it is not released "
            "again (it may have been sent) and the charge stands; publish again with a new key"
        )
    if row.response is None:
        raise PublishInProgressError(
            f"the publish with idempotency key {claim.key!r} was charged and is still "
            "running: retry with the same key to get its answer (it is not charged again)"
        )
    return bytes(row.response)


@dataclass(frozen=True)
class KeyState:
    """Where the publish a key names stands: charged (``ledger_id``) and answered or not."""

    key: str
    ledger_id: int
    created_at: datetime
    answered: bool
    #: charged, not answered, and its lease lapsed: the process computing it stopped
    lost: bool = False


def _lapsed(lease_until: datetime | None) -> bool:
    return lease_until is not None and lease_until < utcnow()


def state(session: Session, user_id: int, key: str) -> KeyState:
    """The state of ``user_id``'s publish under ``key``: a long publish is a job the client
    polls by its key. It tells what the client's own answer tells (charged, then answered),
    never more: a refused publish claims no key. A charged publish not answered within its
    lease is lost: the node process computing it stopped.

    Raises:
        InvalidRequestError: ``key`` is malformed.
        NotFoundError: no publish of this user was charged under ``key`` (never sent, still
            being decided, refused, or purged after ``publish_key_ttl_seconds``).
    """
    check_key(key)
    row = session.connection().execute(_STATE, {"user_id": user_id, "key": key}).first()
    if row is None:
        raise NotFoundError(
            f"no publish was charged under idempotency key {key!r} (not sent yet, still being "
            "decided, refused, or expired)"
        )
    answered = bool(row[2])
    return KeyState(key, row[0], row[1], answered, lost=not answered and _lapsed(row[3]))


def ensure_free(on: Session | Connection, user_id: int, claim: Claim) -> None:
    """Refuse a key another request claimed, in the charging transaction before it refuses
    or queues the publish: the caller holds the user's lock (``budget.charge``), so a
    concurrent claim is seen here.

    Raises:
        AlreadyClaimed: the key is taken; nothing may be charged.
    """
    taken = connection_of(on).execute(_TAKEN, {"user_id": user_id, "key": claim.key}).first()
    if taken is not None:
        raise AlreadyClaimed(claim.key)


def record(
    on: Session | Connection,
    user_id: int,
    claim: Claim,
    ledger_id: int,
    at: datetime,
    lease_seconds: float,
) -> None:
    """Record ``claim`` for the ledger row just written, in the charging transaction, with a
    lease of ``lease_seconds`` (renewed while the publish runs). The table's unique
    constraint refuses a key claimed already (by a copy of the request that raced this one):
    the insert fails the whole transaction, charge included.

    Raises:
        AlreadyClaimed: the key is taken; the caller's transaction is rolled back.
    """
    values = {
        "user_id": user_id,
        "key": claim.key,
        "request_hash": claim.request_hash,
        "ledger_id": ledger_id,
        "created_at": at,
        "lease_until": at + timedelta(seconds=lease_seconds),
    }
    try:
        _INSERT.execute(connection_of(on), values)
    except IntegrityError as exc:
        raise AlreadyClaimed(claim.key) from exc


def store(sessions: sessionmaker[Session], user_id: int, key: str, response: bytes) -> None:
    """Keep the encoded answer of the publish claimed with ``key``, for its retries.

    ``sessions`` may be relaxed (``dpnode.node.db.session.relaxed_engine``): an answer lost
    to a power failure leaves its key charged and unanswered, and its lease lapses, so its
    retries are told it is lost; nothing is released twice or without its charge."""
    with sessions() as session:
        _STORE.execute(
            session.connection(), {"of_user": user_id, "of_key": key, "answer": response}
        )
        session.commit()


def purge(sessions: sessionmaker[Session], ttl_seconds: float) -> int:
    """Delete the keys claimed more than ``ttl_seconds`` ago; how many."""
    expired = utcnow() - timedelta(seconds=ttl_seconds)
    with sessions() as session:
        stale = delete(PublishKey).where(PublishKey.created_at < expired)
        done = session.connection().execute(stale)
        session.commit()
    return int(done.rowcount)

"""A member node's side of a network: join, leave, and the heartbeat that keeps its catalog there.

The heartbeat runs in a thread of the serving process (:class:`Heartbeats`), apart from the
requests: a network that is down or slow costs a log line and a retry at the next beat, never
a failed or slower publish. Each beat sends the digest of the node's public catalog and the
catalog follows only when the network holds another one, so a change made anywhere (the API,
the console, ``dpnode dataset add`` in another process) reaches the network within a beat; a
change this process commits wakes the thread at once (:meth:`Heartbeats.watch`).
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

import httpx
from sqlalchemy import event, select
from sqlalchemy.orm import Session, selectinload, sessionmaker

from dpnode.core.errors import (
    AuthenticationError,
    ConflictError,
    DPNodeError,
    NetworkError,
    NotFoundError,
)
from dpnode.node.db.models import (
    Dataset,
    DatasetColumn,
    DatasetTag,
    NetworkMembership,
)
from dpnode.node.network.schemas import (
    Catalog,
    CatalogColumn,
    CatalogDataset,
    HeartbeatAnswer,
    JoinAnswer,
    catalog_digest,
)
from dpnode.node.services import audit

log = logging.getLogger("dpnode")

API = "/api/v1/network"
#: seconds to wait for a network at each call, at most (a beat never waits longer than one)
TIMEOUT_SECONDS = 10.0


def catalog_of(session: Session) -> Catalog:
    """This node's public catalog: each dataset's metadata as the node's search shows it,
    without the owner's account."""
    rows = session.scalars(
        select(Dataset)
        .options(selectinload(Dataset.columns), selectinload(Dataset.tags))
        .order_by(Dataset.name)
    )
    return Catalog(
        datasets=[
            CatalogDataset(
                id=d.id,
                name=d.name,
                description=d.description,
                tags=[t.tag for t in d.tags],
                row_count=d.row_count,
                columns=[
                    CatalogColumn(
                        name=c.name,
                        dtype=c.dtype,
                        shape=list(c.row_shape),
                        bounds=(c.lower, c.upper),
                        categories=c.categories,
                    )
                    for c in d.columns
                ],
                subject_id=d.subject_column,
                subject_count=d.subject_count,
                has_mock=d.mock_row_count is not None,
            )
            for d in rows
        ]
    )


def _call(
    method: str,
    url: str,
    credential: str | None = None,
    *,
    timeout: float = TIMEOUT_SECONDS,
    transport: httpx.BaseTransport | None = None,
    **kwargs: Any,
) -> httpx.Response:
    """One request to a network; its error body raised as the node's own error classes.

    Raises:
        AuthenticationError: the token or credential was refused (401).
        ConflictError: 409 (a member of that name exists).
        NetworkError: the network is unreachable, or answered another error.
    """
    headers = dict(kwargs.pop("headers", {}))
    if credential:
        headers["Authorization"] = f"Bearer {credential}"
    try:
        with httpx.Client(timeout=timeout, transport=transport) as client:
            response = client.request(method, url, headers=headers, **kwargs)
    except httpx.HTTPError as exc:
        raise NetworkError(f"cannot reach the network at {url}: {exc}") from exc
    if response.is_success:
        return response
    try:
        detail = str(response.json().get("detail", response.text))
    except (ValueError, AttributeError):
        detail = response.text[:300]
    by_status: dict[int, type[DPNodeError]] = {401: AuthenticationError, 409: ConflictError}
    raise by_status.get(response.status_code, NetworkError)(
        f"the network answered {response.status_code}: {detail}"
    )


def _now() -> datetime:
    return datetime.now(UTC)


def join(
    sessions: sessionmaker[Session],
    network_url: str,
    token: str,
    *,
    name: str,
    url: str,
    operator: str = "",
    transport: httpx.BaseTransport | None = None,
) -> NetworkMembership:
    """Join a network with a token from its admin; the credential it answers is kept.

    Raises:
        ConflictError: this node already joined that network, or the name is taken there.
        AuthenticationError: the network refused the token.
        NetworkError: the network is unreachable or refused the catalog.
    """
    network_url = network_url.rstrip("/")
    with sessions() as session:
        if session.scalar(
            select(NetworkMembership.id).where(NetworkMembership.network_url == network_url)
        ):
            raise ConflictError(f"this node already joined {network_url}; leave it first")
        catalog = catalog_of(session)
        body = {
            "token": token,
            "name": name,
            "url": url,
            "catalog": catalog.model_dump(mode="json"),
        }
        answer = JoinAnswer.model_validate(
            _call("POST", network_url + API + "/join", json=body, transport=transport).json(),
            strict=False,
        )
        now = _now()
        row = NetworkMembership(
            network_url=network_url,
            member_id=answer.member_id,
            name=answer.name,
            url=url,
            credential=answer.credential,
            joined_at=now,
            last_heartbeat_at=now,
            last_result="ok",
            last_ok_at=now,
        )
        session.add(row)
        session.flush()
        audit.record(
            session, None, "network.join", target_type="network_membership", target_id=row.id,
            network=network_url, name=name, url=url, operator=operator or None,
        )  # fmt: skip
        session.commit()
        return row


def memberships(session: Session) -> list[NetworkMembership]:
    """The networks this node joined."""
    return list(session.scalars(select(NetworkMembership).order_by(NetworkMembership.id)))


def leave(
    sessions: sessionmaker[Session],
    network_url: str,
    *,
    force: bool = False,
    operator: str = "",
    transport: httpx.BaseTransport | None = None,
) -> None:
    """Leave a network: it deletes this node's entry, and this node forgets the credential.

    Raises:
        NotFoundError: this node is not a member of that network.
        NetworkError: the network is unreachable (``force``: forget it anyway).
    """
    network_url = network_url.rstrip("/")
    with sessions() as session:
        row = session.scalar(
            select(NetworkMembership).where(NetworkMembership.network_url == network_url)
        )
        if row is None:
            joined = ", ".join(m.network_url for m in memberships(session)) or "none"
            raise NotFoundError(f"this node is not a member of {network_url} (joined: {joined})")
        try:
            _call("DELETE", network_url + API + "/membership", row.credential, transport=transport)
        except AuthenticationError:
            pass  # the network removed this node already
        except NetworkError:
            if not force:
                raise
        audit.record(
            session, None, "network.leave", target_type="network_membership", target_id=row.id,
            network=network_url, forced=force, operator=operator or None,
        )  # fmt: skip
        session.delete(row)
        session.commit()


def beat(
    sessions: sessionmaker[Session],
    membership_id: int,
    *,
    timeout: float = TIMEOUT_SECONDS,
    transport: httpx.BaseTransport | None = None,
) -> str:
    """One heartbeat to one network (and the catalog, when the network holds another one);
    its result, also kept on the membership: ``ok`` or why not. Never raises for the
    network's sake."""
    with sessions() as session:
        row = session.get(NetworkMembership, membership_id)
        if row is None:
            return "left"
        catalog = catalog_of(session)
        digest = catalog_digest(catalog)
        base, credential = row.network_url + API, row.credential
        try:
            options: dict[str, Any] = {"timeout": timeout, "transport": transport}
            sent = {"catalog_digest": digest}
            answer = _call("POST", base + "/heartbeat", credential, json=sent, **options)
            held = HeartbeatAnswer.model_validate(answer.json(), strict=False).catalog_digest
            if held != digest:
                body = catalog.model_dump_json()
                _call("PUT", base + "/catalog", credential, content=body, **options)
            result = "ok"
        except AuthenticationError:
            result = "removed by the network: join again with a new token"
        except DPNodeError as exc:
            result = str(exc)[:300]
        if result != row.last_result:
            level = logging.INFO if result == "ok" else logging.WARNING
            log.log(level, "network %s: heartbeat %s", row.network_url, result)
        row.last_heartbeat_at, row.last_result = _now(), result
        if result == "ok":
            row.last_ok_at = row.last_heartbeat_at
        session.commit()
        return result


#: what, committed, changes the catalog (and so wakes the heartbeat)
_CATALOG = (Dataset, DatasetColumn, DatasetTag)


class Heartbeats:
    """The serving process's heartbeat to every network the node joined, in a thread."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        interval: float,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.sessions = sessions
        self.interval = interval
        self.transport = transport  # tests: a network app in this process
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watched: list[sessionmaker[Session]] = []
        #: marks a session that flushed a catalog change (one mark per watcher)
        self._key = f"network-catalog-changed-{id(self)}"

    def watch(self, *makers: sessionmaker[Session]) -> None:
        """Wake the heartbeat when a session of ``makers`` commits a catalog change."""
        for maker in makers:
            event.listen(maker, "after_flush", self._flushed)
            event.listen(maker, "after_commit", self._committed)
            self._watched.append(maker)

    def _flushed(self, session: Session, _: Any) -> None:
        changed = (*session.new, *session.dirty, *session.deleted)
        if any(isinstance(obj, _CATALOG) for obj in changed):
            session.info[self._key] = True

    def _committed(self, session: Session) -> None:
        if session.info.pop(self._key, False):
            self._wake.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="network-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.sessions() as session:
                    ids = [m.id for m in memberships(session)]
                for ident in ids:
                    timeout = min(TIMEOUT_SECONDS, 2 * self.interval)
                    beat(self.sessions, ident, timeout=timeout, transport=self.transport)
            except Exception:  # a database hiccup: log it, beat again next time
                log.exception("network heartbeat failed")
            self._wake.wait(self.interval)
            self._wake.clear()

    def stop(self) -> None:
        for maker in self._watched:
            event.remove(maker, "after_flush", self._flushed)
            event.remove(maker, "after_commit", self._committed)
        self._watched.clear()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=TIMEOUT_SECONDS)

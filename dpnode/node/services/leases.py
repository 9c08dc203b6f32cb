"""Leases: a charged publish is ``running`` while the node process computing it is alive.

A publish sent with an idempotency key is charged with a lease (``publish_keys.lease_until``,
``publish_lease_seconds`` ahead). The process that charged it holds the key here until its
answer is stored, and a thread of that process renews the leases of all the keys it holds,
in one statement every third of the lease. When the process is killed the renewals stop;
when storing the answer fails the key is let go: either way, once the lease lapses
without an answer the publish is ``lost`` (:func:`dpnode.node.services.idempotency.state`),
and a retry is told so (``publish_lost``) instead of waiting until the key is purged.

The same rounds purge the keys older than ``publish_key_ttl_seconds``
(:func:`dpnode.node.services.idempotency.purge`), off the publishes' path.

A lost publish is never evaluated or released again: its answer may have been sent before
the process stopped, so the charge stands. What a lease tells is when a process stopped,
decided by the clock alone, never by the data.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from sqlalchemy import tuple_, update
from sqlalchemy.orm import Session, sessionmaker

from dpnode.node.db.base import utcnow
from dpnode.node.db.models import PublishKey
from dpnode.node.services import idempotency

__all__ = ["LeaseKeeper"]

log = logging.getLogger("dpnode")


class LeaseKeeper:
    """The keys of this process's charged, unanswered publishes, and the thread renewing
    their leases (started with the first key held, stopped by :meth:`close`)."""

    def __init__(
        self, sessions: sessionmaker[Session], lease_seconds: float, ttl_seconds: float
    ) -> None:
        self._sessions = sessions
        self.lease_seconds = lease_seconds
        self.ttl_seconds = ttl_seconds
        self._held: set[tuple[int, str]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, user_id: int, key: str) -> None:
        """Renew ``user_id``'s key until :meth:`release` (its answer is stored)."""
        with self._lock:
            self._held.add((user_id, key))
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="dpnode-publish-leases", daemon=True
                )
                self._thread.start()

    def release(self, user_id: int, key: str) -> None:
        """Stop renewing the key: answered, or its answer could not be stored (it lapses)."""
        with self._lock:
            self._held.discard((user_id, key))

    def renew(self) -> int:
        """Push the held keys' leases ``lease_seconds`` ahead, in one statement; how many."""
        with self._lock:
            held = sorted(self._held)
        if not held:
            return 0
        until = utcnow() + timedelta(seconds=self.lease_seconds)
        with self._sessions() as session:
            session.execute(
                update(PublishKey)
                .where(
                    tuple_(PublishKey.user_id, PublishKey.key).in_(held),
                    PublishKey.response.is_(None),
                )
                .values(lease_until=until)
            )
            session.commit()
        return len(held)

    def _run(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            try:
                self.renew()
                idempotency.purge(self._sessions, self.ttl_seconds)
            except Exception:  # the database is away: try again next time, while it lasts
                log.exception("could not renew the leases of running publishes or purge old keys")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

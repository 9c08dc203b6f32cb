"""Synthesis jobs: a charged synthesis runs in a background thread, its state and progress
kept in ``synthesis_jobs`` (``dpnode.node.db.models.SynthesisJob``).

The charge and every refusal happen in the request, before any value is read
(``dpnode.node.services.synthesis``); only the charged run is a job. A job is ``running``,
then ``answered`` (with the new dataset and the receipt) or ``failed`` (with a message; the
charge stands, as for a lost publish: values may have been read).

The process running a job renews its lease every third of ``publish_lease_seconds`` (a run
can spend minutes in one estimate without reporting progress); a job still ``running`` whose
lease lapsed was left by a stopped process, and :func:`sweep` marks it ``failed`` at the next
start, audited. The lease, not the start alone, decides: with several worker processes, one
starting must not fail the jobs another is running.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from dpnode.core.errors import DPNodeError, NotFoundError
from dpnode.node.db.base import utcnow
from dpnode.node.db.models import MAX_ID, Role, SynthesisJob, User
from dpnode.node.services import audit

__all__ = ["STOPPED", "JobRunner", "Reporter", "job_public", "load", "sweep"]

log = logging.getLogger("dpnode")

#: What a job left running by a stopped process says.
STOPPED = "the node stopped during the synthesis; the charge stands"

#: Reports a job's progress: rounds or steps ``done`` of ``total``, and its phase.
Reporter = Callable[[int, int, str], None]


def job_public(job: SynthesisJob) -> dict[str, Any]:
    """A job as its requester sees it."""
    shown: dict[str, Any] = {
        "job": job.id,
        "state": job.state,
        "method": job.method,
        "ledger_id": job.ledger_id,
        "progress": {"done": job.done, "total": job.total, "phase": job.phase},
    }
    if job.result is not None:
        shown.update(job.result)
    if job.error is not None:
        shown["error"] = job.error
    return shown


def load(session: Session, actor: User, job_id: int) -> SynthesisJob:
    """The job, for its requester or an admin.

    Raises:
        NotFoundError: no such job, or another user's (not told apart).
    """
    job = session.get(SynthesisJob, job_id) if 0 < job_id <= MAX_ID else None
    if job is None or (job.user_id != actor.id and actor.role != Role.ADMIN):
        raise NotFoundError(f"no synthesis job {job_id} of yours: list your datasets instead")
    return job


def sweep(sessions: sessionmaker[Session]) -> int:
    """Mark ``failed`` (audited) the running jobs whose lease lapsed; how many."""
    with sessions() as session:
        stale = session.scalars(
            select(SynthesisJob).where(
                SynthesisJob.state == "running", SynthesisJob.lease_until < utcnow()
            )
        ).all()
        for job in stale:
            job.state, job.error, job.updated_at = "failed", STOPPED, utcnow()
            audit.record(
                session,
                None,
                "synthesis.failed",
                target_type="synthesis_job",
                target_id=job.id,
                ledger_id=job.ledger_id,
                error=STOPPED,
            )
        session.commit()
        return len(stale)


class JobRunner:
    """This process's running jobs: the threads computing them and the one renewing their
    leases (started with the first job, stopped by :meth:`close`)."""

    def __init__(self, sessions: sessionmaker[Session], lease_seconds: float) -> None:
        self.sessions = sessions
        self.lease_seconds = lease_seconds
        self._jobs: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def create(self, user_id: int, source_id: int, ledger_id: int, method: str) -> int:
        """Record a job ``running`` under a fresh lease; its id."""
        with self.sessions() as session:
            job = SynthesisJob(
                user_id=user_id,
                source_id=source_id,
                ledger_id=ledger_id,
                method=method,
                state="running",
                done=0,
                total=1,
                phase="measuring",
                lease_until=utcnow() + timedelta(seconds=self.lease_seconds),
            )
            session.add(job)
            session.commit()
            return job.id

    def reporter(self, job_id: int) -> Reporter:
        """What the run calls with its progress: written at once (a few rows per run)."""

        def report(done: int, total: int, phase: str) -> None:
            self._set(job_id, done=done, total=max(total, 1), phase=phase)

        return report

    def launch(self, job_id: int, work: Callable[[Reporter], dict[str, Any]]) -> None:
        """Run ``work`` in a thread; what it returns is the job's answer, what it raises
        (a message, the charge standing) its failure, audited."""
        thread = threading.Thread(
            target=self._run, args=(job_id, work), name=f"dpnode-synthesis-{job_id}", daemon=True
        )
        with self._lock:
            self._jobs[job_id] = thread
            if self._renewer is None:
                self._renewer = threading.Thread(
                    target=self._renew_loop, name="dpnode-synthesis-leases", daemon=True
                )
                self._renewer.start()
        thread.start()

    def _run(self, job_id: int, work: Callable[[Reporter], dict[str, Any]]) -> None:
        try:
            result = work(self.reporter(job_id))
        except Exception as exc:  # the charge stands: say so, and why, to the requester
            log.exception("synthesis job %s failed", job_id)
            self._fail(job_id, _message(exc))
        else:
            # in one statement: a poll sees it running, or answered with all its steps done
            self._set(job_id, state="answered", result=result, done=SynthesisJob.total)
        finally:
            with self._lock:
                self._jobs.pop(job_id, None)

    def _fail(self, job_id: int, error: str) -> None:
        with self.sessions() as session:
            job = session.get(SynthesisJob, job_id)
            if job is None:
                return
            job.state, job.error, job.updated_at = "failed", error, utcnow()
            actor = session.get(User, job.user_id)
            audit.record(
                session,
                actor,
                "synthesis.failed",
                target_type="synthesis_job",
                target_id=job_id,
                ledger_id=job.ledger_id,
                error=error,
            )
            session.commit()

    def _set(self, job_id: int, **values: Any) -> None:
        with self.sessions() as session:
            session.execute(
                update(SynthesisJob)
                .where(SynthesisJob.id == job_id)
                .values(updated_at=utcnow(), **values)
            )
            session.commit()

    def renew(self) -> None:
        """Push the running jobs' leases ``lease_seconds`` ahead, in one statement."""
        with self._lock:
            ids = list(self._jobs)
        if ids:
            until = utcnow() + timedelta(seconds=self.lease_seconds)
            with self.sessions() as session:
                session.execute(
                    update(SynthesisJob)
                    .where(SynthesisJob.id.in_(ids), SynthesisJob.state == "running")
                    .values(lease_until=until)
                )
                session.commit()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            try:
                self.renew()
            except Exception:  # a busy database: the next round tries again
                log.exception("renewing synthesis job leases failed")

    def join(self, timeout: float | None = None) -> None:
        """Wait for this process's running jobs to end (tests, a clean stop)."""
        with self._lock:
            threads = list(self._jobs.values())
        for thread in threads:
            thread.join(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Let running jobs finish (up to ``timeout`` each), then stop renewing."""
        self.join(timeout)
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout)


def _message(exc: Exception) -> str:
    """A failure's message for the requester: the node's own errors say what happened; any
    other (a bug, a damaged store) is told by its kind alone, its details (a blob's digest
    is a hash of private values) going to the operator's log and the audit log's line."""
    if isinstance(exc, DPNodeError):
        why = str(exc)
    else:
        why = f"an internal error ({type(exc).__name__}); the operator's log has its details"
    return f"the synthesis failed after its charge: {why}; the charge stands"

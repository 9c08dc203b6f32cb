"""A synthesis running on the node: its state, its progress bar, and its result."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dpnode.sdk._exceptions import EvaluationError, InvalidRequestError
from dpnode.sdk._progress import _progress_bar

if TYPE_CHECKING:
    from dpnode.sdk._client import Client
    from dpnode.sdk._handles import DatasetHandle


@dataclass
class SynthesisJob:
    """A synthesis the node charged and is computing (``ds.synthesize(..., wait=False)``).

    ``job``: its id on the node; ``ledger_id`` the ledger row of its charge, which stands
    whatever becomes of the job.
    """

    job: int
    _client: Client

    def status(self) -> dict[str, Any]:
        """The job as the node reports it: ``state`` (``running``, ``answered``,
        ``failed``), ``progress`` (``done``, ``total``, ``phase``), and once answered the
        new ``dataset`` and the ``receipt``, or once failed the ``error``.

        Raises:
            NotFoundError: no such job of yours.
        """
        shown: dict[str, Any] = self._client._json("GET", f"/synthesis/{self.job}")
        return shown

    def wait(self, timeout: float | None = None, progress: bool | None = None) -> DatasetHandle:
        """Poll the job until it ends, with a progress bar (by default in a terminal or a
        notebook, as the client's ``progress`` says); the new dataset's handle.

        Raises:
            EvaluationError: the job failed (its message; the charge stands).
            TimeoutError: still running after ``timeout`` seconds (it goes on: wait again).
        """
        shown = progress if progress is not None else self._client.progress
        bar = _progress_bar(None, shown, desc="synthesis", unit="round", unit_scale=False)
        deadline = None if timeout is None else time.monotonic() + timeout
        at = 0
        try:
            while True:
                status = self.status()
                steps = status.get("progress") or {}
                if steps.get("total") and bar.__class__.__name__ != "_NoBar":
                    bar.total = steps["total"]
                bar.update(max(0, steps.get("done", 0) - at))
                at = max(at, steps.get("done", 0))
                bar.set_postfix_str(steps.get("phase", ""))
                if status["state"] != "running":
                    return self._ended(status)
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"synthesis job {self.job} still runs after {timeout} s: call "
                        ".wait() again, or .status() to see where it is"
                    )
                time.sleep(self._client.poll_interval)
        finally:
            bar.close()

    def result(self, timeout: float | None = None) -> DatasetHandle:
        """The new dataset's handle, waiting for it without a bar (see :meth:`wait`)."""
        return self.wait(timeout, progress=False)

    def _ended(self, status: dict[str, Any]) -> DatasetHandle:
        from dpnode.sdk._handles import DatasetHandle

        if status["state"] == "failed":
            raise EvaluationError(status.get("error") or f"synthesis job {self.job} failed")
        handle = DatasetHandle.from_json(self._client, status["dataset"])
        handle.receipt = status["receipt"]
        return handle

    def __repr__(self) -> str:
        return f"SynthesisJob({self.job})"


def start(client: Client, path: str, body: dict[str, Any], key: str | None) -> SynthesisJob:
    """Ask the node for a synthesis at ``path`` (a copy, or a mock) under idempotency key
    ``key`` (default: a fresh one, so that the client's retries are charged once); its job.

    Raises:
        InvalidRequestError: a NaN or infinite epsilon or delta (nothing sent).
    """
    for what in ("epsilon", "delta"):
        value = body[what]
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequestError(
                f"{what} must be a finite number, got {value!r}; nothing was sent"
            )
    answer = client._json(
        "POST",
        path,
        json=body,
        headers={"Idempotency-Key": key or uuid.uuid4().hex},
        repeatable=True,
    )
    return SynthesisJob(answer["job"], client)

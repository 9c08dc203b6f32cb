"""A synthesis as a job: charged in the request, computed in the background, followed through
``GET /synthesis/{id}`` with its progress, through the SDK and the real app (in process)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import select
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.models import AuditEvent, Dataset, SynthesisJob
from dpnode.node.services import synthesis_jobs
from dpnode.node.storage import FileBlobStore
from tests.conftest import PASSWORD
from tests.sdk.conftest import URL
from tests.sdk.test_synthesize import table

N = 300


@pytest.fixture
def tiny(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    owner_client.upload_dataset(
        "tiny",
        table(N, 1),
        bounds={"age": (0, 120), "bmi": (10, 70)},
        categories={"region": ["north", "south", "east"]},
    )
    return ds_client.dataset("tiny")


def follow(job: sdk.SynthesisJob) -> list[dict[str, Any]]:
    """Every status of the job, polled without pause until it ends."""
    seen = [job.status()]
    while seen[-1]["state"] == "running":
        seen.append(job.status())
    return seen


def failed_audits(context: NodeContext) -> list[AuditEvent]:
    with context.sessions() as session:
        query = select(AuditEvent).where(AuditEvent.action == "synthesis.failed")
        return list(session.scalars(query))


@pytest.mark.parametrize("method", ["mst", "aim"])
def test_a_job_runs_to_its_answer_with_its_progress_increasing(
    tiny: sdk.DatasetHandle, ds_client: sdk.Client, method: str
) -> None:
    job = tiny.synthesize(
        epsilon=2.0, delta=1e-6, method=method, bins={"age": 6, "bmi": 6}, wait=False
    )
    assert isinstance(job, sdk.SynthesisJob)
    seen = follow(job)
    assert [s["state"] for s in seen][-1] == "answered"
    assert all(s["state"] == "running" for s in seen[:-1])
    done = [s["progress"]["done"] for s in seen]
    assert done == sorted(done)  # never goes back
    last = seen[-1]["progress"]
    assert last["done"] == last["total"] and last["phase"] == "storing"
    if method == "aim":  # its rounds, then sampling and storing
        assert last["total"] == seen[-1]["receipt"]["rounds_planned"] + 2
    phases = {s["progress"]["phase"] for s in seen}
    assert phases <= {"measuring", "selecting", "estimating", "sampling", "storing"}
    copy = job.result()  # the answer, again, as a handle
    assert copy.receipt is not None and copy.receipt["mechanism"] == method
    assert copy.receipt["ledger_id"] == seen[-1]["ledger_id"]
    assert copy.row_count == N and copy.download().to_pandas().shape == (N, 5)
    (line,) = ds_client.ledger()  # charged once, when the job started
    assert line.entries[0].id == copy.receipt["ledger_id"]


def test_a_retry_under_the_same_key_gets_the_same_job(
    tiny: sdk.DatasetHandle, ds_client: sdk.Client
) -> None:
    asked: dict[str, Any] = {"epsilon": 1.0, "delta": 1e-6, "idempotency_key": "job-1"}
    first = tiny.synthesize(**asked, wait=False)
    again = tiny.synthesize(**asked, wait=False)
    assert first.job == again.job
    waited = tiny.synthesize(**asked)  # waiting: the same job's dataset
    assert waited.id == first.result().id
    assert len(ds_client.ledger()) == 1


def test_the_sdk_waits_with_a_bar_when_asked(
    tiny: sdk.DatasetHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tiny.synthesize(epsilon=1.0, delta=1e-6, method="aim", progress=True)
    assert copy.synthetic is not None and copy.synthetic["method"] == "aim"
    shown = capsys.readouterr().err
    assert "synthesis" in shown and "storing" in shown


def test_a_job_failing_after_its_charge_says_so_and_the_charge_stands(
    tiny: sdk.DatasetHandle, ds_client: sdk.Client, context: NodeContext
) -> None:
    """The source's stored columns are damaged on disk: the plan reads only metadata, so the
    charge is made; the job then fails reading them, and says so."""
    store = context.store
    assert isinstance(store, FileBlobStore)
    with context.sessions() as session:
        source = session.get(Dataset, tiny.id)
        assert source is not None
        for column in source.columns:
            assert column.blob is not None
            path = store.root / column.blob[:2] / column.blob
            path.write_bytes(b"\0" * path.stat().st_size)
    job = tiny.synthesize(epsilon=1.0, delta=1e-6, wait=False)
    seen = follow(job)
    assert seen[-1]["state"] == "failed"
    assert "the charge stands" in seen[-1]["error"]
    with pytest.raises(sdk.EvaluationError, match="the charge stands"):
        job.result()
    (line,) = ds_client.ledger()  # charged once, not refunded
    assert line.entries[0].id == seen[-1]["ledger_id"]
    (event,) = failed_audits(context)
    assert event.target_id == job.job and event.detail["ledger_id"] == seen[-1]["ledger_id"]


def test_another_users_job_is_not_found_and_an_admin_sees_it(
    tiny: sdk.DatasetHandle, owner_client: sdk.Client, admin_client: sdk.Client
) -> None:
    job = tiny.synthesize(epsilon=1.0, delta=1e-6, wait=False)
    with pytest.raises(sdk.NotFoundError, match="no synthesis job"):
        sdk.SynthesisJob(job.job, owner_client).status()
    with pytest.raises(sdk.NotFoundError, match="no synthesis job"):
        sdk.SynthesisJob(2**40, owner_client).status()
    job.result()
    assert sdk.SynthesisJob(job.job, admin_client).status()["state"] == "answered"


def test_the_start_marks_a_job_a_stopped_process_left_running_failed(
    tiny: sdk.DatasetHandle, ds_client: sdk.Client, context: NodeContext, http: TestClient
) -> None:
    """A process that charged a job and stopped leaves it ``running`` with a lease nobody
    renews; the next start marks it failed (audited), while a job whose lease another live
    process renews is left running."""
    ledger_id = tiny.synthesize(epsilon=1.0, delta=1e-6).receipt["ledger_id"]  # type: ignore[index]
    user_id = ds_client.me().id
    stopped = synthesis_jobs.JobRunner(context.sessions, lease_seconds=0.0)
    orphan = stopped.create(user_id, tiny.id, ledger_id, "mst")  # never renewed
    alive = synthesis_jobs.JobRunner(context.sessions, lease_seconds=3600.0)
    other = alive.create(user_id, tiny.id, ledger_id, "aim")
    time.sleep(0.01)
    with TestClient(create_app(context=context)) as restarted:
        client = sdk.login(
            URL, email="ds@example.org", password=PASSWORD, transport=restarted._transport
        )
        status = sdk.SynthesisJob(orphan, client).status()
        assert status["state"] == "failed" and status["error"] == synthesis_jobs.STOPPED
        assert sdk.SynthesisJob(other, client).status()["state"] == "running"
    (event,) = failed_audits(context)
    assert event.target_id == orphan and event.detail["error"] == synthesis_jobs.STOPPED
    with context.sessions() as session:
        assert session.get(SynthesisJob, orphan).ledger_id == ledger_id  # type: ignore[union-attr]
    assert len(ds_client.ledger()) == 1  # the charge stands, once


def test_nothing_is_charged_or_started_for_a_refusal(
    tiny: sdk.DatasetHandle, ds_client: sdk.Client, context: NodeContext
) -> None:
    with pytest.raises(sdk.InvalidRequestError, match="method"):
        tiny.synthesize(epsilon=1.0, delta=1e-6, method="nope", wait=False)
    assert ds_client.ledger() == []
    with context.sessions() as session:
        assert session.scalars(select(SynthesisJob)).all() == []
    assert ds_client.budget().spent_epsilon == 0


def test_a_synthesis_is_refused_while_the_budget_mark_is_missing(
    tiny: sdk.DatasetHandle, ds_client: sdk.Client, context: NodeContext
) -> None:
    """A synthesis is charged as a publish is: the budget mark (spending kept outside the
    database, against a restored backup) must cover it, so a node whose mark is gone
    refuses it, charging nothing."""
    tiny.synthesize(epsilon=1.0, delta=1e-6)
    context.settings.budget_mark_path.unlink()
    restarted = NodeContext.from_settings(context.settings)
    try:
        with TestClient(create_app(context=restarted)) as started:
            client = sdk.login(
                URL, email="ds@example.org", password=PASSWORD, transport=started._transport
            )
            with pytest.raises(sdk.BudgetMarkError, match="is missing"):
                client.dataset("tiny").synthesize(epsilon=1.0, delta=1e-6)
    finally:
        restarted.close()
    assert len(ds_client.ledger()) == 1

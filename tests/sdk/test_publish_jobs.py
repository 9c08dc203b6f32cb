"""A long publish is a job its idempotency key names: the SDK waits for it by polling its
state on the node (``GET /publish/keys/{key}``), with a bar, and fetches its answer once."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import httpx
import numpy as np
import pytest
from sqlalchemy import update
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.api import frames
from dpnode.node.context import NodeContext
from dpnode.node.db.base import utcnow
from dpnode.node.db.models import PublishKey, User
from dpnode.node.services import publish as service
from tests.conftest import PASSWORD
from tests.sdk.conftest import URL
from tests.sdk.test_publish_frames import _ages, mean_frame


class Recording(httpx.BaseTransport):
    """The app's transport, noting each request's path, holding a publish's answer back
    for ``delay`` seconds after the node gave it (a slow network, a long job), and losing
    the first ``lost_polls`` polls of a publish's state (a dropped connection)."""

    def __init__(self, inner: httpx.BaseTransport, delay: float = 0.0, lost_polls: int = 0) -> None:
        self.inner = inner
        self.delay = delay
        self.lost_polls = lost_polls
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        if "/publish/keys/" in request.url.path and self.lost_polls > 0:
            self.lost_polls -= 1
            raise httpx.ConnectError("connection refused", request=request)
        response = self.inner.handle_request(request)
        if request.url.path.endswith("/publish"):
            response.read()
            time.sleep(self.delay)
        return response


def _client(http: TestClient, user: User, transport: Recording, **options: object) -> sdk.Client:
    client = sdk.login(URL, email=user.email, password=PASSWORD, transport=transport)
    client.poll_interval = 0.05
    for name, value in options.items():
        setattr(client, name, value)
    return client


def _charged_not_answered(context: NodeContext, user: User, frame: bytes, key: str) -> bytes:
    """Charge and evaluate a publish under ``key`` without storing its answer (what a retry
    sees while the first request still runs); return the answer the node would send."""
    done = service.publish(context, user.id, frame, service.PublishRequest(0.5), key)
    assert isinstance(done, service.Published)
    arrays = {f"output/{i}": v for i, v in enumerate(done.values)}
    return frames.encode(arrays, {"receipt": done.receipt})


def test_a_running_publish_is_waited_for_then_answered_once(
    http: TestClient, context: NodeContext, owner_client: sdk.Client, scientist: User
) -> None:
    frame = mean_frame(_ages(owner_client))
    answer = _charged_not_answered(context, scientist, frame, "job")
    transport = Recording(http._transport, lost_polls=2)  # waiting survives lost polls
    client = _client(http, scientist, transport, progress=False)
    finish = threading.Timer(0.6, service.answered, (context, scientist.id, "job", answer))
    finish.start()
    try:
        values, receipt = client.publish_frame(frame, epsilon=0.5, idempotency_key="job")
    finally:
        finish.cancel()
    _, expected = frames.decode(answer, max_elements=16)
    np.testing.assert_array_equal(values[0], expected["output/0"])
    polls = [p for p in transport.paths if p.endswith("/publish/keys/job")]
    assert len(polls) >= 5  # it waited on the job's state, not by resending the publish
    assert transport.paths.count("/api/v1/publish") == 2  # refused as running, then answered
    (entry,) = client.ledger()
    assert entry.id == receipt["ledger_id"]
    assert client.budget().spent_epsilon == 0.5


def test_the_wait_for_a_running_publish_is_bounded(
    http: TestClient, context: NodeContext, owner_client: sdk.Client, scientist: User
) -> None:
    frame = mean_frame(_ages(owner_client))
    _charged_not_answered(context, scientist, frame, "stuck")
    client = _client(http, scientist, Recording(http._transport), publish_wait=0.3)
    client.progress = False
    started = time.monotonic()
    with pytest.raises(sdk.PublishInProgressError) as raised:
        client.publish_frame(frame, epsilon=0.5, idempotency_key="stuck")
    assert 0.3 <= time.monotonic() - started < 5
    assert raised.value.idempotency_key == "stuck"
    assert client.publish_state("stuck") == "running"
    with pytest.raises(sdk.NotFoundError, match="no publish was charged"):
        client.publish_state("never-sent")


def test_a_publish_lost_with_its_process_ends_the_wait(
    http: TestClient, context: NodeContext, owner_client: sdk.Client, scientist: User
) -> None:
    """The process computing a charged publish stopped (here: it let the key go, as when its
    answer cannot be stored) and its lease lapsed while the client waits: the wait ends
    with PublishLostError at the next poll, not after ``publish_wait``."""
    frame = mean_frame(_ages(owner_client))
    _charged_not_answered(context, scientist, frame, "gone")
    service.let_go(context, scientist.id, "gone")

    def lapse() -> None:
        with context.sessions() as session:
            session.execute(
                update(PublishKey)
                .where(PublishKey.key == "gone")
                .values(lease_until=utcnow() - timedelta(seconds=1))
            )
            session.commit()

    transport = Recording(http._transport)
    client = _client(http, scientist, transport, progress=False, publish_wait=60)
    timer = threading.Timer(0.4, lapse)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(sdk.PublishLostError, match="the charge stands") as raised:
            client.publish_frame(frame, epsilon=0.5, idempotency_key="gone")
    finally:
        timer.cancel()
    assert time.monotonic() - started < 10
    assert raised.value.idempotency_key == "gone"
    assert transport.paths.count("/api/v1/publish") == 2  # running, waited on, then lost
    assert client.publish_state("gone") == "lost"
    assert len(client.ledger()) == 1 and client.budget().spent_epsilon == 0.5


def test_a_long_publish_shows_a_bar_with_its_state(
    http: TestClient,
    owner_client: sdk.Client,
    scientist: User,
    capsys: pytest.CaptureFixture[str],
) -> None:
    frame = mean_frame(_ages(owner_client))
    transport = Recording(http._transport, delay=0.5)
    client = _client(http, scientist, transport, progress=True, progress_after=0.0)
    values, _ = client.publish_frame(frame, epsilon=0.5, idempotency_key="slow")
    assert values[0].shape == ()
    err = capsys.readouterr().err
    assert "publish:" in err and "answered" in err  # the node answered; the bar said so
    assert len(client.ledger()) == 1
    quiet = _client(http, scientist, Recording(http._transport), progress=False)
    quiet.publish_frame(frame, epsilon=0.5)
    assert "publish:" not in capsys.readouterr().err

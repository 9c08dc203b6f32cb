"""The SDK's in-process transport: the real app served on one event-loop thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from dpnode import sdk
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services import idempotency
from tests.conftest import PASSWORD

URL = "http://in-process"


@pytest.fixture
def transport(context: NodeContext) -> Iterator[sdk.InProcessTransport]:
    with sdk.InProcessTransport(create_app(context=context)) as t:
        yield t


def _login(transport: sdk.InProcessTransport, user: User) -> sdk.Client:
    return sdk.login(URL, email=user.email, password=PASSWORD, transport=transport)


@pytest.fixture
def analyst(
    transport: sdk.InProcessTransport, owner: User, scientist: User, sqlite_only: None
) -> sdk.Client:
    values = np.linspace(10.0, 70.0, 50)
    _login(transport, owner).upload_dataset("cohort", {"bmi": values}, bounds={"bmi": (10, 70)})
    return _login(transport, scientist)


def test_publish_through_the_transport_is_charged_once_and_answered(
    analyst: sdk.Client,
) -> None:
    bmi = analyst.dataset("cohort")["bmi"]
    before = analyst.budget().spent_epsilon
    out = bmi.mean().publish(epsilon=0.5)
    assert 10.0 <= float(out) <= 70.0  # clipped to the public range after the noise
    assert out.receipt.epsilon == pytest.approx(0.5)
    assert analyst.budget().spent_epsilon == pytest.approx(before + 0.5)


def test_refusals_arrive_as_typed_errors_and_charge_nothing(
    transport: sdk.InProcessTransport, analyst: sdk.Client, scientist: User
) -> None:
    with pytest.raises(sdk.AuthenticationError):
        sdk.login(URL, email=scientist.email, password="wrong password", transport=transport)
    bmi = analyst.dataset("cohort")["bmi"]
    spent = analyst.budget().spent_epsilon
    with pytest.raises(sdk.BudgetExceededError):
        bmi.sum().publish(epsilon=1e6)
    with pytest.raises(sdk.NotFoundError):
        analyst.dataset("no such dataset")
    assert analyst.budget().spent_epsilon == spent


def test_a_retry_under_the_same_key_gets_the_first_answer(
    analyst: sdk.Client, context: NodeContext
) -> None:
    """The answer is stored after it is sent (a background task the transport does not wait
    for): a copy sent at once may be told the publish runs, and then waits for it."""
    bmi = analyst.dataset("cohort")["bmi"]
    analyst.poll_interval = 0.01
    captured: dict[str, bytes] = {}
    send = analyst.publish_frame

    def capture(frame: bytes, **kwargs: Any) -> Any:
        captured["frame"] = frame
        return send(frame, **kwargs)

    analyst.publish_frame = capture  # type: ignore[method-assign]
    bmi.mean().publish(epsilon=0.25)
    spent = analyst.budget().spent_epsilon
    first, receipt = send(captured["frame"], epsilon=0.25, idempotency_key="same-key")
    again, receipt_again = send(captured["frame"], epsilon=0.25, idempotency_key="same-key")
    assert np.array_equal(first[0], again[0])
    assert receipt_again["ledger_id"] == receipt["ledger_id"]
    assert analyst.budget().spent_epsilon == pytest.approx(spent + 0.25)
    with context.read_sessions() as session:
        state = idempotency.state(session, analyst.me().id, "same-key")
    assert state.answered


def test_closing_a_client_leaves_the_shared_transport_serving(
    transport: sdk.InProcessTransport, admin: User, scientist: User
) -> None:
    first = _login(transport, admin)
    second = _login(transport, scientist)
    first.close()
    assert second.me().email == scientist.email


def test_shutdown_waits_for_work_after_the_answer_and_runs_the_lifespan() -> None:
    events: list[str] = []
    done_after = threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].removeprefix("lifespan.")
                events.append(kind)
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x", b"1")]})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})
        await asyncio.sleep(0.05)  # a background task: the caller is answered already
        events.append("after")
        done_after.set()

    with sdk.InProcessTransport(app) as transport:
        assert events == ["startup"]
        response = httpx.Client(transport=transport).post("http://node/x", content=b"body")
        assert (response.status_code, response.headers["x"], response.content) == (201, "1", b"ab")
        assert not done_after.is_set()  # answered before the app returned
    assert events == ["startup", "after", "shutdown"]
    with pytest.raises(httpx.TransportError):
        httpx.Client(transport=transport).get("http://node/")


def test_the_request_reaches_the_app_as_sent() -> None:
    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise RuntimeError("no lifespan here")  # such an app still serves requests
        message = await receive()
        seen.update(scope, body=message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    with sdk.InProcessTransport(app, client=("10.0.0.7", 5)) as transport:
        httpx.Client(transport=transport).put(
            "http://node:81/a%20b?x=1&y=2", content=b"\x00\x01", headers={"X-Key": "v"}
        )
    assert seen["method"] == "PUT"
    assert seen["path"] == "/a b"
    assert seen["raw_path"] == b"/a%20b"
    assert seen["query_string"] == b"x=1&y=2"
    assert (b"x-key", b"v") in seen["headers"]
    assert seen["client"] == ("10.0.0.7", 5)
    assert seen["server"] == ("node", 81)
    assert seen["body"] == b"\x00\x01"


def test_an_app_that_does_not_answer_in_time_is_a_read_timeout() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await asyncio.sleep(5)

    with sdk.InProcessTransport(app) as transport:
        start = time.monotonic()
        with pytest.raises(httpx.ReadTimeout):
            httpx.Client(transport=transport, timeout=0.2).get("http://node/")
        assert time.monotonic() - start < 2


def test_an_app_that_fails_before_answering_raises_its_error() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            raise ValueError("broken app")

    with sdk.InProcessTransport(app) as transport, pytest.raises(ValueError, match="broken"):
        httpx.Client(transport=transport).get("http://node/")


def test_a_failed_startup_is_raised_when_the_transport_opens() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no database"})

    with pytest.raises(RuntimeError, match="no database"):
        sdk.InProcessTransport(app)


def test_torch_publish_matches_what_the_node_recorded(analyst: sdk.Client) -> None:
    """A graph of several prims, whose receipt the ledger agrees with."""
    bmi = analyst.dataset("cohort")["bmi"]
    out = torch.histc(bmi, bins=4, min=10.0, max=70.0).publish(epsilon=0.5)
    assert out.shape == (4,)
    assert analyst.ledger()[0].id == out.receipt.ledger_id  # newest first


def _requests(client: sdk.Client) -> list[str]:
    """The requests ``client`` sends from now on, as ``METHOD /path``."""
    sent: list[str] = []
    client._http.event_hooks["request"].append(
        lambda request: sent.append(f"{request.method} {request.url.path}")
    )
    return sent


def test_a_sensitivity_asked_again_is_answered_without_a_request(analyst: sdk.Client) -> None:
    """The node's answer on datasets alone never changes: the client keeps it. The query
    builder asks one before each count, which a count asked again no longer sends."""
    from dpnode.sdk.query import col, count

    bmi = analyst.dataset("cohort")["bmi"]
    sent = _requests(analyst)
    first = sdk.sensitivity(bmi.sum())
    again = sdk.sensitivity(bmi.sum())
    assert again == first and first.l1 == pytest.approx(60.0)  # one row moves within [10, 70]
    other = sdk.sensitivity(bmi.mean())  # another graph: asked
    assert other.l1 < first.l1
    assert sent.count("POST /api/v1/sensitivity") == 2
    for _ in range(2):  # a refusal is never kept: asked each time
        with pytest.raises(sdk.PrivacyTrackingError):
            sdk.sensitivity(torch.sqrt(bmi - 40.0).sum())
    assert sent.count("POST /api/v1/sensitivity") == 4
    query = analyst.dataset("cohort").query().filter(col("bmi") > 30).agg(count())
    sent.clear()
    query.publish(epsilon=0.5)
    query.publish(epsilon=0.5)
    assert sent.count("POST /api/v1/sensitivity") == 1  # before the first publish only
    assert sent.count("POST /api/v1/publish") == 2

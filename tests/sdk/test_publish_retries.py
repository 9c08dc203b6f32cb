"""The SDK retries a publish whose answer was lost, with the same key: answered, charged once."""

from __future__ import annotations

import httpx
import pytest
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.db.models import User
from tests.conftest import PASSWORD
from tests.sdk.conftest import URL, remote_dataset
from tests.sdk.test_publish_frames import _ages, mean_frame


class LosesAnswers(httpx.BaseTransport):
    """The app's transport, losing the answers of the first ``lose`` publishes: the node
    handles each request in full, then the client sees a timeout instead of its answer."""

    def __init__(self, inner: httpx.BaseTransport, lose: int) -> None:
        self.inner = inner
        self.lose = lose
        self.keys: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if not request.url.path.endswith("/publish"):
            return response
        self.keys.append(request.headers.get("Idempotency-Key"))
        if self.lose > 0:
            self.lose -= 1
            response.read()  # the node has answered: the answer is lost on the way back
            raise httpx.ReadTimeout("timed out reading the answer", request=request)
        return response


def _client(http: TestClient, user: User, lose: int) -> tuple[sdk.Client, LosesAnswers]:
    transport = LosesAnswers(http._transport, lose)
    client = sdk.login(URL, email=user.email, password=PASSWORD, transport=transport)
    client.retry_backoff = 0.0
    return client, transport


def test_a_lost_answer_is_fetched_again_and_charged_once(
    http: TestClient, owner_client: sdk.Client, scientist: User
) -> None:
    ds = _ages(owner_client)
    client, transport = _client(http, scientist, lose=2)
    values, receipt = client.publish_frame(mean_frame(ds), epsilon=0.5)
    assert values[0].shape == ()
    assert len(transport.keys) == 3 and len(set(transport.keys)) == 1  # one key, three sends
    assert transport.keys[0] is not None and len(transport.keys[0]) == 32
    (entry,) = client.ledger()
    assert entry.id == receipt["ledger_id"]
    assert client.budget().spent_epsilon == 0.5


def test_every_publish_has_its_own_key(
    http: TestClient, owner_client: sdk.Client, scientist: User
) -> None:
    ds = _ages(owner_client)
    client, transport = _client(http, scientist, lose=0)
    client.publish_frame(mean_frame(ds), epsilon=0.5)
    client.publish_frame(mean_frame(ds), epsilon=0.5)  # the same graph: a second release
    assert len(set(transport.keys)) == 2
    assert len(client.ledger()) == 2
    assert client.budget().spent_epsilon == 1.0


def test_no_answer_at_all_names_the_key_and_a_retry_with_it_is_safe(
    http: TestClient, owner_client: sdk.Client, scientist: User
) -> None:
    ds = _ages(owner_client)
    client, transport = _client(http, scientist, lose=10)
    with pytest.raises(sdk.NodeUnreachableError) as raised:
        client.publish_frame(mean_frame(ds), epsilon=0.5)
    err = raised.value
    assert len(transport.keys) == 1 + client.publish_retries
    assert err.idempotency_key == transport.keys[0]
    assert "may or may not have run" in err.detail and err.idempotency_key in err.detail
    assert len(client.ledger()) == 1  # it did run, once
    transport.lose = 0
    _, receipt = client.publish_frame(
        mean_frame(ds), epsilon=0.5, idempotency_key=err.idempotency_key
    )
    (entry,) = client.ledger()
    assert entry.id == receipt["ledger_id"]
    assert client.budget().spent_epsilon == 0.5


def test_a_remote_tensor_publish_survives_a_lost_answer(
    http: TestClient, owner_client: sdk.Client, scientist: User
) -> None:
    client, transport = _client(http, scientist, lose=1)
    ds = remote_dataset(owner_client, client)
    mean = ds["age"].float().mean().publish(epsilon=0.5)
    assert mean.receipt.epsilon == 0.5
    assert len(transport.keys) == 2 and transport.keys[0] == transport.keys[1]
    assert len(client.ledger()) == 1


def test_a_refusal_is_not_retried(
    http: TestClient, owner_client: sdk.Client, scientist: User
) -> None:
    ds = _ages(owner_client)
    client, transport = _client(http, scientist, lose=0)
    with pytest.raises(sdk.BudgetExceededError):
        client.publish_frame(mean_frame(ds), epsilon=50.0)
    assert len(transport.keys) == 1
    assert client.ledger() == []

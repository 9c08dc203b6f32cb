"""A training loop sends its graph's structure once, then only the new constants."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.core.engine import decode
from dpnode.core.errors import GraphError, UnknownStructureError
from dpnode.core.structures import REF_MAGIC, StructureCache, header_digest, reference, split
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services import publish as publish_service
from dpnode.node.services.users import Actor
from tests.conftest import PASSWORD
from tests.sdk.conftest import URL


class Recording(httpx.BaseTransport):
    """The app's own transport, keeping the body of every graph request it carries."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.bodies: list[tuple[str, bytes, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path.endswith(("/publish", "/sensitivity")):
            self.bodies.append((request.url.path, request.read(), response.status_code))
        return response


@pytest.fixture
def cohort(owner_client: sdk.Client) -> int:
    rng = np.random.default_rng(5)
    a, b = rng.uniform(0, 1, 500), rng.uniform(0, 1, 500)
    data = {"a": a, "b": b, "label": a > b}
    return owner_client.upload_dataset("pairs", data, bounds={"a": (0, 1), "b": (0, 1)}).id


def _client(http: TestClient, email: str) -> tuple[sdk.Client, Recording]:
    recording = Recording(http._transport)
    return sdk.login(URL, email=email, password=PASSWORD, transport=recording), recording


def _train(client: sdk.Client, dataset_id: int, steps: int) -> torch.nn.Linear:
    x, label = client.dataset(dataset_id).tensors(["a", "b"], "label")
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(model(x.float()).squeeze(1), label.float())
        loss.backward()
        sdk.publish_grads(model, epsilon=0.1)
        opt.step()
        opt.zero_grad()
    return model


def test_a_loop_resends_only_constants(
    http: TestClient, scientist: User, cohort: int, context: NodeContext
) -> None:
    client, recording = _client(http, scientist.email)
    _train(client, cohort, steps=4)
    assert [status for _, _, status in recording.bodies] == [200] * 4
    first, *rest = (body for _, body, _ in recording.bodies)
    assert first[:4] == b"DPG\x01"
    assert all(body[:4] == REF_MAGIC for body in rest)
    # a reference is the digest plus the weights (3 float32), nothing of the structure
    assert all(len(body) < len(first) // 4 for body in rest)
    assert {body[4:36] for body in rest} == {header_digest(first)}
    assert len(client.ledger()) == 4


def test_a_lost_structure_is_resent_whole(
    http: TestClient, scientist: User, cohort: int, context: NodeContext
) -> None:
    client, recording = _client(http, scientist.email)
    _train(client, cohort, steps=1)
    context.structures = StructureCache(context.settings.structure_cache_bytes)  # a restart
    _train(client, cohort, steps=1)
    kinds = [(body[:4], status) for _, body, status in recording.bodies]
    assert kinds == [(b"DPG\x01", 200), (REF_MAGIC, 404), (b"DPG\x01", 200)]
    assert len(client.ledger()) == 2  # the refused reference charged nothing


def test_structures_are_private_to_their_sender(
    http: TestClient, scientist: User, owner: User, cohort: int
) -> None:
    alice, alice_wire = _client(http, scientist.email)
    _train(alice, cohort, steps=1)
    frame = alice_wire.bodies[0][1]
    owner_client, _ = _client(http, owner.email)
    ref = reference(_digest(frame), split(frame)[1])
    response = owner_client._http.post(
        "/sensitivity", content=ref, headers={"Authorization": f"Bearer {owner_client.token}"}
    )
    assert response.status_code == 404 and response.json()["error"] == "unknown_structure"


def _digest(frame: bytes) -> bytes:
    digest = header_digest(frame)
    assert digest is not None
    return digest


def test_cache_is_bounded_and_least_recently_used_goes_first() -> None:
    def frame(tag: bytes) -> bytes:
        header = b'{"tag":"' + tag + b'"}'
        return b"DPG\x01" + len(header).to_bytes(8, "little") + header

    a, b, c = frame(b"a" * 20), frame(b"b" * 20), frame(b"c" * 20)
    cache = StructureCache(max_bytes=2 * len(a))
    cache.remember(1, cache.find(1, a))
    cache.remember(1, cache.find(1, b))
    cache.expand(1, reference(_digest(a), b""))  # a is now the most recent
    cache.remember(1, cache.find(1, c))  # evicts b
    assert len(cache) == 2
    assert cache.expand(1, reference(_digest(a), b"x")) == a + b"x"
    with pytest.raises(UnknownStructureError):
        cache.expand(1, reference(_digest(b), b""))
    assert header_digest(b"\x00" * 40) is None  # not a frame: sent as it is, refused by the node
    with pytest.raises(GraphError, match="shorter than"):
        cache.expand(1, REF_MAGIC + b"short")
    malformed = b"DPG\x01" + (10**6).to_bytes(8, "little")
    cache.remember(1, cache.find(1, malformed))  # ignored
    assert len(cache) == 2


def test_a_known_structure_is_rebuilt_with_each_frames_own_constants(
    http: TestClient, scientist: User, cohort: int, context: NodeContext
) -> None:
    """The node plans a header once; every later frame with it is evaluated with its own
    weights, checked as a whole frame's would be."""
    client, recording = _client(http, scientist.email)
    _train(client, cohort, steps=2)
    first, later = (body for _, body, _ in recording.bodies)
    full = context.structures.expand(scientist.id, later)
    found = context.structures.find(scientist.id, later)
    assert found.frame == full and found.template is not None
    graph, planned = publish_service._decode(context, Actor(scientist.id, scientist.role), found)
    expected = decode(full)
    constants = [n.value for n in graph.nodes if n.op == "constant"]
    assert constants
    wanted = [n.value for n in expected.nodes if n.op == "constant"]
    for got, want in zip(constants, wanted, strict=True):
        assert got is not None and want is not None
        np.testing.assert_array_equal(got, want)
    assert planned.graph is graph
    # the second step's weights are not the first's: a stale template would fail this
    assert split(first)[1] != later[36:]

    spent = len(client.ledger())
    poisoned = REF_MAGIC + later[4:36] + b"\xff" * len(later[36:])  # NaN weights
    response = client._http.post(
        "/publish",
        params={"epsilon": 0.1},
        content=poisoned,
        headers={"Authorization": f"Bearer {client.token}"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_graph"
    assert "constant contains NaN" in response.json()["detail"]
    assert len(client.ledger()) == spent

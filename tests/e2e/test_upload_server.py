"""A chunked upload against a real server process, killed mid-upload and resumed after a restart."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from dpnode import sdk
from dpnode.node.demo import ACCOUNTS
from tests.e2e.conftest import Server

OWNER = ACCOUNTS[1]


class KillsTheNode(httpx.HTTPTransport):
    """A real HTTP transport that kills the node before the ``after + 1``-th chunk."""

    def __init__(self, server: Server, after: int) -> None:
        super().__init__()
        self.server, self.after, self.puts = server, after, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            self.puts += 1
            if self.puts == self.after + 1:
                self.server.stop(kill=True)
        return super().handle_request(request)


def test_an_upload_survives_the_node_being_killed(demo_server: Server) -> None:
    x = np.random.default_rng(0).uniform(0, 1, 500_000)
    client = sdk.Client(demo_server.url, transport=KillsTheNode(demo_server, after=2))
    client.login(OWNER.email, OWNER.password)
    client.retry_backoff = 0.0
    client.upload_retries = 1
    with pytest.raises(sdk.NodeUnreachableError) as lost:
        client.upload_dataset(
            "big", {"x": x}, bounds={"x": (0, 1)}, chunk_bytes=1 << 20, chunked=True
        )
    upload_id = lost.value.upload_id
    assert upload_id is not None
    demo_server.start()  # the session's files outlive the process
    again = sdk.login(demo_server.url, email=OWNER.email, password=OWNER.password)
    status = again._json("GET", f"/uploads/{upload_id}")
    assert status["received"] == 2 << 20
    handle = again.upload_dataset(
        "big", {"x": x}, bounds={"x": (0, 1)}, chunk_bytes=1 << 20, resume=upload_id
    )
    assert handle.row_count == 500_000
    assert np.array_equal(handle.download()["x"], x)

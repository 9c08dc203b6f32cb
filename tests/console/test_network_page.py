"""The console's network page through the real apps: a node's admin sees its membership and
its last heartbeat; a network's admin sees its members and whether they answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.network import membership
from dpnode.node.settings import Settings
from tests.conftest import login, make_user
from tests.console.conftest import Browser


@pytest.fixture
def network_app(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestClient]:
    """A network on a database of its own (a copy of the member's fresh schema)."""
    from dpnode.node.db.migrate import upgrade

    path = tmp_path_factory.mktemp("network") / "network.sqlite3"
    upgrade(f"sqlite:///{path}")
    ctx = NodeContext.from_settings(
        settings.model_copy(
            update={
                "role": "network",
                "database_url": f"sqlite:///{path}",
                "data_dir": path.parent / "data",
            }
        )
    )
    make_user(ctx, "netadmin@example.org", "admin")
    with TestClient(create_app(context=ctx)) as client:
        yield client
    ctx.close()


def test_a_node_admin_sees_its_membership_and_the_network_admin_its_members(
    http: TestClient, context: NodeContext, admin: User, network_app: TestClient
) -> None:
    node = Browser(http)
    node.sign_in(admin.email)
    assert "This node is in no network" in node.get("/console/network").text

    auth = login(network_app, "netadmin@example.org")
    token = network_app.post("/api/v1/network/tokens", json={}, headers=auth).json()["token"]
    membership.join(
        context.sessions, "http://testserver", token, name="site-a",
        url="http://site-a.example<b>", transport=network_app._transport,
    )  # fmt: skip
    shown = node.get("/console/network").text
    assert "http://testserver" in shown and "site-a" in shown
    assert "http://site-a.example&lt;b&gt;" in shown and "example<b>" not in shown  # escaped
    assert "<td>ok</td>" in shown

    net = Browser(network_app)
    net.sign_in("netadmin@example.org")
    listed = net.get("/console/network").text
    assert "Members of this network" in listed and '<th scope="row">site-a</th>' in listed
    assert "<td>reachable</td>" in listed and "example&lt;b&gt;" in listed

    make_user(context, "ds@example.org", "data_scientist")
    scientist = Browser(http)
    scientist.sign_in("ds@example.org")
    assert scientist.get("/console/network").status_code == 403

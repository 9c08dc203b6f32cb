"""``dpnode network ...`` run in process against a real database on each backend: the
network's tokens and members, and a node's memberships (joining over HTTP is in
tests/e2e/test_network_server.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from dpnode.node.cli_common import migrated_context
from dpnode.node.db.models import AuditEvent, NetworkJoinToken
from dpnode.node.network import directory
from dpnode.node.network.schemas import Catalog, JoinRequest
from dpnode.node.services.security import secret_digest
from dpnode.node.settings import Settings
from tests.node.test_cli import cli_env, run  # noqa: F401  (the fixture)


def test_tokens_members_and_removal_from_the_command_line(
    cli_env: Settings,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "network", "token", "create", "--note", "site a")
    assert code == 0 and "shown once" in out
    token = out.splitlines()[-1]
    context = migrated_context()
    with context.sessions() as session:
        row = session.scalars(select(NetworkJoinToken)).one()
        assert row.digest == secret_digest(token) and row.created_by.startswith("command line")
    code, out, _ = run(capsys, "network", "token", "list")
    assert code == 0 and "'site a'" in out and "expires" in out and token not in out
    code, out, _ = run(capsys, "network", "members")
    assert code == 0 and out.strip() == "no members"

    request = JoinRequest(
        token=token, name="site-a", url="http://site-a:8000", catalog=Catalog(datasets=[])
    )
    with context.sessions() as session:
        directory.join(session, context.settings, request)
    code, out, _ = run(capsys, "network", "token", "list")
    assert "used by site-a" in out
    code, out, _ = run(capsys, "network", "members")
    assert code == 0 and "site-a" in out and "reachable" in out and "0 datasets" in out

    code, out, _ = run(capsys, "network", "remove", "site-a")
    assert code == 0 and "removed member 'site-a'" in out
    code, _, err = run(capsys, "network", "remove", "site-a")
    assert code == 2 and "no member 'site-a'" in err

    run(capsys, "network", "token", "create")
    ident = run(capsys, "network", "token", "list")[1].split()[0]
    code, out, _ = run(capsys, "network", "token", "revoke", ident)
    assert code == 0 and f"revoked join token {ident}" in out
    assert "revoked" in run(capsys, "network", "token", "list")[1].splitlines()[0]
    with context.sessions() as session:
        actions = set(session.scalars(select(AuditEvent.action)))
    assert {
        "network.token.issue",
        "network.token.revoke",
        "network.join",
        "network.remove",
    } <= actions
    context.close()


def test_a_node_in_no_network_says_so(
    cli_env: Settings,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "network", "status")
    assert code == 0 and out.strip() == "this node is in no network"
    code, _, err = run(capsys, "network", "leave", "http://net.example.org")
    assert code == 2 and "not a member of http://net.example.org (joined: none)" in err
    code, _, err = run(capsys, "network", "join", "http://127.0.0.1:9", "--token", "dpj_x",
                       "--url", "http://me")  # fmt: skip
    assert code == 2 and "cannot reach the network" in err
    code, _, err = run(capsys, "serve", "--network", "--demo")
    assert code == 2 and "a network does not hold" in err

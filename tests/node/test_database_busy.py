"""A request that waits too long for a database connection is answered 503, not 500."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.app import create_app
from dpnode.node.context import NodeContext, pool_options
from dpnode.node.services import users
from dpnode.node.settings import Settings
from tests.conftest import PASSWORD, login


@pytest.fixture
def small_pool(settings: Settings) -> Iterator[NodeContext]:
    tight = settings.model_copy(
        update={
            "max_requests_in_flight": 1,
            "database_pool_size": 1,
            "database_pool_timeout_seconds": 0.2,
        }
    )
    context = NodeContext.from_settings(tight)
    yield context
    context.close()


def test_a_request_that_finds_no_free_connection_gets_503_and_then_succeeds(
    small_pool: NodeContext,
) -> None:
    with small_pool.sessions() as session:
        users.create_user(
            session, small_pool.hasher, None, email="ds@example.org", password=PASSWORD,
            role="data_scientist",
        )  # fmt: skip
    with TestClient(create_app(context=small_pool), raise_server_exceptions=False) as http:
        headers = login(http, "ds@example.org")
        client = sdk.login(
            "http://node", email="ds@example.org", password=PASSWORD, transport=http._transport
        )
        client.busy_retries, client.retry_backoff = 1, 0.01
        options = pool_options(small_pool.settings)
        with ExitStack() as held:  # every connection of the pool, held by someone else
            for _ in range(options["pool_size"] + options["max_overflow"]):
                held.enter_context(small_pool.engine.connect())
            busy = http.get("/api/v1/search", headers=headers)
            assert busy.status_code == 503, busy.text
            assert busy.json()["error"] == "database_busy"
            assert busy.headers["Retry-After"] == "1"
            with pytest.raises(sdk.DatabaseBusyError) as caught:
                client.search()  # a read: resent once, then raised
            assert caught.value.retry_after == 1
            # the health check is not refused by back-pressure, but it needs the database
            assert http.get("/api/v1/health").status_code == 503
        assert http.get("/api/v1/search", headers=headers).status_code == 200
        assert client.search() == []


def test_sqlite_gets_a_connection_for_each_request_in_flight(settings: Settings) -> None:
    options = pool_options(settings.model_copy(update={"max_requests_in_flight": 20}))
    if settings.resolved_database_url.startswith("sqlite"):
        assert options["pool_size"] >= 20
    else:
        assert options["pool_size"] == settings.database_pool_size


def test_reads_do_not_wait_for_sqlite_writers(
    settings: Settings, context: NodeContext, http: TestClient
) -> None:
    """A search (its account read included) takes no lock: a transaction holding SQLite's
    write lock does not hold it up (it used to, through the busy timeout, at 64 clients)."""
    if not settings.resolved_database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL readers never wait for writers")
    with context.sessions() as session:
        users.create_user(
            session, context.hasher, None, email="ds@example.org", password=PASSWORD,
            role="data_scientist",
        )  # fmt: skip
    headers = login(http, "ds@example.org")
    path = settings.resolved_database_url.removeprefix("sqlite:///")
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # another writer, holding the lock
        start = time.monotonic()
        assert http.get("/api/v1/search", headers=headers).status_code == 200
        assert http.get("/api/v1/health").status_code == 200
        assert time.monotonic() - start < 5  # not the 30 s busy timeout
    finally:
        writer.execute("ROLLBACK")
        writer.close()

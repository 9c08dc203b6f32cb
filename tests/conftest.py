"""Fixtures shared by the whole suite: real databases (SQLite and PostgreSQL), the real app."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from starlette.testclient import TestClient

from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.migrate import upgrade
from dpnode.node.db.models import User
from dpnode.node.services import users
from dpnode.node.settings import Settings
from tests.postgres import find_bin_dir, postgres_server
from tests.statuses import RecordStatuses, Seen, spec_of, undocumented

BACKENDS = ["sqlite", "postgresql"]
REPO_ROOT = Path(__file__).resolve().parents[1]
_names = itertools.count()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server for this session, with a migrated template database."""
    if find_bin_dir() is None:
        if os.environ.get("CI"):
            pytest.fail("PostgreSQL is required in CI but its binaries were not found")
        pytest.skip("PostgreSQL binaries not found (apt-get install postgresql)")
    with postgres_server() as url:
        engine = create_engine(url, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text("CREATE DATABASE dpnode_template"))
        engine.dispose()
        upgrade(url.rsplit("/", 1)[0] + "/dpnode_template")
        yield url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "dpnode.sqlite3"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated database for one test, on each backend (dropped afterwards)."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path / "dpnode.sqlite3"
        shutil.copy(template, path)
        yield f"sqlite:///{path}"
        return
    server: str = request.getfixturevalue("postgres_url")
    name = f"dpnode_test_{os.getpid()}_{next(_names)}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name} TEMPLATE dpnode_template"))
    try:
        yield server.rsplit("/", 1)[0] + "/" + name
    finally:
        # FORCE: a server process a test started may still hold a connection.
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        admin.dispose()


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    # Argon2's memory cost is lowered to keep the suite fast; tests/node/test_security.py
    # checks the production default separately.
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        argon2_memory_kib=8 * 1024,
        argon2_time_cost=1,
        max_upload_bytes=8 * 1024 * 1024,
        max_upload_elements=500_000,
    )


@pytest.fixture
def context(settings: Settings) -> Iterator[NodeContext]:
    ctx = NodeContext.from_settings(settings)
    yield ctx
    ctx.close()


@pytest.fixture
def http(context: NodeContext) -> Iterator[TestClient]:
    """The real app, in process. A status the test sees that the app's OpenAPI document
    does not list for the route fails the test (tests/statuses.py)."""
    app = create_app(context=context)
    seen: set[Seen] = set()
    app.add_middleware(RecordStatuses, seen=seen)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client
    problems = undocumented(spec_of(app), seen)
    assert not problems, "\n".join(problems)


PASSWORD = "correct horse battery"


def make_user(context: NodeContext, email: str, role: str) -> User:
    with context.sessions() as session:
        return users.create_user(
            session, context.hasher, None, email=email, password=PASSWORD, role=role
        )


@pytest.fixture
def admin(context: NodeContext) -> User:
    return make_user(context, "admin@example.org", "admin")


@pytest.fixture
def owner(context: NodeContext) -> User:
    return make_user(context, "owner@example.org", "data_owner")


@pytest.fixture
def scientist(context: NodeContext) -> User:
    return make_user(context, "ds@example.org", "data_scientist")


def login(http: TestClient, email: str, password: str = PASSWORD) -> dict[str, str]:
    response = http.post("/api/v1/auth/login", json={"email": email, "password": password})
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.core.dp import samplers
from dpnode.node.db.models import User
from tests.conftest import PASSWORD
from tests.sdk.federation import Site, nodes

URL = "http://testserver"


def connect(http: TestClient, email: str) -> sdk.Client:
    """An SDK client on the real app, in process (TestClient's transport)."""
    return sdk.login(URL, email=email, password=PASSWORD, transport=http._transport)


@pytest.fixture
def admin_client(http: TestClient, admin: User) -> sdk.Client:
    return connect(http, admin.email)


@pytest.fixture
def owner_client(http: TestClient, owner: User) -> sdk.Client:
    return connect(http, owner.email)


@pytest.fixture
def ds_client(http: TestClient, scientist: User) -> sdk.Client:
    return connect(http, scientist.email)


@pytest.fixture
def sites(sqlite_template: Path, tmp_path: Path) -> Iterator[list[Site]]:
    """Three nodes in this process, each with its own database and users."""
    with nodes(sqlite_template, tmp_path, 3) as found:
        yield found


# -- remote tensors ------------------------------------------------------------------------


@pytest.fixture
def sqlite_only(request: pytest.FixtureRequest) -> None:
    """Marker fixture: remote-tensor tests do not depend on the database backend."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # remote-tensor tests exercise the SDK, not the database: run them on SQLite only
    keep = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        if (
            callspec is not None
            and "sqlite_only" in getattr(item, "fixturenames", ())
            and callspec.params.get("database_url") == "postgresql"
        ):
            continue
        keep.append(item)
    items[:] = keep


def cohort(n: int, seed: int) -> dict[str, np.ndarray]:
    """A small synthetic cohort with int, float, categorical, bool and per-row-shaped columns."""
    rng = np.random.default_rng(seed)
    return {
        "age": rng.integers(18, 90, n),
        "bmi": rng.uniform(15, 45, n).astype(np.float32),
        "sex": rng.integers(0, 2, n),
        "diabetic": rng.random(n) < 0.3,
        "scan": rng.uniform(0, 1, (n, 2, 3)).astype(np.float32),
    }


def remote_dataset(owner: sdk.Client, scientist: sdk.Client) -> sdk.DatasetHandle:
    """Upload a 40-row cohort with a 30-row mock; return the scientist's handle on it."""
    owner.upload_dataset(
        "cohort",
        cohort(40, 0),
        tags=["health"],
        bounds={"age": (0, 120), "bmi": (10, 70), "sex": (0, 1), "scan": (0, 1)},
        mock=cohort(30, 1),
    )
    return scientist.dataset("cohort")


@pytest.fixture
def seed(monkeypatch: pytest.MonkeyPatch) -> object:
    """``seed(n)``: the node's next noise streams come from a generator seeded with ``n``."""

    def reseed(n: int) -> None:
        rng = np.random.default_rng(n)
        monkeypatch.setattr(
            samplers,
            "secrets",
            SimpleNamespace(randbits=lambda k: int.from_bytes(rng.bytes(k // 8), "little")),
        )
        monkeypatch.setattr(samplers, "os", SimpleNamespace(urandom=rng.bytes))

    return reseed

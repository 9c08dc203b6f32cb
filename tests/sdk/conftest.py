from __future__ import annotations

import pytest
from starlette.testclient import TestClient

import sdk
from node.db.models import User
from tests.conftest import PASSWORD

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

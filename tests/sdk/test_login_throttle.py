"""A throttled login reaches the SDK user as RateLimitedError, with the node's message."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.db.models import User
from dpnode.node.settings import Settings
from tests.conftest import PASSWORD
from tests.sdk.conftest import URL


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"login_max_failures": 2})


def test_a_throttled_login_raises_rate_limited(http: TestClient, scientist: User) -> None:
    for _ in range(2):
        with pytest.raises(sdk.AuthenticationError):
            sdk.login(URL, email=scientist.email, password="not it!!", transport=http._transport)
    with pytest.raises(sdk.RateLimitedError) as caught:
        sdk.login(URL, email=scientist.email, password=PASSWORD, transport=http._transport)
    error = caught.value
    assert error.status == 429 and error.code == "rate_limited"
    assert error.retry_after is not None and 0 < error.retry_after <= 900
    assert error.detail == (
        f"too many failed logins for this email address; try again in {error.retry_after} seconds"
    )
    assert not isinstance(error, sdk.AuthenticationError)  # a wait, not wrong credentials

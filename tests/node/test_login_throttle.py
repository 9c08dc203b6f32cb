"""The login throttle: per email and per client address, before the password hash."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest
from argon2 import PasswordHasher
from httpx import Response
from starlette.testclient import TestClient

from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services.throttle import LoginThrottle, SlidingWindow
from dpnode.node.settings import Settings
from tests.conftest import PASSWORD, login
from tests.node.conftest import refused

MAX_FAILURES = 3
FAILURE_WINDOW = 900
MAX_PER_ADDRESS = 8
ADDRESS_WINDOW = 60


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class CountingHasher:
    """The context's hasher, counting the Argon2 computations it is asked for."""

    def __init__(self, inner: PasswordHasher) -> None:
        self.inner = inner
        self.verifies = 0
        self.hashes = 0

    def verify(self, password_hash: str, password: str) -> bool:
        self.verifies += 1
        return self.inner.verify(password_hash, password)

    def hash(self, password: str) -> str:
        self.hashes += 1
        return self.inner.hash(password)


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "login_max_failures": MAX_FAILURES,
            "login_failure_window_seconds": FAILURE_WINDOW,
            "login_max_attempts_per_address": MAX_PER_ADDRESS,
            "login_address_window_seconds": ADDRESS_WINDOW,
        }
    )


@pytest.fixture
def clock(context: NodeContext) -> Clock:
    clock = Clock()
    context.logins.now = clock
    return clock


@pytest.fixture
def hasher(context: NodeContext) -> CountingHasher:
    counting = CountingHasher(context.hasher)
    context.hasher = cast(PasswordHasher, counting)
    return counting


def attempt(http: TestClient, email: str, password: str = "wrong password!") -> Response:
    return http.post("/api/v1/auth/login", json={"email": email, "password": password})


def fail(http: TestClient, email: str, times: int) -> None:
    for _ in range(times):
        response = attempt(http, email)
        assert response.status_code == 401, response.text


def throttled(response: Response) -> tuple[str, int]:
    """Assert a 429 in the error shape; its message and Retry-After."""
    detail = refused(response, 429, "rate_limited")
    retry_after = int(response.headers["Retry-After"])
    assert f"try again in {retry_after} second" in detail
    return detail, retry_after


def audit_lines(http: TestClient, headers: dict[str, str], action: str) -> list[dict[str, Any]]:
    response = http.get("/api/v1/audit", params={"action": action}, headers=headers)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()
    return events


def test_an_account_is_locked_after_too_many_failures(
    http: TestClient, scientist: User, clock: Clock
) -> None:
    fail(http, scientist.email, MAX_FAILURES)
    clock.t += 100
    # locked even with the right password: the throttle answers before the password is read
    detail, retry_after = throttled(attempt(http, scientist.email, PASSWORD))
    assert retry_after == FAILURE_WINDOW - 100
    assert detail == (
        f"too many failed logins for this email address; try again in {retry_after} seconds"
    )
    # the email is normalised: another spelling is the same account
    assert throttled(attempt(http, " DS@Example.org", PASSWORD))[1] == retry_after


def test_an_unknown_email_gets_the_same_answer(
    http: TestClient, scientist: User, clock: Clock
) -> None:
    fail(http, scientist.email, MAX_FAILURES)
    fail(http, "nobody@example.org", MAX_FAILURES)
    known = attempt(http, scientist.email)
    unknown = attempt(http, "nobody@example.org")
    assert known.status_code == unknown.status_code == 429
    assert known.json() == unknown.json()
    assert known.headers["Retry-After"] == unknown.headers["Retry-After"]


def test_a_successful_login_clears_the_failures(
    http: TestClient, scientist: User, clock: Clock
) -> None:
    fail(http, scientist.email, MAX_FAILURES - 1)
    login(http, scientist.email)
    fail(http, scientist.email, MAX_FAILURES)  # a full allowance again
    throttled(attempt(http, scientist.email, PASSWORD))


def test_failures_leave_the_window(http: TestClient, scientist: User, clock: Clock) -> None:
    fail(http, scientist.email, 1)
    clock.t += 300
    fail(http, scientist.email, MAX_FAILURES - 1)
    _, retry_after = throttled(attempt(http, scientist.email, PASSWORD))
    assert retry_after == FAILURE_WINDOW - 300  # when the oldest failure leaves the window
    clock.t += retry_after - 1
    throttled(attempt(http, scientist.email, PASSWORD))
    clock.t += 1
    login(http, scientist.email)  # one slot free; the login then clears them all


def test_the_hash_is_not_computed_when_throttled(
    http: TestClient, scientist: User, clock: Clock, hasher: CountingHasher
) -> None:
    fail(http, scientist.email, MAX_FAILURES)
    fail(http, "nobody@example.org", MAX_FAILURES)
    assert hasher.verifies == 2 * MAX_FAILURES  # one Argon2 verification per admitted attempt
    assert hasher.hashes <= 1  # the unknown email's placeholder hash, made once
    for email in (scientist.email, "nobody@example.org"):
        for _ in range(3):
            throttled(attempt(http, email, PASSWORD))
    assert hasher.verifies == 2 * MAX_FAILURES
    assert hasher.hashes <= 1


def test_other_accounts_are_still_served(
    http: TestClient, scientist: User, admin: User, clock: Clock
) -> None:
    earlier = login(http, scientist.email)
    fail(http, scientist.email, MAX_FAILURES)
    throttled(attempt(http, scientist.email, PASSWORD))
    headers = login(http, admin.email)
    me = http.get("/api/v1/users/me", headers=headers)
    assert me.status_code == 200 and me.json()["email"] == admin.email
    # a token issued before the lockout keeps working: the throttle guards logins only
    me = http.get("/api/v1/users/me", headers=earlier)
    assert me.status_code == 200 and me.json()["email"] == scientist.email


def test_the_per_address_limit(
    http: TestClient, scientist: User, admin: User, clock: Clock
) -> None:
    # every attempt counts for the address, successful or not, whatever the email
    login(http, admin.email)
    for i in range(MAX_PER_ADDRESS - 1):
        assert attempt(http, f"user{i}@example.org").status_code == 401
    detail, retry_after = throttled(attempt(http, admin.email, PASSWORD))
    assert detail == (
        f"too many login attempts from your address; try again in {retry_after} seconds"
    )
    assert retry_after == ADDRESS_WINDOW
    # another address is served meanwhile
    with TestClient(http.app, client=("203.0.113.7", 5000)) as elsewhere:
        login(elsewhere, admin.email)
    clock.t += ADDRESS_WINDOW
    login(http, admin.email)


def test_forwarded_for_counts_only_behind_a_trusted_proxy(
    http: TestClient, context: NodeContext, admin: User, clock: Clock
) -> None:
    def spoofed(client: TestClient, i: int) -> Response:
        return client.post(
            "/api/v1/auth/login",
            json={"email": f"user{i}@example.org", "password": "wrong password!"},
            headers={"X-Forwarded-For": f"198.51.100.{i}"},
        )

    # not trusted (the default): a client cannot dodge the limit by inventing addresses
    for i in range(MAX_PER_ADDRESS):
        assert spoofed(http, i).status_code == 401
    throttled(spoofed(http, MAX_PER_ADDRESS))

    context.settings = context.settings.model_copy(update={"trusted_proxies": ["10.0.0.0/8"]})
    with TestClient(http.app, client=("10.1.2.3", 5000)) as proxied:
        for i in range(MAX_PER_ADDRESS + 2):
            assert spoofed(proxied, 100 + i).status_code == 401  # each its own address


def test_throttled_attempts_are_audited_once_per_block(
    http: TestClient, scientist: User, admin: User, clock: Clock
) -> None:
    headers = login(http, admin.email)
    fail(http, scientist.email, MAX_FAILURES)
    for _ in range(3):
        throttled(attempt(http, scientist.email))
    lines = audit_lines(http, headers, "auth.login_throttled")
    assert [line["detail"] for line in lines] == [
        {
            "email": scientist.email,
            "address": "testclient",
            "scope": "account",
            "retry_after": FAILURE_WINDOW,
        }
    ]
    assert lines[0]["actor_id"] is None
    assert len(audit_lines(http, headers, "auth.login_failed")) == MAX_FAILURES
    # a new block after the window is audited again
    clock.t += FAILURE_WINDOW
    fail(http, scientist.email, MAX_FAILURES)
    throttled(attempt(http, scientist.email))
    assert len(audit_lines(http, headers, "auth.login_throttled")) == 2


# -- the structure itself ----------------------------------------------------------------


def test_the_tables_are_bounded() -> None:
    window = SlidingWindow(limit=2, window=10.0, max_keys=3)
    for i in range(10):
        window.add(f"k{i}", float(i))
    assert len(window) == 3  # the least recently used keys were forgotten
    window.add("k0", 100.0)
    window.add("k0", 101.0)
    window.add("k0", 102.0)
    assert window.wait("k0", 102.0) == 9.0  # only the last ``limit`` times are kept


def test_expired_entries_are_dropped() -> None:
    window = SlidingWindow(limit=2, window=10.0)
    window.add("k", 0.0)
    assert window.wait("k", 10.0) == 0.0
    assert len(window) == 0


@pytest.fixture
def throttle() -> Iterator[LoginThrottle]:
    yield LoginThrottle(
        max_failures=5, failure_window=60, max_attempts_per_address=1000, address_window=60
    )


def test_concurrent_guesses_cannot_exceed_the_limit(throttle: LoginThrottle) -> None:
    # The attempt counts as a failure when admitted, so guesses racing each other while
    # their hashes run cannot all slip in.
    barrier = threading.Barrier(32)
    admitted: list[bool] = []

    def guess() -> None:
        barrier.wait()
        admitted.append(throttle.admit("ds@example.org", "192.0.2.1") is None)

    threads = [threading.Thread(target=guess) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(admitted) == 5

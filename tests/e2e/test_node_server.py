"""The acceptance flow against a real server process, across a restart."""

from __future__ import annotations

import numpy as np
import pytest

from dpnode import sdk
from dpnode.node.demo import ACCOUNTS
from tests.e2e.conftest import Server

ADMIN, OWNER, SCIENTIST = ACCOUNTS


def test_demo_node_walkthrough_survives_a_restart(demo_server: Server) -> None:
    assert "ds@example.org" in demo_server.output() and "sdk.login(" in demo_server.output()
    owner = sdk.login(demo_server.url, email=OWNER.email, password=OWNER.password)
    owner.create_user("new-ds@example.org", password="a new password", role="data_scientist")
    rng = np.random.default_rng(7)
    owner.upload_dataset(
        "clinic",
        {"age": rng.integers(18, 90, 500), "bmi": rng.uniform(15, 45, 500)},
        bounds={"age": (0, 120), "bmi": (10, 70)},
        tags=["health", "clinic"],
    )
    scientist = sdk.login(demo_server.url, email="new-ds@example.org", password="a new password")
    found = sdk.search(tags=["health", "clinic"])
    assert [d.name for d in found] == ["clinic"]
    clinic = found[0]
    assert isinstance(clinic, sdk.DatasetHandle)
    assert clinic.shape == (500, 2) and clinic.bounds == {"age": (0, 120), "bmi": (10, 70)}
    assert {d.name for d in scientist.search(tags=["health"])} == {
        "breast_cancer",
        "clinic",
        "diabetes",
    }
    with pytest.raises(sdk.PermissionDeniedError, match="cannot upload"):
        scientist.upload_dataset("x", {"a": [1.0]}, bounds={"a": (0, 1)})
    with pytest.raises(sdk.PermissionDeniedError, match="cannot list users"):
        scientist.users()
    with pytest.raises(sdk.PermissionDeniedError, match="never receive real values"):
        clinic.download()
    clinic["bmi"].mean().publish(epsilon=0.5)
    spent = scientist.budget().spent_epsilon

    demo_server.restart()  # a clean stop (SIGTERM) returns the budget mark's reservation

    again = sdk.login(demo_server.url, email="new-ds@example.org", password="a new password")
    clinic = again.dataset("clinic")
    assert clinic.shape == (500, 2) and clinic.tags == ["clinic", "health"]
    owner = sdk.login(demo_server.url, email=OWNER.email, password=OWNER.password)
    np.testing.assert_array_equal(owner.dataset("clinic").download()["age"].shape, (500,))
    assert len(again.search(tags=["health"])) == 3  # demo seeding did not duplicate anything
    assert again.budget().spent_epsilon == spent  # nothing refunded, nothing forfeited
    clinic["bmi"].mean().publish(epsilon=0.5)  # publishes are served after the restart
    assert again.budget().spent_epsilon == pytest.approx(spent + 0.5)


def test_bad_input_gets_clear_errors_and_the_node_keeps_serving(server: Server) -> None:
    import httpx

    api = server.url + "/api/v1"
    bad_json = httpx.post(
        api + "/auth/login", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert bad_json.status_code == 422 and bad_json.json()["error"] == "invalid_request"
    wrong = httpx.post(api + "/auth/login", json={"email": "no@one.org", "password": "x"})
    assert wrong.status_code == 401
    garbage = httpx.post(
        api + "/datasets", content=b"\x00" * 64, headers={"Authorization": "Bearer not-a-token"}
    )
    assert garbage.status_code == 401 and "invalid session token" in garbage.json()["detail"]
    health = httpx.get(api + "/health").json()
    assert health["status"] == "ok" and health["database"] in {"sqlite", "postgresql"}

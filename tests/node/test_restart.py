"""What a node stored survives a restart: same settings, new process state, same data."""

from __future__ import annotations

import numpy as np
from starlette.testclient import TestClient

from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from dpnode.node.db.models import User
from dpnode.node.services import datasets, models
from dpnode.node.settings import Settings
from tests.conftest import login
from tests.node.conftest import upload_model, upload_ok
from tests.node.frames import read_frame


def test_data_survives_a_restart_and_is_verified_on_read(settings: Settings, owner: User) -> None:
    x = np.random.default_rng(3).uniform(0, 1, size=(40, 3)).astype(np.float32)
    first = NodeContext.from_settings(settings)
    try:
        with TestClient(create_app(context=first)) as http:
            headers = login(http, owner.email)
            upload_ok(
                http,
                headers,
                "d",
                {"x": x, "who": np.repeat(np.arange(20), 2)},
                bounds={"x": (0, 1)},
                subject_id="who",
                mock={"x": x[:2]},
                tags=["kept"],
            )
            assert upload_model(http, headers, "m", {"w": x[0]}).status_code == 201
    finally:
        first.close()

    second = NodeContext.from_settings(settings)
    try:
        with TestClient(create_app(context=second)) as http:
            # The token issued by the first run is still valid after the restart.
            assert http.get("/api/v1/users/me", headers=headers).status_code == 200
            body = http.get("/api/v1/search", params={"tags": "kept"}, headers=headers).json()
            (meta,) = body["datasets"]
            assert (meta["name"], meta["row_count"], meta["subject_count"]) == ("d", 40, 20)
            _, arrays = read_frame(http.get("/api/v1/datasets/d/data", headers=headers).content)
            assert arrays["x"].tobytes() == x.tobytes()
        # The services read through the store, which checks every blob against its hash.
        with second.sessions() as session:
            dataset = datasets.get_dataset(session, "d")
            mock = datasets.read_columns(second.store, dataset, mock=True)
            np.testing.assert_array_equal(mock["x"], x[:2])
            owner_again = session.get(User, owner.id)
            assert owner_again is not None
            model = models.get_model(session, "m")
            weights = models.read_weights(second.store, owner_again, model)
            np.testing.assert_array_equal(weights["w"], x[0])
    finally:
        second.close()

from __future__ import annotations

import re

import httpx
import numpy as np
import pandas as pd
import pytest
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.app import create_app
from dpnode.node.db.models import User
from tests.conftest import PASSWORD
from tests.sdk.conftest import URL, connect


def _frame(n: int = 40, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "patient_id": rng.integers(0, n // 2, n),
            "age": rng.integers(18, 90, n),
            "bmi": rng.uniform(15, 45, n).astype(np.float32),
            "sex": rng.choice(["F", "M"], n),
            "diabetic": rng.random(n) < 0.3,
        }
    )


def upload_diabetes(
    owner: sdk.Client, frame: pd.DataFrame | None = None, **overrides: object
) -> sdk.DatasetHandle:
    kwargs: dict[str, object] = {
        "tags": ["health", "tabular"],
        "description": "A small synthetic cohort",
        "bounds": {"age": (0, 120), "bmi": (10, 70)},
        "categories": {"sex": ["F", "M"]},
        "subject_id": "patient_id",
        "mock": _frame(seed=1),
    }
    kwargs.update(overrides)
    data = _frame() if frame is None else frame
    return owner.upload_dataset("diabetes", data, **kwargs)  # type: ignore[arg-type]


def test_owner_uploads_and_scientist_finds(owner_client: sdk.Client, ds_client: sdk.Client) -> None:
    uploaded = upload_diabetes(owner_client)
    assert uploaded.shape == (40, 4)  # the subject id column is structure, not data
    found = sdk.search(tags=["HEALTH"])  # the last login: the data scientist
    assert [h.name for h in found] == ["diabetes"]
    ds = found[0]
    assert isinstance(ds, sdk.DatasetHandle)
    assert ds.bounds == {"age": (0, 120), "bmi": (10, 70), "sex": (0, 1), "diabetic": (0, 1)}
    assert ds.columns["sex"].categories == ("F", "M")
    assert ds.subject_id == "patient_id" and ds.subject_count <= 20
    text = repr(ds)
    assert "'diabetes'" in text and "shape=(40, 4)" in text
    assert "age       int64 in [0, 120]" in text
    assert "sex       int64 categories [F, M]" in text
    assert ds_client.search(tags=["health", "imaging"]) == []
    assert [d.name for d in ds_client.search(text="COHORT")] == ["diabetes"]


def test_scientist_is_refused_with_typed_errors(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    upload_diabetes(owner_client)
    ds = ds_client.dataset("diabetes")
    with pytest.raises(sdk.PermissionDeniedError, match="never receive real values"):
        ds.download()
    with pytest.raises(sdk.PermissionDeniedError, match="cannot upload"):
        ds_client.upload_dataset("mine", {"x": [1.0]}, bounds={"x": (0, 1)})
    with pytest.raises(sdk.PermissionDeniedError, match="cannot list users"):
        ds_client.users()
    with pytest.raises(sdk.PermissionDeniedError):
        ds_client.create_user("other@example.org", "long enough pw", role="admin")
    # The mock is fake by definition: anyone may have it, with the data's dtypes.
    mock = ds.mock()
    assert mock["age"].dtype == np.int64 and mock["bmi"].dtype == np.float32
    assert set(np.unique(mock["sex"])) <= {0, 1}


def test_owner_gets_back_exactly_what_the_contract_kept(owner_client: sdk.Client) -> None:
    frame = _frame()
    frame.loc[0, "age"] = 150  # out of bounds: clamped on request
    ds = upload_diabetes(owner_client, frame, clamp=["age"])
    data = ds.download()
    assert data["age"][0] == 120
    np.testing.assert_array_equal(data["age"][1:], frame["age"].to_numpy()[1:])
    np.testing.assert_array_equal(data["sex"], (frame["sex"] == "M").to_numpy().astype(np.int64))
    assert data["diabetic"].dtype == np.bool_


def test_downloads_keep_the_columns_in_the_datasets_order(owner_client: sdk.Client) -> None:
    # Twelve columns named out of alphabetical order, of three dtypes: the frame's own header
    # lists tensors in no fixed order, so only the manifest's order can give them back.
    names = [f"{letter}{i}" for i, letter in enumerate("zqmaxkbtcwey")]
    dtypes = [np.float64, np.int64, np.float32]
    frame = pd.DataFrame({n: np.arange(10).astype(dtypes[i % 3]) for i, n in enumerate(names)})
    ds = owner_client.upload_dataset(
        "ordered", frame, bounds={n: (0, 10) for n in names}, mock=frame.iloc[:5]
    )
    for _ in range(3):
        assert list(ds.mock()) == names
        assert list(ds.download()) == names
        assert list(ds.mock().to_pandas().columns) == names


def test_upload_errors_name_the_column(owner_client: sdk.Client) -> None:
    frame = _frame()
    frame.loc[:2, "age"] = 300
    with pytest.raises(sdk.UploadRejectedError) as info:
        owner_client.upload_dataset(
            "bad",
            frame,
            bounds={"age": (0, 120), "bmi": (10, 70)},
            categories={"sex": ["F", "M"]},
            subject_id="patient_id",
        )
    assert "column 'age' has 3 values outside its declared bounds [0, 120]" in str(info.value)
    assert info.value.code == "upload_rejected" and info.value.status == 422
    with pytest.raises(sdk.UploadRejectedError, match="column 'bmi' has no declared bounds"):
        owner_client.upload_dataset(
            "bad",
            frame,
            bounds={"age": (0, 300)},
            categories={"sex": ["F", "M"]},
            subject_id="patient_id",
        )
    with pytest.raises(sdk.UploadRejectedError, match="not among its declared categories"):
        owner_client.upload_dataset(
            "bad",
            frame,
            bounds={"age": (0, 300), "bmi": (10, 70)},
            categories={"sex": ["F"]},
            subject_id="patient_id",
        )
    frame.loc[5, "bmi"] = np.nan
    with pytest.raises(sdk.UploadRejectedError, match="1 NaN or infinite values"):
        owner_client.upload_dataset(
            "bad",
            frame,
            bounds={"age": (0, 300), "bmi": (10, 70)},
            categories={"sex": ["F", "M"]},
            subject_id="patient_id",
        )


def test_models_public_and_private(owner_client: sdk.Client, ds_client: sdk.Client) -> None:
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(3, 1)
    owner_client.upload_model(
        "open-net",
        net,
        tags=["demo"],
        public=True,
        architecture="import torch\nnet = torch.nn.Linear(3, 1)\n",
    )
    owner_client.upload_model("closed-net", {"w": np.ones((2, 2), np.float32)}, tags=["demo"])
    found = {h.name: h for h in ds_client.search(tags=["demo"], kind="model")}
    assert set(found) == {"open-net", "closed-net"}
    open_net = found["open-net"]
    assert isinstance(open_net, sdk.ModelHandle)
    weights = open_net.weights()
    np.testing.assert_array_equal(weights["weight"], net.weight.detach().numpy())
    assert open_net.architecture().startswith(b"import torch")
    assert "weight  float32 (1, 3)" in repr(open_net)
    closed = found["closed-net"]
    assert isinstance(closed, sdk.ModelHandle)
    with pytest.raises(sdk.PermissionDeniedError, match="private"):
        closed.weights()


def test_admin_manages_users(admin_client: sdk.Client, http: TestClient) -> None:
    created = admin_client.create_user("New@Example.org", "a long password", role="data_owner")
    assert created.email == "new@example.org" and created.role == "data_owner"
    assert "new@example.org" in [u.email for u in admin_client.users()]
    with pytest.raises(sdk.InvalidRequestError, match="unknown role 'wizard'"):
        admin_client.create_user("x@example.org", "a long password", role="wizard")
    with pytest.raises(sdk.ConflictError, match="already exists"):
        admin_client.create_user("new@example.org", "a long password", role="data_owner")
    admin_client.update_user("new@example.org", active=False)
    with pytest.raises(sdk.AuthenticationError, match="wrong email or password"):
        sdk.login(
            URL, email="new@example.org", password="a long password", transport=http._transport
        )
    actions = [e.action for e in admin_client.audit(limit=10)]
    assert {"user.create", "user.update", "auth.login_failed"} <= set(actions)


def test_wrong_password_and_unreachable_node(http: TestClient, scientist: User) -> None:
    with pytest.raises(sdk.AuthenticationError):
        sdk.login(URL, email=scientist.email, password="nope", transport=http._transport)
    with pytest.raises(sdk.NodeUnreachableError, match="cannot reach the node"):
        sdk.login("http://127.0.0.1:9", email="a@b.org", password="x")


def test_an_address_that_is_not_the_nodes_root_is_named_with_the_one_to_use(
    http: TestClient, scientist: User
) -> None:
    for page in ("/api/v1", "/api/v1/", "/console/"):
        with pytest.raises(sdk.InvalidRequestError, match=f"use '{URL}' \\(the SDK adds /api/v1"):
            sdk.login(URL + page, email=scientist.email, password=PASSWORD)
    # any other address the node does not answer at: said with the address it tried
    with pytest.raises(
        sdk.NotFoundError, match="nothing answers http://testserver/elsewhere/api/v1/auth/login"
    ) as info:
        sdk.login(
            URL + "/elsewhere", email=scientist.email, password=PASSWORD, transport=http._transport
        )
    assert "Give its root, as `dpnode serve` prints it" in str(info.value)
    assert info.value.status == 404


class Recorder(httpx.BaseTransport):
    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner
        self.seen: set[tuple[str, str]] = set()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.add((request.method, request.url.path))
        return self.inner.handle_request(request)


def test_every_route_the_sdk_calls_exists(http: TestClient, admin: User, owner: User) -> None:
    recorder = Recorder(http._transport)
    admin_c = sdk.login(URL, email=admin.email, password=PASSWORD, transport=recorder)
    owner_c = sdk.login(URL, email=owner.email, password=PASSWORD, transport=recorder)
    ds = upload_diabetes(owner_c)
    model = owner_c.upload_model(
        "m", {"w": np.zeros(2, np.float32)}, public=True, architecture=b"x"
    )
    owner_c.me(), owner_c.version(), owner_c.search(), owner_c.datasets(), owner_c.models()
    owner_c.dataset(ds.id), owner_c.model(model.id), ds.mock(), ds.download()
    model.weights(), model.architecture()
    user = admin_c.create_user("z@example.org", "long enough pw")
    admin_c.users(), admin_c.update_user(user.id, role="data_owner"), admin_c.audit()
    ds.delete(), model.delete()
    spec = create_app.__module__ and http.app.openapi()["paths"]  # type: ignore[attr-defined]
    patterns = {
        method.upper(): [
            re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", p) + "$")
            for p, ops in spec.items()
            if method in ops
        ]
        for method in ("get", "post", "patch", "delete")
    }
    assert len(recorder.seen) >= 17
    for method, path in recorder.seen:
        assert any(p.match(path) for p in patterns[method]), f"{method} {path} is not a route"
    for handle_user in (admin_c, owner_c):
        handle_user.close()
    connect(http, owner.email).close()

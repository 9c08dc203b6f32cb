"""Models over HTTP: upload, metadata, weights and architecture downloads, deletion."""

from __future__ import annotations

import numpy as np
from starlette.testclient import TestClient

from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from tests.conftest import login, make_user
from tests.node.conftest import blob_files, refused, upload_model
from tests.node.frames import read_frame

MODELS = "/api/v1/models"
ARCH = b"class Net(torch.nn.Module):\n    ...\n"


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "fc.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "fc.bias": np.zeros(3, dtype=np.float32),
        "steps": np.array(7, dtype=np.int64),
    }


def test_upload_and_metadata(http: TestClient, owner_h: dict[str, str]) -> None:
    response = upload_model(
        http,
        owner_h,
        "net",
        weights(),
        architecture=ARCH,
        architecture_filename="net.py",
        tags=["Vision"],
        description="a tiny net",
        public=True,
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["name"] == "net" and body["description"] == "a tiny net"
    assert body["tags"] == ["vision"] and body["public"] is True
    assert body["owner"] == "owner@example.org"
    assert body["architecture_filename"] == "net.py"
    assert body["tensors"] == [
        {"name": "fc.weight", "dtype": "float32", "shape": [3, 4]},
        {"name": "fc.bias", "dtype": "float32", "shape": [3]},
        {"name": "steps", "dtype": "int64", "shape": []},
    ]
    assert http.get(f"{MODELS}/net", headers=owner_h).json() == body
    assert http.get(f"{MODELS}/{body['id']}", headers=owner_h).json() == body
    assert [m["name"] for m in http.get(MODELS, headers=owner_h).json()] == ["net"]


def test_public_weights_for_anyone_logged_in(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    sent = weights()
    upload_model(http, owner_h, "net", sent, architecture=ARCH, public=True)
    response = http.get(f"{MODELS}/net/weights", headers=ds_h)
    assert response.status_code == 200, response.text
    manifest, arrays = read_frame(response.content)
    assert manifest == {"model": "net", "tensors": ["fc.weight", "fc.bias", "steps"]}
    for name, array in sent.items():
        assert arrays[name].dtype == array.dtype
        np.testing.assert_array_equal(arrays[name], array)
    architecture = http.get(f"{MODELS}/net/architecture", headers=ds_h)
    assert architecture.content == ARCH
    assert architecture.headers["content-disposition"] == 'attachment; filename="architecture"'
    refused(http.get(f"{MODELS}/net/weights"), 401, "unauthenticated")


def test_private_weights_for_the_owner_and_admins_only(
    http: TestClient,
    context: NodeContext,
    owner_h: dict[str, str],
    admin_h: dict[str, str],
    ds_h: dict[str, str],
) -> None:
    upload_model(http, owner_h, "secret", weights(), architecture=ARCH)
    make_user(context, "other@example.org", "data_owner")
    message = (
        "model 'secret' is private: its weights stay on the node; use them as remote tensors "
        "and publish results"
    )
    for headers in (ds_h, login(http, "other@example.org")):
        assert refused(http.get(f"{MODELS}/secret/weights", headers=headers), 403, "forbidden") == (
            message
        )
        response = http.get(f"{MODELS}/secret/architecture", headers=headers)
        assert refused(response, 403, "forbidden") == message
        assert http.get(f"{MODELS}/secret", headers=headers).status_code == 200
    for headers in (owner_h, admin_h):
        assert http.get(f"{MODELS}/secret/weights", headers=headers).status_code == 200
        assert http.get(f"{MODELS}/secret/architecture", headers=headers).content == ARCH


def test_architecture_filenames_travel_in_the_header_safely(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    upload_model(
        http, owner_h, "net", weights(), architecture=ARCH, architecture_filename='模型 "v2".py'
    )
    response = http.get(f"{MODELS}/net/architecture", headers=owner_h)
    assert response.status_code == 200, response.text
    assert response.content == ARCH
    assert response.headers["content-disposition"] == (
        "attachment; filename=\"__ _v2_.py\"; filename*=UTF-8''%E6%A8%A1%E5%9E%8B%20%22v2%22.py"
    )


def test_no_architecture(http: TestClient, owner_h: dict[str, str]) -> None:
    body = upload_model(http, owner_h, "net", weights(), architecture_filename="x.py").json()
    assert body["architecture_filename"] is None
    detail = refused(http.get(f"{MODELS}/net/architecture", headers=owner_h), 404, "not_found")
    assert detail == "model 'net' has no architecture file"


def test_refused_uploads_store_nothing(
    http: TestClient, context: NodeContext, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    bad = weights() | {"zz.nan": np.array([1.0, np.nan], dtype=np.float32)}
    detail = refused(
        upload_model(http, owner_h, "net", bad, architecture=ARCH), 422, "upload_rejected"
    )
    assert detail == "weight 'zz.nan' has NaN or infinite values"
    inf = {"w": np.array([np.inf])}
    detail = refused(upload_model(http, owner_h, "net", inf), 422, "upload_rejected")
    assert detail == "weight 'w' has NaN or infinite values"
    detail = refused(upload_model(http, ds_h, "net", weights()), 403, "forbidden")
    assert detail == "data scientists cannot upload models; ask a data owner or an admin"
    response = upload_model(http, owner_h, "net", weights(), architecture=b"x" * 600_000)
    assert refused(response, 422, "upload_rejected") == (
        "tensor 'architecture' of shape [600000] is over the limit of 500000 elements"
    )
    assert http.get(MODELS, headers=owner_h).json() == []
    # A refused upload leaves no orphaned bytes behind in the blob store.
    assert blob_files(context) == set()


def test_name_conflict_and_unknown(http: TestClient, owner_h: dict[str, str]) -> None:
    assert upload_model(http, owner_h, "net", weights()).status_code == 201
    detail = refused(upload_model(http, owner_h, "net", weights()), 409, "conflict")
    assert detail == "a model named 'net' already exists"
    assert (
        refused(http.get(f"{MODELS}/nope", headers=owner_h), 404, "not_found") == "no model 'nope'"
    )
    assert refused(http.get(f"{MODELS}/77/weights", headers=owner_h), 404, "not_found") == (
        "no model 77"
    )


def test_delete(
    http: TestClient,
    context: NodeContext,
    owner_h: dict[str, str],
    admin_h: dict[str, str],
    ds_h: dict[str, str],
) -> None:
    shared = weights()
    upload_model(http, owner_h, "a", shared, architecture=ARCH)
    upload_model(http, owner_h, "b", shared | {"extra": np.ones(2)})
    assert len(blob_files(context)) == 5  # three shared weights, one extra, one architecture
    message = "only the owner of model 'a' or an admin may do this"
    assert refused(http.delete(f"{MODELS}/a", headers=ds_h), 403, "forbidden") == message
    assert http.delete(f"{MODELS}/a", headers=owner_h).status_code == 204
    assert len(blob_files(context)) == 4
    _, arrays = read_frame(http.get(f"{MODELS}/b/weights", headers=owner_h).content)
    np.testing.assert_array_equal(arrays["fc.weight"], shared["fc.weight"])
    assert http.delete(f"{MODELS}/b", headers=admin_h).status_code == 204
    assert blob_files(context) == set()
    assert refused(http.get(f"{MODELS}/b", headers=owner_h), 404, "not_found") == "no model 'b'"


def test_architecture_files_are_limited_to_one_mebibyte(
    context: NodeContext, owner_h: dict[str, str]
) -> None:
    # The suite's element limit (500 000) is below 1 MiB: raise it to reach this check.
    settings = context.settings.model_copy(update={"max_upload_elements": 2_000_000})
    roomy = NodeContext.from_settings(settings)
    try:
        with TestClient(create_app(context=roomy), raise_server_exceptions=False) as http:
            big = b"x" * (1024 * 1024 + 1)
            response = upload_model(http, owner_h, "net", weights(), architecture=big)
            detail = refused(response, 422, "upload_rejected")
            assert detail == "the architecture file is over 1048576 bytes"
            response = upload_model(http, owner_h, "net", weights(), architecture=big[:-1])
            assert response.status_code == 201, response.text
    finally:
        roomy.close()


def test_public_is_a_json_boolean(http: TestClient, owner_h: dict[str, str]) -> None:
    # pydantic's lax bool read "yes", "on", "1", "true" and 1 as true: a model made public
    for public in ("yes", "on", "1", "true", 1, "false", 0, None):
        response = upload_model(http, owner_h, "m", weights(), public=public)
        detail = refused(response, 422, "invalid_request")
        assert detail.startswith("invalid model manifest:") and "public" in detail, public
    assert http.get(MODELS, headers=owner_h).json() == []
    for public in (True, False):
        response = upload_model(http, owner_h, f"m-{public}", weights(), public=public)
        assert response.status_code == 201 and response.json()["public"] is public

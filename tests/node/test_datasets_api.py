"""Datasets over HTTP: upload, metadata, listing, deletion, mock and real downloads."""

from __future__ import annotations

from typing import Any

import numpy as np
from starlette.testclient import TestClient

from dpnode.node.context import NodeContext
from tests.conftest import login, make_user
from tests.node.conftest import blob_files, refused, upload, upload_model, upload_ok
from tests.node.frames import read_frame

DATASETS = "/api/v1/datasets"


def test_upload_returns_the_public_metadata(http: TestClient, owner_h: dict[str, str]) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 2, 3), dtype=np.uint8)
    body = upload_ok(
        http,
        owner_h,
        "clinic",
        {
            "age": np.array([30, 40, 50, 60, 70], dtype=np.int32),
            "weight": np.array([60.5, 70.0, 80.25, 55.0, 90.0], dtype=np.float32),
            "smoker": np.array([True, False, False, True, False]),
            "scan": images,
            "sex": ["f", "m", "f", "x", "m"],
        },
        bounds={"age": (0, 120), "weight": (30, 200), "scan": (0, 255)},
        categories={"sex": ["f", "m", "x"]},
        tags=["Health", "tabular", "health"],
        description="a small clinic",
    )
    assert body["name"] == "clinic"
    assert body["description"] == "a small clinic"
    assert body["tags"] == ["health", "tabular"]
    assert body["owner"] == "owner@example.org"
    assert body["row_count"] == 5
    assert body["subject_id"] is None
    assert body["subject_count"] == 5
    assert body["max_rows_per_subject"] == 1
    assert body["has_mock"] is False and body["mock_row_count"] is None
    assert body["columns"] == [
        {"name": "age", "dtype": "int32", "shape": [], "bounds": [0.0, 120.0], "categories": None},
        {
            "name": "weight",
            "dtype": "float32",
            "shape": [],
            "bounds": [30.0, 200.0],
            "categories": None,
        },
        {"name": "smoker", "dtype": "bool", "shape": [], "bounds": [0.0, 1.0], "categories": None},
        {
            "name": "scan",
            "dtype": "uint8",
            "shape": [2, 3],
            "bounds": [0.0, 255.0],
            "categories": None,
        },
        {
            "name": "sex",
            "dtype": "int64",
            "shape": [],
            "bounds": [0.0, 2.0],
            "categories": ["f", "m", "x"],
        },
    ]
    by_id = http.get(f"{DATASETS}/{body['id']}", headers=owner_h).json()
    by_name = http.get(f"{DATASETS}/clinic", headers=owner_h).json()
    # its owner reads its cap too (none in the default policy)
    assert by_id["budget"]["capped"] is False and body["budget"] is None
    assert by_id == by_name == body | {"budget": by_id["budget"]}


def test_real_download_gives_back_exactly_what_was_stored(
    http: TestClient, owner_h: dict[str, str], admin_h: dict[str, str]
) -> None:
    data = {
        "age": np.array([30, 40, 50], dtype=np.int16),
        "x": np.array([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]),
        "sex": ["m", "f", "m"],
    }
    upload_ok(
        http,
        owner_h,
        "d",
        data,
        bounds={"age": (0, 120), "x": (0, 1)},
        categories={"sex": ["f", "m"]},
    )
    for headers in (owner_h, admin_h):
        response = http.get(f"{DATASETS}/d/data", headers=headers)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "application/vnd.dpnode.tensors"
        manifest, arrays = read_frame(response.content)
        assert manifest == {"dataset": "d", "kind": "data", "columns": ["age", "x", "sex"]}
        assert arrays["age"].dtype == np.int16
        np.testing.assert_array_equal(arrays["age"], data["age"])
        np.testing.assert_array_equal(arrays["x"], data["x"])
        assert arrays["sex"].dtype == np.int64
        np.testing.assert_array_equal(arrays["sex"], [1, 0, 1])


def test_data_scientists_never_download_real_values(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str], small_dataset: dict[str, Any]
) -> None:
    upload_ok(http, owner_h, "d", **small_dataset)
    detail = refused(http.get(f"{DATASETS}/d/data", headers=ds_h), 403, "forbidden")
    assert detail == (
        "data scientists never receive real values: compute on remote tensors and call "
        ".publish(epsilon=...) for a noised result, download the mock data, or make a "
        "synthetic copy with ds.synthesize(epsilon=..., delta=...)"
    )


def test_another_data_owner_may_not_download_or_delete(
    http: TestClient, context: NodeContext, owner_h: dict[str, str], small_dataset: dict[str, Any]
) -> None:
    upload_ok(http, owner_h, "d", **small_dataset)
    make_user(context, "other@example.org", "data_owner")
    other = login(http, "other@example.org")
    message = "only the owner of dataset 'd' or an admin may do this"
    assert refused(http.get(f"{DATASETS}/d/data", headers=other), 403, "forbidden") == message
    assert refused(http.delete(f"{DATASETS}/d", headers=other), 403, "forbidden") == message
    assert http.get(f"{DATASETS}/d", headers=other).status_code == 200


def test_mock_download_for_any_logged_in_user(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    data = {"b": np.array([1.0, 2.0, 3.0]), "a": np.array([1, 2, 3], dtype=np.int64)}
    mock = {"b": np.array([5.0, 6.0]), "a": np.array([7, 8], dtype=np.int64)}
    body = upload_ok(
        http,
        owner_h,
        "d",
        data,
        mock=mock,
        mock_columns=["b", "a"],
        bounds={"a": (0, 10), "b": (0, 10)},
    )
    assert body["has_mock"] is True and body["mock_row_count"] == 2
    response = http.get(f"{DATASETS}/d/mock", headers=ds_h)
    assert response.status_code == 200, response.text
    manifest, arrays = read_frame(response.content)
    # an uploaded mock: no synthetic provenance (a synthesized one carries it)
    assert manifest == {"dataset": "d", "kind": "mock", "columns": ["b", "a"], "synthetic": None}
    np.testing.assert_array_equal(arrays["b"], mock["b"])
    np.testing.assert_array_equal(arrays["a"], mock["a"])
    refused(http.get(f"{DATASETS}/d/mock"), 401, "unauthenticated")


def test_mock_columns_default_to_the_data_column_order(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    # Column names out of alphabetical order: the frame's tensors come back sorted.
    data = {"zeta": np.array([1.0, 2.0]), "alpha": np.array([3.0, 4.0])}
    mock = {"zeta": np.array([0.0]), "alpha": np.array([1.0])}
    body = upload_ok(http, owner_h, "d", data, mock=mock, bounds={"zeta": (0, 5), "alpha": (0, 5)})
    assert [c["name"] for c in body["columns"]] == ["zeta", "alpha"]
    _, arrays = read_frame(http.get(f"{DATASETS}/d/mock", headers=owner_h).content)
    np.testing.assert_array_equal(arrays["alpha"], [1.0])


def test_mock_of_a_dataset_without_one_is_not_found(
    http: TestClient, owner_h: dict[str, str], small_dataset: dict[str, Any]
) -> None:
    upload_ok(http, owner_h, "d", **small_dataset)
    detail = refused(http.get(f"{DATASETS}/d/mock", headers=owner_h), 404, "not_found")
    assert detail == "dataset 'd' has no mock data"


def test_mock_with_strings_and_subject_ids(http: TestClient, owner_h: dict[str, str]) -> None:
    body = upload_ok(
        http,
        owner_h,
        "visits",
        {"patient": ["p1", "p2", "p1"], "sex": ["f", "m", "f"], "cost": np.array([1.0, 2.0, 3.0])},
        mock={"sex": ["m"], "cost": np.array([9.0], dtype=np.float32)},
        categories={"sex": ["f", "m"]},
        bounds={"cost": (0, 10)},
        subject_id="patient",
    )
    assert [c["name"] for c in body["columns"]] == ["sex", "cost"]
    _, arrays = read_frame(http.get(f"{DATASETS}/visits/mock", headers=owner_h).content)
    np.testing.assert_array_equal(arrays["sex"], [1])
    assert arrays["cost"].dtype == np.float64  # cast to the data's dtype, values unchanged
    np.testing.assert_array_equal(arrays["cost"], [9.0])


#: (mock columns, why they are refused) against data a: int64 in [0, 10], b: float64 in [0, 10].
BAD_MOCKS: list[tuple[dict[str, Any], str]] = [
    (
        {"a": np.array([1], dtype=np.int64)},
        "bounds declared for column 'b', but the mock data has no such column",
    ),
    (
        {"b": np.array([1.0]), "a": np.array([1], dtype=np.int64), "c": np.array([True])},
        "mock data must have the same columns as the data, in order: ['a', 'b']",
    ),
    (
        {"a": np.array([[1.0, 2.0]]), "b": np.array([1.0])},
        "mock column 'a' has row shape [2], the data []",
    ),
    (
        {"a": np.array([1.5]), "b": np.array([1.0])},
        "mock column 'a' (float64) cannot be stored as the data's dtype int64 without "
        "changing its values",
    ),
    (
        {"a": np.array([99], dtype=np.int64), "b": np.array([1.0])},
        "mock column 'a' has 1 values outside its declared bounds [0, 10]; fix the bounds, "
        "or pass clamp=True to clip them",
    ),
    (
        {"a": np.array([1], dtype=np.int64), "b": np.array([np.nan])},
        "mock column 'b' has 1 NaN or infinite values; pass fill={'b': value} to replace "
        "them, or clean the data",
    ),
]


def test_mock_must_match_the_data(http: TestClient, owner_h: dict[str, str]) -> None:
    data = {"a": np.array([1, 2], dtype=np.int64), "b": np.array([1.0, 2.0])}
    for mock, message in BAD_MOCKS:
        response = upload(http, owner_h, "d", data, mock=mock, bounds={"a": (0, 10), "b": (0, 10)})
        assert refused(response, 422, "upload_rejected") == message
    assert http.get(DATASETS, headers=owner_h).json() == []


def test_name_conflict(
    http: TestClient, owner_h: dict[str, str], small_dataset: dict[str, Any]
) -> None:
    upload_ok(http, owner_h, "d", **small_dataset)
    detail = refused(upload(http, owner_h, "d", **small_dataset), 409, "conflict")
    assert detail == "a dataset named 'd' already exists"


def test_data_scientists_cannot_upload(
    http: TestClient, ds_h: dict[str, str], small_dataset: dict[str, Any]
) -> None:
    detail = refused(upload(http, ds_h, "d", **small_dataset), 403, "forbidden")
    assert detail == "data scientists cannot upload datasets; ask a data owner or an admin"


def test_list_and_unknown(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str], small_dataset: dict[str, Any]
) -> None:
    upload_ok(http, owner_h, "b", **small_dataset)
    upload_ok(http, owner_h, "a", **small_dataset)
    assert [d["name"] for d in http.get(DATASETS, headers=ds_h).json()] == ["a", "b"]
    assert [d["name"] for d in http.get(DATASETS, params={"limit": 1}, headers=ds_h).json()] == [
        "a"
    ]
    assert (
        refused(http.get(f"{DATASETS}/nope", headers=ds_h), 404, "not_found") == "no dataset 'nope'"
    )
    assert refused(http.get(f"{DATASETS}/999", headers=ds_h), 404, "not_found") == "no dataset 999"
    refused(http.get(DATASETS), 401, "unauthenticated")


def test_delete_by_owner_and_by_admin_removes_unshared_blobs(
    http: TestClient,
    context: NodeContext,
    owner_h: dict[str, str],
    admin_h: dict[str, str],
    ds_h: dict[str, str],
) -> None:
    shared = np.arange(10, dtype=np.int64)
    upload_ok(
        http,
        owner_h,
        "one",
        {"s": shared, "u": np.full(10, 1.0)},
        bounds={"s": (0, 9), "u": (0, 9)},
        mock={"s": shared[:2], "u": np.zeros(2)},
    )
    after_one = blob_files(context)
    assert len(after_one) == 4
    upload_ok(
        http,
        owner_h,
        "two",
        {"s": shared, "v": np.full(10, 2.0)},
        bounds={"s": (0, 9), "v": (0, 9)},
        subject_id=None,
    )
    assert len(blob_files(context)) == 5  # the shared column is stored once

    assert refused(http.delete(f"{DATASETS}/one", headers=ds_h), 403, "forbidden")
    assert http.delete(f"{DATASETS}/one", headers=owner_h).status_code == 204
    assert len(blob_files(context)) == 2  # "s" is still used by "two"
    assert refused(http.get(f"{DATASETS}/one", headers=owner_h), 404, "not_found")
    _, arrays = read_frame(http.get(f"{DATASETS}/two/data", headers=owner_h).content)
    np.testing.assert_array_equal(arrays["s"], shared)

    two_id = http.get(f"{DATASETS}/two", headers=admin_h).json()["id"]
    assert http.delete(f"{DATASETS}/{two_id}", headers=admin_h).status_code == 204
    assert blob_files(context) == set()
    assert http.get(DATASETS, headers=admin_h).json() == []
    assert (
        refused(http.delete(f"{DATASETS}/two", headers=admin_h), 404, "not_found")
        == "no dataset 'two'"
    )


def test_subject_ids_are_factorised_and_not_stored_as_a_column(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    body = upload_ok(
        http,
        owner_h,
        "visits",
        {
            "cost": np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            "patient": np.array([7, 3, 7, 7, 9, 3], dtype=np.int64),
        },
        bounds={"cost": (0, 10)},
        subject_id="patient",
    )
    assert body["subject_id"] == "patient"
    assert body["subject_count"] == 3
    assert body["max_rows_per_subject"] == 3
    assert [c["name"] for c in body["columns"]] == ["cost"]
    manifest, arrays = read_frame(http.get(f"{DATASETS}/visits/data", headers=owner_h).content)
    assert manifest["columns"] == ["cost"] and set(arrays) == {"cost"}


def test_string_subject_ids(http: TestClient, owner_h: dict[str, str]) -> None:
    body = upload_ok(
        http,
        owner_h,
        "visits",
        {"who": ["ann", "bob", "ann", "cy"], "x": np.array([1.0, 2.0, 3.0, 4.0])},
        bounds={"x": (0, 5)},
        subject_id="who",
    )
    assert (body["subject_count"], body["max_rows_per_subject"]) == (3, 2)


def test_names_a_url_cannot_reach_are_refused(
    http: TestClient, owner_h: dict[str, str], small_dataset: dict[str, Any]
) -> None:
    # "/datasets/2024" reads as an id and "/datasets/a/b" matches no route; "0024" and
    # numbers beyond any id read as names today, and are kept for ids all the same
    for name in ("2024", "a/b", "0024", "9" * 30):
        detail = refused(upload(http, owner_h, name, **small_dataset), 422, "upload_rejected")
        assert detail == (
            f"dataset name {name!r} cannot be used in URLs: it must not contain '/' nor be all "
            "digits 0-9 (those are read as ids)"
        )
    detail = refused(upload_model(http, owner_h, "7", {"w": np.ones(1)}), 422, "upload_rejected")
    assert detail.startswith("model name '7' cannot be used in URLs")
    # other scripts' digits name no id anywhere (isdigit() refused them): a path reads a name
    for name in ("2024-q1", "١٢", "²", "-1"):
        upload_ok(http, owner_h, name, **small_dataset)
        assert http.get(f"{DATASETS}/{name}", headers=owner_h).json()["name"] == name
    upload_model(http, owner_h, "٧", {"w": np.ones(1)}).raise_for_status()
    assert http.get("/api/v1/models/٧", headers=owner_h).json()["name"] == "٧"

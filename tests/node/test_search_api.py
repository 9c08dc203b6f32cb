"""Search: all of the tags (not any), case-insensitive, free text with literal % and _."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

from tests.node.conftest import refused, upload_model, upload_ok

SEARCH = "/api/v1/search"


def dataset(
    http: TestClient, headers: dict[str, str], name: str, tags: list[str], description: str = ""
) -> None:
    upload_ok(
        http,
        headers,
        name,
        {"x": np.array([1.0, 2.0])},
        bounds={"x": (0, 5)},
        tags=tags,
        description=description,
    )


def model(
    http: TestClient, headers: dict[str, str], name: str, tags: list[str], description: str = ""
) -> None:
    weights = {"w": np.ones(2, dtype=np.float32)}
    response = upload_model(http, headers, name, weights, tags=tags, description=description)
    assert response.status_code == 201, response.text


@pytest.fixture
def catalog(http: TestClient, owner_h: dict[str, str]) -> None:
    dataset(http, owner_h, "diabetes", ["health", "tabular"], "Blood sugar of 442 PATIENTS")
    dataset(http, owner_h, "heart", ["Health"], "ECG recordings")
    dataset(http, owner_h, "digits", ["vision", "tabular"], "8x8 images, 100% synthetic")
    dataset(http, owner_h, "rates_2024", ["finance"], "interest rates")
    dataset(http, owner_h, "ratesX2024", ["finance"], "more rates")
    dataset(http, owner_h, "paths", ["misc"], "a/b and c\\d")
    model(http, owner_h, "risk-model", ["health", "tabular"], "predicts diabetes risk")
    model(http, owner_h, "cnn", ["vision"], "100 percent real")


def search(http: TestClient, headers: dict[str, str], **params: Any) -> tuple[list[str], list[str]]:
    response = http.get(SEARCH, params=params, headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    return [d["name"] for d in body["datasets"]], [m["name"] for m in body["models"]]


def test_tags_must_all_match_whatever_their_case(
    http: TestClient, ds_h: dict[str, str], catalog: None
) -> None:
    assert search(http, ds_h, tags="health") == (["diabetes", "heart"], ["risk-model"])
    assert search(http, ds_h, tags=["HEALTH", "Tabular"]) == (["diabetes"], ["risk-model"])
    assert search(http, ds_h, tags=["health", "vision"]) == ([], [])
    assert search(http, ds_h, tags=["tabular", "tabular"]) == (
        ["diabetes", "digits"],
        ["risk-model"],
    )
    assert search(http, ds_h, tags=["unknown"]) == ([], [])


def test_free_text_over_name_and_description_ignores_case(
    http: TestClient, ds_h: dict[str, str], catalog: None
) -> None:
    assert search(http, ds_h, text="patients") == (["diabetes"], [])
    assert search(http, ds_h, text="DIABETES") == (["diabetes"], ["risk-model"])
    assert search(http, ds_h, text="ecg") == (["heart"], [])
    assert search(http, ds_h, text="  ") == search(http, ds_h)


def test_percent_underscore_and_slashes_are_literal(
    http: TestClient, ds_h: dict[str, str], catalog: None
) -> None:
    assert search(http, ds_h, text="100%") == (["digits"], [])
    assert search(http, ds_h, text="%") == (["digits"], [])
    assert search(http, ds_h, text="rates_") == (["rates_2024"], [])
    assert search(http, ds_h, text="_") == (["rates_2024"], [])
    assert search(http, ds_h, text="a/b") == (["paths"], [])
    assert search(http, ds_h, text="c\\d") == (["paths"], [])


def test_text_and_tags_combine_and_kind_filters(
    http: TestClient, ds_h: dict[str, str], catalog: None
) -> None:
    assert search(http, ds_h, tags="tabular", text="risk") == ([], ["risk-model"])
    assert search(http, ds_h, tags="health", kind="dataset") == (["diabetes", "heart"], [])
    assert search(http, ds_h, tags="health", kind="model") == ([], ["risk-model"])
    assert search(http, ds_h, kind="any", limit=1) == (["diabetes"], ["cnn"])
    # Order by name is the database's collation: compare as sets.
    datasets, models = search(http, ds_h)
    assert set(datasets) == {"diabetes", "digits", "heart", "paths", "rates_2024", "ratesX2024"}
    assert set(models) == {"cnn", "risk-model"}


def test_the_list_endpoints_filter_the_same_way(
    http: TestClient, ds_h: dict[str, str], catalog: None
) -> None:
    datasets = http.get("/api/v1/datasets", params={"tags": ["TABULAR", "health"]}, headers=ds_h)
    assert [d["name"] for d in datasets.json()] == ["diabetes"]
    models = http.get("/api/v1/models", params={"text": "PERCENT"}, headers=ds_h)
    assert [m["name"] for m in models.json()] == ["cnn"]


def test_non_ascii_text_matches_regardless_of_case(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    dataset(http, owner_h, "Ärzte", ["health"], "Études cliniques à Zürich")
    assert search(http, ds_h, text="ärzte") == (["Ärzte"], [])
    assert search(http, ds_h, text="ÉTUDES") == (["Ärzte"], [])
    assert search(http, ds_h, text="zürich") == (["Ärzte"], [])


def test_search_needs_a_login_and_valid_tags(http: TestClient, ds_h: dict[str, str]) -> None:
    refused(http.get(SEARCH, params={"tags": "health"}), 401, "unauthenticated")
    detail = refused(http.get(SEARCH, params={"tags": "a b"}, headers=ds_h), 422, "invalid_request")
    assert detail == (
        "tag 'a b' is not allowed: use 1-64 letters, digits or _ . : + - (starting with a letter "
        "or digit)"
    )

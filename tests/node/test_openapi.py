"""The OpenAPI document: the node's real error body, binary bodies, readable operationIds;
and /docs and /redoc served without a CDN."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.statuses import undocumented

SAFETENSORS_BODIES = {"upload_dataset", "upload_model"}
GRAPH_BODIES = {"publish", "sensitivity"}


def operations(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {op["operationId"]: op for path in spec["paths"].values() for op in path.values()}


@pytest.fixture
def spec(http: TestClient) -> dict[str, Any]:
    response = http.get("/openapi.json")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_operation_ids_are_readable_and_unique(spec: dict[str, Any]) -> None:
    ids = [op["operationId"] for path in spec["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z][a-z_]*", i) for i in ids), ids
    named = operations(spec)
    assert {"login", "list_datasets", "get_dataset", "upload_dataset", "publish"} <= set(named)
    assert named["list_datasets"] is spec["paths"]["/api/v1/datasets"]["get"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_every_error_is_the_nodes_error_body(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    assert "HTTPValidationError" not in schemas and "ValidationError" not in schemas
    assert schemas["Error"]["required"] == ["error", "detail"]
    for op_id, op in operations(spec).items():
        errors = {s: r for s, r in op["responses"].items() if int(s) >= 400}
        assert "500" in errors, op_id
        for status, response in errors.items():
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/Error"}, (op_id, status)
    named = operations(spec)
    # derived from dependencies: a token, an admin, a size-limited body
    assert "401" not in named["health"]["responses"]
    assert {"401", "422"} <= set(named["list_datasets"]["responses"])
    assert "403" in named["list_audit_events"]["responses"]
    assert {"413", "422"} <= set(named["publish"]["responses"])
    assert "429" in named["login"]["responses"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_binary_frames_have_request_bodies(spec: dict[str, Any]) -> None:
    named = operations(spec)
    for op_id in SAFETENSORS_BODIES | GRAPH_BODIES:
        body = named[op_id]["requestBody"]
        assert body["required"] is True
        schema = body["content"]["application/octet-stream"]["schema"]
        assert schema == {"type": "string", "format": "binary"}
        assert ("safetensors" if op_id in SAFETENSORS_BODIES else "DPG") in body["description"]
    frame = named["download_mock"]["responses"]["200"]["content"]
    assert frame == {
        "application/vnd.dpnode.tensors": {"schema": {"type": "string", "format": "binary"}}
    }


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_undocumented_status_fails_the_test_that_sees_it(
    http: TestClient, spec: dict[str, Any], ds_h: dict[str, str]
) -> None:
    answered = http.get("/api/v1/datasets/nothing-here", headers=ds_h)
    assert answered.status_code == 404
    seen = [("GET", "/api/v1/datasets/nothing-here", 404)]
    assert undocumented(spec, seen) == []
    del spec["paths"]["/api/v1/datasets/{dataset_ref}"]["get"]["responses"]["404"]
    assert undocumented(spec, seen) == [
        "GET /api/v1/datasets/nothing-here (get_dataset) answered 404, "
        "which its OpenAPI responses do not list"
    ]


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href", "spec-url") and v]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_everything_from_the_node(http: TestClient, page: str) -> None:
    html = http.get(page)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?://|//[a-z]", html.text), "an external URL in " + page
    links = _Links()
    links.feed(html.text)
    # the page's script, style and icon, and the document it renders (Swagger UI names it
    # in a script: url: '/openapi.json')
    urls = set(links.urls) | set(re.findall(r"url: '([^']+)'", html.text))
    assert "/openapi.json" in urls and any(u.endswith(".js") for u in urls), urls
    for url in urls:
        asset = http.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 100, url
    if page == "/docs":
        assert http.get("/docs/oauth2-redirect").status_code == 200


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_docs_pages_honour_the_root_path(context: Any) -> None:
    from dpnode.node.app import create_app

    with TestClient(create_app(context=context), root_path="/node") as proxied:
        html = proxied.get("/docs").text
    assert "'/node/openapi.json'" in html and '"/node/docs/assets/swagger-ui.css"' in html

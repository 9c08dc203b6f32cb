"""Bad requests get a 4xx with a message, the error body has one shape, the node keeps serving."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import numpy as np
from sqlalchemy import text
from starlette.testclient import TestClient

from dpnode.node.app import create_app
from dpnode.node.context import NodeContext
from tests.node.conftest import FRAME, post_frame, refused, upload_ok
from tests.node.frames import dataset_frame, model_frame, raw_frame

DATASETS = "/api/v1/datasets"
MODELS = "/api/v1/models"


def _tensor(dtype: str, shape: list[Any], size: int) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [0, size]}


GOOD = dataset_frame("good", {"x": np.array([1.0, 2.0])}, bounds={"x": (0, 5)})
HEADER_LENGTH = struct.unpack("<Q", GOOD[:8])[0]


#: (body, expected status, code, expected message or its start)
def _nested_header(depth: int) -> bytes:
    header = b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
    return len(header).to_bytes(8, "little") + header


MALFORMED: list[tuple[bytes, int, str, str]] = [
    (b"", 422, "invalid_request", "the body is not a tensor frame: it is shorter than 8 bytes"),
    (b"\x01\x02", 422, "invalid_request", "the body is not a tensor frame: it is shorter"),
    (
        struct.pack("<Q", 10**12) + b"{}",
        422,
        "invalid_request",
        "the tensor frame's header runs past the end of the body",
    ),
    (
        GOOD[: 8 + HEADER_LENGTH // 2],
        422,
        "invalid_request",
        "the tensor frame's header runs past the end of the body",
    ),
    (
        GOOD[:-3],
        422,
        "invalid_request",
        "malformed tensor frame: Error while deserializing",
    ),
    (
        struct.pack("<Q", 5) + b"nope!",
        422,
        "invalid_request",
        "the tensor frame's header is not valid JSON: Expecting value",
    ),
    (
        struct.pack("<Q", 2) + b"\xff\xfe",
        422,
        "invalid_request",
        "the tensor frame's header is not valid JSON",
    ),
    (raw_frame([1, 2]), 422, "invalid_request", "the tensor frame's header must be a JSON object"),
    (
        raw_frame({"__metadata__": {"dpnode": "{not json"}}),
        422,
        "invalid_request",
        "the frame's manifest is not valid JSON: Expecting property name",
    ),
    (
        raw_frame({"__metadata__": {"dpnode": "[1]"}}),
        422,
        "invalid_request",
        "the frame's manifest must be a JSON object",
    ),
    (
        raw_frame({"__metadata__": {"dpnode": json.dumps({"name": "x", "columns": "x"})}}),
        422,
        "invalid_request",
        "invalid dataset manifest: 1 validation error",
    ),
    (
        raw_frame(
            {
                "__metadata__": {
                    "dpnode": json.dumps({"name": "x", "columns": ["x"], "bounds": {"x": [1]}})
                }
            }
        ),
        422,
        "invalid_request",
        "invalid dataset manifest: 1 validation error",
    ),
    (
        raw_frame(
            {
                "__metadata__": {
                    "dpnode": json.dumps({"name": "x", "columns": ["x"], "clamp": {"x": 1}})
                }
            }
        ),
        422,
        "invalid_request",
        "invalid dataset manifest: 2 validation errors",
    ),
    (
        raw_frame(
            {
                "__metadata__": {
                    "dpnode": json.dumps({"name": "x", "columns": ["x"], "fill": {"x": "NaN"}})
                }
            }
        ),
        422,
        "invalid_request",
        "invalid dataset manifest: 1 validation error",
    ),
    (
        raw_frame(
            {"__metadata__": {"dpnode": json.dumps({"name": "x", "columns": ["x"], "surprise": 1})}}
        ),
        422,
        "invalid_request",
        "invalid dataset manifest: 1 validation error",
    ),
    (
        raw_frame({"data/x": _tensor("F64", [-1], 0)}),
        422,
        "invalid_request",
        "tensor 'data/x' has a malformed shape in the frame",
    ),
    (
        raw_frame({"data/x": [1]}),
        422,
        "invalid_request",
        "tensor 'data/x' has a malformed shape in the frame",
    ),
    (
        raw_frame({"data/x": _tensor("F64", [2], 8)}, b"\0" * 8),
        422,
        "invalid_request",
        "malformed tensor frame: Error while deserializing: invalid shape, data type, or offset",
    ),
    (
        raw_frame({"data/x": _tensor("BF16", [2], 4)}, b"\0" * 4),
        422,
        "invalid_request",
        "tensor 'data/x' has dtype 'BF16', which the node cannot read; send one of: BOOL, C64, "
        "F16, F32, F64, I16, I32, I64, I8, U16, U32, U64, U8",
    ),
    (
        raw_frame({"data/x": _tensor("F8_E4M3", [1], 1)}, b"\0"),
        422,
        "invalid_request",
        "tensor 'data/x' has dtype 'F8_E4M3', which the node cannot read",
    ),
    (
        raw_frame({"data/x": _tensor("F64", [10**30], 16)}, b"\0" * 16),
        422,
        "upload_rejected",
        "tensor 'data/x' of shape [1000000000000000000000000000000] is over the limit of "
        "500000 elements",
    ),
    (  # a dimension beyond float64: its element count raised OverflowError (a 500)
        raw_frame({"data/x": _tensor("F64", [10**400], 16)}, b"\0" * 16),
        422,
        "upload_rejected",
        "tensor 'data/x' of shape [1000000",
    ),
    (  # a dtype that is not a string: TypeError, unhashable (a 500)
        raw_frame({"data/x": {"dtype": ["F64"], "shape": [1], "data_offsets": [0, 8]}}),
        422,
        "invalid_request",
        "tensor 'data/x' has dtype ['F64'], which the node cannot read",
    ),
    (  # a header nested too deeply for the JSON parser: RecursionError (a 500)
        _nested_header(100_000),
        422,
        "invalid_request",
        "the tensor frame's header is nested too deeply",
    ),
    (
        dataset_frame("x", {"x": np.zeros(500_001, dtype=np.bool_)}),
        422,
        "upload_rejected",
        "tensor 'data/x' of shape [500001] is over the limit of 500000 elements",
    ),
    (
        dataset_frame("x", {"x": np.zeros(2, dtype=np.complex64)}, bounds={"x": (0, 1)}),
        422,
        "upload_rejected",
        "column 'x' has dtype complex64, which dpnode does not store",
    ),
]


def test_malformed_dataset_frames_are_refused_and_the_node_keeps_serving(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    for body, status, code, message in MALFORMED:
        response = post_frame(http, DATASETS, owner_h, body)
        detail = refused(response, status, code)
        assert detail.startswith(message), (body[:80], detail)
        # The next good request works.
        assert http.get("/api/v1/users/me", headers=owner_h).status_code == 200
    assert http.get(DATASETS, headers=owner_h).json() == []
    assert post_frame(http, DATASETS, owner_h, GOOD).status_code == 201


def test_malformed_model_frames_are_refused(http: TestClient, owner_h: dict[str, str]) -> None:
    weights = {"w": np.ones(2, dtype=np.float32)}
    cases = [
        (
            raw_frame({"__metadata__": {"dpnode": "{}"}}),
            "invalid model manifest: 2 validation errors",
        ),
        (
            model_frame("m", weights, tensors="w"),
            "invalid model manifest: 1 validation error",
        ),
        (
            model_frame("m", weights, tensors=["w", "v"]),
            "the weight names declared do not match the tensors sent",
        ),
        (model_frame("m", {}, tensors=[]), "a model needs at least one weight tensor"),
        (
            model_frame("m", {"w": np.ones(2, dtype=np.uint32)}),
            "weight 'w' has dtype uint32, which dpnode does not store",
        ),
    ]
    for body, message in cases:
        detail = refused(post_frame(http, MODELS, owner_h, body), 422, refused_code(message))
        assert detail.startswith(message), detail
    assert http.get(MODELS, headers=owner_h).json() == []
    assert post_frame(http, MODELS, owner_h, model_frame("m", weights)).status_code == 201


def refused_code(message: str) -> str:
    return "invalid_request" if message.startswith("invalid") else "upload_rejected"


def test_a_body_over_the_limit_is_refused_before_it_is_read(
    http: TestClient, context: NodeContext, owner_h: dict[str, str]
) -> None:
    limit = context.settings.max_upload_bytes
    big = b"\0" * (limit + 1)
    detail = refused(post_frame(http, DATASETS, owner_h, big), 413, "payload_too_large")
    assert detail == f"request body of {limit + 1} bytes is over the {limit}-byte limit"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
        for _ in range(limit // 65536 + 2):
            yield b"\0" * 65536

    response = http.post(DATASETS, content=chunks(), headers=owner_h | FRAME)
    assert refused(response, 413, "payload_too_large") == (
        f"request body is over the {limit}-byte limit"
    )
    response = http.post(MODELS, content=big, headers=owner_h | FRAME)
    refused(response, 413, "payload_too_large")
    assert post_frame(http, DATASETS, owner_h, GOOD).status_code == 201


def test_a_content_length_is_ascii_digits(
    http: TestClient, context: NodeContext, owner_h: dict[str, str]
) -> None:
    # TestClient re-encodes header values as UTF-8: the app is called as a server would,
    # with the header's bytes as they came (Starlette reads them as Latin-1)
    async def post(length: bytes) -> httpx.Response:
        transport = httpx.ASGITransport(app=http.app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            headers = [*owner_h.items(), *FRAME.items(), ("Content-Length", length)]
            return await c.post(DATASETS, content=GOOD, headers=headers)

    # '²' (isdigit(), which int() cannot read) was a 500; '+N' or ' N' went unread
    for length in (b"\xb2", f"{len(GOOD)}\xb2".encode("latin-1"), b"+1", b" 1", b"0x10", b"-1"):
        detail = refused(anyio.run(post, length), 422, "invalid_request")
        shown = length.decode("latin-1")
        assert detail == (
            f"the Content-Length header must be a number of bytes in ASCII digits, not {shown!r}"
        )
    limit = context.settings.max_upload_bytes
    # int() cannot read more than 4300 digits: a 500
    detail = refused(anyio.run(post, b"9" * 5000), 413, "payload_too_large")
    assert detail == f"request body is over the {limit}-byte limit"
    detail = refused(anyio.run(post, b"0" * 5000 + b"%d" % (limit + 1)), 413, "payload_too_large")
    assert detail == f"request body of {limit + 1} bytes is over the {limit}-byte limit"
    assert http.get(DATASETS, headers=owner_h).json() == []
    # HTTP's 1*DIGIT: leading zeros are a length all the same
    assert anyio.run(post, b"000%d" % len(GOOD)).status_code == 201


def test_http_level_errors_have_the_same_shape(http: TestClient, owner_h: dict[str, str]) -> None:
    assert refused(http.get("/api/v1/nothing-here"), 404, "not_found") == "Not Found"
    assert refused(http.put(DATASETS, headers=owner_h), 405, "method_not_allowed") == (
        "Method Not Allowed"
    )
    detail = refused(
        http.get(DATASETS, params={"limit": 0}, headers=owner_h), 422, "invalid_request"
    )
    assert detail.startswith(
        "invalid request: query.limit: Input should be greater than or equal to 1"
    )
    detail = refused(
        http.get("/api/v1/search", params={"kind": "user"}, headers=owner_h), 422, "invalid_request"
    )
    assert "query.kind" in detail
    detail = refused(
        http.post("/api/v1/users", json={"email": "a@b.org"}, headers=owner_h),
        422,
        "invalid_request",
    )
    assert detail == "invalid request: password: Field required; role: Field required"
    bad_tag = http.get(DATASETS, params={"tags": "no spaces"}, headers=owner_h)
    assert refused(bad_tag, 422, "invalid_request").startswith("tag 'no spaces' is not allowed")
    response = http.get("/api/v1/users/me", headers={"Authorization": "Basic dTpw"})
    refused(response, 401, "unauthenticated")
    assert response.headers["www-authenticate"] == "Bearer"


def test_an_unexpected_failure_is_a_500_with_the_same_shape(
    http: TestClient, context: NodeContext, owner_h: dict[str, str]
) -> None:
    upload_ok(http, owner_h, "d", {"x": np.array([1.0])}, bounds={"x": (0, 5)}, tags=["t"])
    # An operator drops a table under the running node: the search that needs it fails
    # unexpectedly; the client gets the standard body and the rest of the node still works.
    with context.engine.begin() as conn:
        conn.execute(text("DROP TABLE dataset_tags"))
    response = http.get(DATASETS, params={"tags": "t"}, headers=owner_h)
    detail = refused(response, 500, "internal_error")
    assert detail.startswith("the node failed unexpectedly (")
    assert http.get("/api/v1/users/me", headers=owner_h).status_code == 200
    assert http.get("/api/v1/health").json()["status"] == "ok"


def test_the_column_limit_is_enforced(context: NodeContext, owner_h: dict[str, str]) -> None:
    narrow = NodeContext.from_settings(context.settings.model_copy(update={"max_columns": 3}))
    try:
        with TestClient(create_app(context=narrow), raise_server_exceptions=False) as http:
            data = {f"c{i}": np.zeros(2) for i in range(4)}
            bounds = {name: (0, 1) for name in data}
            frame = dataset_frame("wide", data, bounds=bounds)
            detail = refused(post_frame(http, DATASETS, owner_h, frame), 422, "upload_rejected")
            assert detail == "a dataset may have at most 3 columns; this one has 4"
            data.pop("c3")
            frame = dataset_frame("wide", data, bounds={name: (0, 1) for name in data})
            assert post_frame(http, DATASETS, owner_h, frame).status_code == 201
    finally:
        narrow.close()


BIG = "2147483648"  # beyond any id: the database's are signed 32-bit on PostgreSQL


def test_a_number_beyond_any_id_is_refused_or_not_found_and_never_a_500(
    http: TestClient, admin_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    # each reached the database, where SQLite raised OverflowError binding it: a 500
    from dpnode.core.engine import GraphBuilder, encode

    b = GraphBuilder()
    frame = encode(b.build([b.op("sum", b.input(f"dataset:{BIG}/x", "float64", (3,)))]))
    frame_h = {"Content-Type": "application/octet-stream"}
    run = {"steps": 1, "epsilon": 0.1, "delta": 1e-7, "values": 1}
    cases: list[tuple[dict[str, str], str, str, dict[str, Any], int]] = [
        (ds_h, "GET", f"{DATASETS}/{BIG}", {}, 404),
        (ds_h, "GET", f"{DATASETS}/{BIG}/mock", {}, 404),
        (ds_h, "DELETE", f"{DATASETS}/{BIG}", {}, 404),
        (ds_h, "GET", f"{MODELS}/{BIG}", {}, 404),
        (ds_h, "GET", f"/api/v1/ledger?dataset_id={BIG}", {}, 422),
        (ds_h, "GET", f"/api/v1/ledger?before_id={BIG}", {}, 422),
        (ds_h, "POST", "/api/v1/publish?epsilon=0.1", {"content": frame, "headers": frame_h}, 404),
        (ds_h, "POST", "/api/v1/sensitivity", {"content": frame, "headers": frame_h}, 404),
        (ds_h, "POST", f"/api/v1/publish?epsilon=0.1&run={BIG}", {"content": frame}, 422),
        (ds_h, "POST", "/api/v1/publish/runs", {"json": run | {"dataset_ids": [int(BIG)]}}, 422),
        (ds_h, "POST", "/api/v1/publish/runs", {"json": run | {"steps": int(BIG)}}, 422),
        (admin_h, "GET", f"/api/v1/budget?user_id={BIG}", {}, 422),
        (admin_h, "GET", f"/api/v1/budget/grants?user_id={BIG}", {}, 422),
        (admin_h, "GET", f"/api/v1/budget/requests?user_id={BIG}", {}, 422),
        (admin_h, "POST", f"/api/v1/budget/requests/{BIG}/approve", {"json": {}}, 422),
        (admin_h, "POST", "/api/v1/budget/grants", {"json": {"user": int(BIG), "epsilon": 1}}, 422),
        (admin_h, "GET", f"/api/v1/audit?before_id={BIG}", {}, 422),
        (admin_h, "GET", f"/api/v1/audit?actor_id={BIG}", {}, 422),
        (admin_h, "POST", f"/api/v1/publish/approvals/{BIG}/approve", {"json": {}}, 422),
        (admin_h, "GET", f"/api/v1/policy/revisions/{BIG}", {}, 422),
        (admin_h, "PATCH", f"/api/v1/users/{BIG}", {"json": {"active": False}}, 422),
    ]
    for headers, method, path, more, status in cases:
        sent = more.pop("headers", {})
        response = http.request(method, path, headers=headers | sent, **more)
        assert response.status_code == status, (method, path, response.text)
    assert http.get("/api/v1/health").json()["status"] == "ok"


def test_a_time_whose_utc_is_beyond_the_calendar_is_the_calendars_end(
    http: TestClient, ds_h: dict[str, str]
) -> None:
    # astimezone(UTC) of 9999-12-31T23:59:59-23:59 overflows: it was a 500
    for params in ({"until": "9999-12-31T23:59:59-23:59"}, {"since": "0001-01-01T00:00:00+23:59"}):
        response = http.get("/api/v1/ledger", params=params, headers=ds_h)
        assert response.status_code == 200 and response.json() == [], response.text


def test_text_with_a_nul_character_is_refused_before_the_database(
    http: TestClient, admin_h: dict[str, str], owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    # PostgreSQL's text cannot hold NUL: each reached the database and answered 500 (a login
    # too, unauthenticated); SQLite stored it ("ds@x\0" another account)
    nul = "a\x00b"
    frame = dataset_frame("d", {"x": np.zeros(3)}, bounds={"x": (0, 1)}, description=nul)
    cases: list[tuple[dict[str, str], str, str, dict[str, Any]]] = [
        ({}, "POST", "/api/v1/auth/login", {"json": {"email": nul, "password": "p"}}),
        (ds_h, "GET", f"{DATASETS}?text=a%00b", {}),
        (ds_h, "GET", f"{DATASETS}/a%00b", {}),
        (ds_h, "POST", "/api/v1/budget/requests", {"json": {"epsilon": 1, "reason": nul}}),
        (admin_h, "PUT", "/api/v1/policy", {"json": {"toml": "", "reason": nul}}),
        (admin_h, "POST", "/api/v1/users", {"json": {"email": nul, "role": "admin"}}),
        (owner_h, "POST", DATASETS, {"content": frame}),
    ]
    for headers, method, path, more in cases:
        if "content" in more:
            headers = headers | {"Content-Type": "application/octet-stream"}
        response = http.request(method, path, headers=headers, **more)
        assert response.status_code == 422, (method, path, response.text)
        assert "NUL character" in response.json()["detail"], response.text
    big = {"toml": "# " + "x" * (4 * 2**20), "reason": "r"}
    response = http.put("/api/v1/policy", json=big, headers=admin_h)
    assert response.status_code == 413 and response.json()["error"] == "payload_too_large"
    assert http.get("/api/v1/users/me", headers=ds_h).status_code == 200


def test_a_nul_in_json_of_any_declared_case_or_none_is_refused(http: TestClient) -> None:
    body = json.dumps({"email": "a\x00b", "password": "p"}).encode()
    response = http.post(
        "/api/v1/auth/login", content=body, headers={"Content-Type": "Application/JSON"}
    )
    assert response.status_code == 422 and "NUL" in response.json()["detail"], response.text
    # a body of no declared type is not JSON to FastAPI either: refused, never read
    response = http.post("/api/v1/auth/login", content=body)
    assert response.status_code == 422, response.text


def test_a_frame_without_a_content_type_is_not_read_as_json(
    http: TestClient, owner_h: dict[str, str]
) -> None:
    # a frame's length prefix holds zero bytes: read as JSON text, it was refused as a NUL
    response = http.post(DATASETS, content=GOOD, headers=owner_h)
    assert response.status_code == 201, response.text


def test_a_json_body_its_parser_cannot_read_is_malformed_input(
    http: TestClient, admin_h: dict[str, str]
) -> None:
    # its parser's RecursionError and UnicodeDecodeError were FastAPI's 400, undocumented;
    # a syntax error was "30: JSON decode error", which said neither what nor where
    deep = b"[" * 100_000 + b"]" * 100_000
    cases = [
        (b'{"email": ' + deep + b', "password": "p"}', "the JSON body is nested too deeply"),
        (b'{"email": "\xff", "password": "p"}', "the JSON body is not UTF-8 text"),
        (
            b'{"email": "a", "password": "p"',
            "the JSON body is not valid JSON: Expecting ',' delimiter: line 1 column 31 (char 30)",
        ),
        (
            b'{"email": ',
            "the JSON body is not valid JSON: Expecting value: line 1 column 11 (char 10)",
        ),
        (
            b'{\n  "email": "a"\n  "password": "p"\n}',
            "the JSON body is not valid JSON: Expecting ',' delimiter: line 3 column 3 (char 19)",
        ),
        (
            '{"email": "é", "password": "p"} x'.encode(),  # columns count characters
            "the JSON body is not valid JSON: Extra data: line 1 column 33 (char 32)",
        ),
    ]
    json_h = {"Content-Type": "application/json"}
    for body, message in cases:
        response = http.post("/api/v1/auth/login", content=body, headers=json_h)
        assert refused(response, 422, "invalid_request") == f"invalid request: {message}"
    policy = b'{"reason": "r", "document": {"a": ' + deep + b"}}"
    response = http.put("/api/v1/policy", content=policy, headers=admin_h | json_h)
    assert refused(response, 422, "invalid_request").endswith("nested too deeply")
    assert http.get("/api/v1/policy", headers=admin_h).json()["revision"] is None

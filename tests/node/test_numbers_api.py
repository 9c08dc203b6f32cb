"""A number is read only as JSON writes it: in a query, a path, a form, a JSON body or manifest.

Python's float() read ``1_0`` as 10 and pydantic read a query's ``1_0``, ``" 1 "``, ``+1`` or a
body's ``"10"`` and ``true`` as numbers: a publish of ``epsilon=1_0`` spent 10.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from tests.node.conftest import post_frame, publish, refused, upload_ok
from tests.node.frames import dataset_frame

#: each is a number to Python's float() or pydantic, and not as JSON writes one
MISSPELLED = ["1_0", " 1", "1 ", "+1", ".5", "1.", "01", "0x1", "Infinity", "NaN", "١", "１"]
SYNTAX = "Input should be a number as JSON writes it"
WHOLE = "Input should be a whole number as JSON writes it"


def _sum_frame(http: TestClient, owner_h: dict[str, str]) -> bytes:
    body = upload_ok(http, owner_h, "d", {"x": np.array([1.0, 2.0, 3.0])}, bounds={"x": (0, 5)})
    b = GraphBuilder()
    return encode(b.build([b.op("sum", b.input(f"dataset:{body['id']}/x", "float64", (3,)))]))


def test_a_query_number_spelled_otherwise_than_json_is_refused_before_any_charge(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    frame = _sum_frame(http, owner_h)
    for text in MISSPELLED:
        response = publish(http, ds_h, frame, text)  # type: ignore[arg-type]
        assert SYNTAX in refused(response, 422, "invalid_request"), text
        response = publish(http, ds_h, frame, 0.5, delta=text)
        assert SYNTAX in refused(response, 422, "invalid_request"), text
        response = http.post(
            "/api/v1/sensitivity", params={"epsilon": text}, content=frame, headers=ds_h
        )
        assert SYNTAX in refused(response, 422, "invalid_request"), text
    for text in ("1_0", " 1", "+1", "1.0", "1e1", "01", "²"):
        response = publish(http, ds_h, frame, 0.5, run=text)
        assert WHOLE in refused(response, 422, "invalid_request"), text
    for text in ("inf", "nan"):  # as str() writes them: refused by the service, as before
        response = publish(http, ds_h, frame, text)  # type: ignore[arg-type]
        assert "epsilon must be a finite number" in refused(response, 422, "invalid_request")
        response = publish(http, ds_h, frame, 0.5, delta=text)
        assert "delta must be a number in (0, 1)" in refused(response, 422, "invalid_request")
    assert http.get("/api/v1/ledger", headers=ds_h).json() == []  # nothing was charged
    for text in ("0.5", "5e-1", "5E-1", "0.05e1"):  # as JSON (and str(0.5)) writes them
        response = publish(http, ds_h, frame, text)  # type: ignore[arg-type]
        assert response.status_code == 200, response.text
    assert http.get("/api/v1/budget", headers=ds_h).json()["spent_epsilon"] == 2


def test_a_query_or_path_integer_spelled_otherwise_than_json_is_refused(
    http: TestClient, admin_h: dict[str, str]
) -> None:
    for text in ("1_0", " 5", "+5", "5.0", "05", "1e1", "٥", "5"):
        expected = 200 if text == "5" else 422
        listed = http.get("/api/v1/datasets", params={"limit": text}, headers=admin_h)
        assert listed.status_code == expected, (text, listed.text)
        ledger = http.get("/api/v1/ledger", params={"before_id": text}, headers=admin_h)
        assert ledger.status_code == expected, (text, ledger.text)
        revision = http.get(f"/api/v1/policy/revisions/{text}", headers=admin_h)
        assert revision.status_code == (404 if text == "5" else 422), (text, revision.text)
        if expected == 422:
            assert WHOLE in refused(listed, 422, "invalid_request")
            assert WHOLE in refused(revision, 422, "invalid_request")


def test_a_query_flag_is_true_or_false_as_json_writes_it(
    http: TestClient, admin_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    # pydantic read a query's '1', 'yes', 'on', 't' or 'True' as true and '0', 'no', 'off' or
    # 'f' as false
    for text in ("1", "0", "yes", "no", "on", "off", "t", "f", "y", "n", "True", "FALSE", " true"):
        for headers in (admin_h, ds_h):
            response = http.get("/api/v1/ledger", params={"all_users": text}, headers=headers)
            detail = refused(response, 422, "invalid_request")
            assert detail == (
                "invalid request: query.all_users: Input should be true or false, as JSON "
                "writes them"
            ), text
    for text in ("true", "false"):
        response = http.get("/api/v1/ledger", params={"all_users": text}, headers=admin_h)
        assert response.status_code == 200 and response.json() == [], response.text
    response = http.get("/api/v1/ledger", params={"all_users": "true"}, headers=ds_h)
    refused(response, 403, "forbidden")
    assert http.get("/api/v1/ledger", params={"all_users": "false"}, headers=ds_h).json() == []


def test_a_query_time_is_rfc_3339_with_its_offset(
    http: TestClient, admin_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    # pydantic read '1700000000' as seconds since 1970, '20000000000' as milliseconds, and a
    # space or a lowercase 't' for the 'T'
    for text in (
        "1700000000",
        "20000000000",
        "1700000000.5",
        "2026-11-27 09:30:00+00:00",
        "2026-11-27t09:30:00Z",
        "2026-11-27T09:30Z",
        "2026-11-27T09:30:00+0100",
        "2026-11-27T09:30:00z",
        "２026-11-27T09:30:00Z",
    ):
        for key in ("since", "until"):
            response = http.get("/api/v1/ledger", params={key: text}, headers=ds_h)
            detail = refused(response, 422, "invalid_request")
            assert detail.startswith(
                f"invalid request: query.{key}: Input should be a time as RFC 3339 writes it"
            ), (text, detail)
    for text in ("2026-11-27T09:30:00Z", "2026-11-27T10:30:00.5+01:00", "0001-01-01T00:00:00Z"):
        response = http.get("/api/v1/ledger", params={"since": text}, headers=admin_h)
        assert response.status_code == 200 and response.json() == [], response.text
    # no offset: which time it names depends on the zone, so it is refused as before
    response = http.get("/api/v1/ledger", params={"since": "2026-11-27T09:30:00"}, headers=ds_h)
    refused(response, 422, "invalid_request")


def test_a_json_number_must_be_a_json_number(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    asks: list[Any] = ["10", "1_0", True]
    for epsilon in asks:
        body = {"epsilon": epsilon, "reason": "r"}
        response = http.post("/api/v1/budget/requests", json=body, headers=ds_h)
        assert refused(response, 422, "invalid_request") == (
            "invalid request: epsilon: Input should be a valid number"
        )
    run = {"steps": 2, "epsilon": "0.5", "delta": 1e-6, "values": 1}
    refused(http.post("/api/v1/publish/runs", json=run, headers=ds_h), 422, "invalid_request")
    upload = {
        "name": "t",
        "columns": ["x"],
        "bounds": {"x": [0, 5]},
        "rows": 4,
        "block_rows": 4,
        "tensors": [{"name": "data/x", "dtype": "float64", "shape": []}],
    }
    for key, value in (("rows", "4"), ("rows", 4.0), ("block_rows", True), ("bounds", ["0", 5])):
        bad = upload | {key: {"x": value} if key == "bounds" else value}
        response = http.post("/api/v1/uploads", json=bad, headers=owner_h)
        assert refused(response, 422, "invalid_request").startswith(f"invalid request: {key}")
    frame = dataset_frame("d", {"x": np.zeros(3)}, bounds={"x": ("0", "5")})
    detail = refused(post_frame(http, "/api/v1/datasets", owner_h, frame), 422, "invalid_request")
    assert "bounds.x.0" in detail and "Input should be a valid number" in detail
    # JSON numbers, integral or not, stay numbers
    response = http.post(
        "/api/v1/budget/requests", json={"epsilon": 10, "reason": "r"}, headers=ds_h
    )
    assert response.status_code == 201 and response.json()["epsilon"] == 10, response.text
    assert http.post("/api/v1/uploads", json=upload, headers=owner_h).status_code == 201


def test_an_id_in_a_ref_or_a_graph_input_is_read_as_json_writes_it(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    ident = upload_ok(http, owner_h, "d", {"x": np.array([1.0, 2.0])}, bounds={"x": (0, 5)})["id"]
    # int() of more than 4300 digits raised: a 500
    for path in (f"/api/v1/datasets/{'1' * 5000}", f"/api/v1/models/{'1' * 5000}"):
        refused(http.get(path, headers=ds_h), 404, "not_found")
    assert http.get(f"/api/v1/datasets/{ident}", headers=ds_h).status_code == 200
    # '\d' took any script's digits: 'dataset:١/x' read dataset 1
    for spelled in (f"{ident}".translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")), f"0{ident}"):
        b = GraphBuilder()
        frame = encode(b.build([b.op("sum", b.input(f"dataset:{spelled}/x", "float64", (2,)))]))
        detail = refused(post_frame(http, "/api/v1/sensitivity", ds_h, frame), 422, "invalid_graph")
        assert "names no data on this node" in detail


def test_a_number_parameter_is_documented_as_the_number_it_is(http: TestClient) -> None:
    # the spelling's check runs before pydantic reads the text: bounds still on the number
    operation = http.app.openapi()["paths"]["/api/v1/publish"]["post"]  # type: ignore[attr-defined]
    schemas = {p["name"]: p["schema"] for p in operation["parameters"]}
    assert schemas["epsilon"]["type"] == "number"
    assert schemas["run"]["anyOf"][0] == {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}

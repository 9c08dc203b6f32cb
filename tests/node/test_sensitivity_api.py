"""``POST /sensitivity`` answers what a publish of the same graph would: its bounds are numbers,
or it is refused with the publish's status and message, before any charge."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, Ref, encode
from tests.node.conftest import post_frame, publish, refused, upload_ok

GRAPH = {"Content-Type": "application/octet-stream"}


def test_a_mean_of_no_rows_is_refused_as_its_publish_is(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str]
) -> None:
    dataset = upload_ok(http, owner_h, "d", {"x": np.array([1.0, 2.0, 3.0])}, bounds={"x": (0, 5)})
    name = f"dataset:{dataset['id']}/x"

    def no_rows(b: GraphBuilder, x: Ref) -> list[Ref]:
        return [b.op("mean", b.op("slice", x, dim=0, start=0, end=0))]

    def an_empty_axis(b: GraphBuilder, x: Ref) -> list[Ref]:
        empty = b.op("slice", b.op("unsqueeze", x, dim=1), dim=1, start=0, end=0)  # (3, 0)
        return [b.op("sum", x), b.op("mean", empty, dims=(1,))]

    graphs: list[Callable[[GraphBuilder, Ref], list[Ref]]] = [no_rows, an_empty_axis]
    for outputs in graphs:
        b = GraphBuilder()
        frame = encode(b.build(outputs(b, b.input(name, "float64", (3,)))))
        expected = refused(publish(http, ds_h, frame, 0.5), 422, "invalid_request")
        assert expected.startswith("an output is infinite or NaN whatever the data")
        # its bounds were NaN, which JSON cannot hold: null, a 200
        for params in ({}, {"epsilon": 0.5}):
            response = http.post(
                "/api/v1/sensitivity", params=params, content=frame, headers=ds_h | GRAPH
            )
            assert refused(response, 422, "invalid_request") == expected, outputs.__name__
    assert http.get("/api/v1/ledger", headers=ds_h).json() == []
    b = GraphBuilder()
    frame = encode(b.build([b.op("mean", b.input(name, "float64", (3,)))]))
    report = post_frame(http, "/api/v1/sensitivity", ds_h, frame).json()
    (output,) = report["outputs"]
    assert (output["lower"], output["upper"]) == pytest.approx((0.0, 5.0))  # with its rounding

"""Publishing from datasets with subject ids: the node's shared subject structure.

A publish resolves each dataset once, and its columns share one subject structure
(kept by the index blob's digest). The sensitivity must be the analytic one for the
worst subject, every time, whichever columns a graph reads.
"""

from __future__ import annotations

import numpy as np
import pytest
from starlette.testclient import TestClient

from dpnode.core.engine import GraphBuilder, encode
from tests.node.conftest import post_frame, upload_ok


@pytest.mark.parametrize("order", ["grouped", "shuffled"])
def test_sensitivity_follows_the_worst_subject(
    http: TestClient, owner_h: dict[str, str], ds_h: dict[str, str], order: str
) -> None:
    patients = np.array([7, 7, 7, 2, 2, 9, 4, 4])  # subject 7 has three rows
    if order == "shuffled":
        patients = patients[[3, 0, 5, 1, 6, 2, 7, 4]]
    n = len(patients)
    body = upload_ok(
        http,
        owner_h,
        f"visits-{order}",
        {"patient": patients, "cost": np.linspace(0, 10, n), "age": np.linspace(20, 80, n)},
        bounds={"cost": (0, 10), "age": (0, 120)},
        subject_id="patient",
    )
    assert body["max_rows_per_subject"] == 3
    ident = body["id"]
    b = GraphBuilder()
    cost = b.input(f"dataset:{ident}/cost", "float64", (n,))
    age = b.input(f"dataset:{ident}/age", "float64", (n,))
    frame = encode(b.build([b.op("sum", cost), b.op("mean", age)]))
    for _ in range(2):  # the second time the subject structure is the kept one
        response = post_frame(http, "/api/v1/sensitivity", ds_h, frame)
        assert response.status_code == 200, response.text
        report = response.json()
        assert [o["l1"] for o in report["outputs"]] == pytest.approx([3 * 10, 3 * 120 / n])
        assert report["l1"] == pytest.approx(3 * 10 + 3 * 120 / n)  # the same subject, jointly

"""The console's catalog marks synthetic data: a synthetic copy with its source and epsilon,
a synthetic mock with its method and epsilon, an uploaded mock as its owner's."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from dpnode.node.db.models import User
from tests.console.conftest import Browser
from tests.sdk.conftest import connect
from tests.sdk.test_synthesize import table


def _card(html: str, name: str) -> str:
    """The catalog's section on dataset ``name``."""
    (section,) = re.findall(
        rf'<section class="card"[^>]*>\s*<h3[^>]*>{name} .*?</section>', html, re.S
    )
    return section


def test_the_catalog_badges_synthetic_copies_and_synthetic_mocks(
    http: TestClient, admin: User, owner: User, scientist: User, ds_browser: Browser
) -> None:
    owner_client, ds_client = connect(http, owner.email), connect(http, scientist.email)
    for name in ("survey", "plain"):
        owner_client.upload_dataset(
            name,
            table(200, 0),
            bounds={"age": (0, 120), "bmi": (10, 70)},
            categories={"region": ["north", "south", "east"]},
            mock=table(20, 1) if name == "plain" else None,
        )
    connect(http, admin.email).set_policy(
        "[datasets.survey]\nmax_epsilon = 10.0\nmax_delta = 1e-5\n", reason="a promise"
    )
    owner_client.dataset("survey").synthesize_mock(epsilon=1.0, delta=1e-6)
    ds_client.dataset("survey").synthesize(epsilon=2.0, delta=1e-6, name="survey-copy")
    html = ds_browser.get("/console/catalog").text
    survey, copy, plain = (_card(html, n) for n in ("survey", "survey-copy", "plain"))
    assert '<span class="badge">synthetic mock</span> (mst, epsilon 1, delta 1e-06' in survey
    assert "paid from the dataset's cap" in survey
    assert '<span class="badge">synthetic</span></h3>' in copy
    assert "Synthetic copy of <strong>survey</strong>, made with mst at epsilon 2" in copy
    assert "badge" not in plain and "mock data: 20 rows (uploaded by its owner)" in plain

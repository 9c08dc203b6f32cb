"""``ds.synthesize(...)``: a differentially private synthetic copy, end to end through the SDK
and the real app (in process), with its charge, its provenance and its refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpnode import sdk
from dpnode.node.context import NodeContext

N = 400


def table(n: int, seed: int) -> dict[str, object]:
    """Five columns, two of them strongly related (``smoker`` -> ``cough``)."""
    rng = np.random.default_rng(seed)
    smoker = rng.random(n) < 0.4
    cough = np.where(smoker, rng.random(n) < 0.9, rng.random(n) < 0.1)
    return {
        "age": rng.integers(18, 90, n),
        "bmi": rng.uniform(15, 45, n),
        "region": np.array(["north", "south", "east"], dtype=object)[rng.integers(0, 3, n)],
        "smoker": smoker,
        "cough": cough,
    }


@pytest.fixture
def survey(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    owner_client.upload_dataset(
        "survey",
        table(N, 0),
        tags=["health"],
        bounds={"age": (0, 120), "bmi": (10, 70)},
        categories={"region": ["north", "south", "east"]},
    )
    return ds_client.dataset("survey")


def test_a_synthetic_copy_is_charged_once_stored_and_downloadable(
    survey: sdk.DatasetHandle, ds_client: sdk.Client, sqlite_only: None
) -> None:
    before = ds_client.budget()
    copy = survey.synthesize(epsilon=4.0, delta=1e-6, seed=7, name="survey-copy")
    receipt = copy.receipt
    assert receipt is not None and receipt["mechanism"] == "mst"
    # one ledger line for the whole run, with the method and its parameters
    ledger = ds_client.ledger()
    assert len(ledger) == 1
    assert receipt["ledger_id"] == ledger[0].entries[0].id
    spent = ds_client.budget()
    assert spent != before
    # the new dataset: flagged synthetic, the caller's, same columns and bounds
    assert copy.synthetic is not None
    assert copy.synthetic["source"] == "survey" and copy.synthetic["method"] == "mst"
    assert copy.synthetic["epsilon"] == 4.0 and "seed" not in copy.synthetic
    assert copy.owner == "ds@example.org" and "synthetic" in copy.tags
    assert copy.row_count == N and list(copy.columns) == list(survey.columns)
    assert copy.bounds == survey.bounds
    assert ds_client.dataset("survey-copy").synthetic == copy.synthetic  # in the catalog
    frame = copy.download().to_pandas()
    assert len(frame) == N
    assert frame["age"].between(0, 120).all() and frame["bmi"].between(10, 70).all()
    assert frame["age"].dtype.kind == "i"
    assert set(frame["region"]) <= {"north", "south", "east"}
    # the strong relation survives (4 columns of 5 joined by a tree of 4 pairs: the
    # smoker-cough pair scores far above the others and is chosen)
    assert ["smoker", "cough"] in receipt["tree"] or ["cough", "smoker"] in receipt["tree"]
    agree = float((frame["smoker"] == frame["cough"]).mean())
    assert agree > 0.75, agree
    assert copy.download().to_polars().height == N
    assert copy.download().to_arrow().num_rows == N
    # the source's real values stay refused
    with pytest.raises(sdk.PermissionDeniedError, match="synthesize"):
        survey.download()

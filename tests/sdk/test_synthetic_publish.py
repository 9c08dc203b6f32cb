"""Publishing on a synthetic dataset: exact and free, computed on the table its maker may
download; anything reading other data still goes to the node and is charged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from starlette.testclient import TestClient

from dpnode import sdk
from dpnode.node.context import NodeContext
from dpnode.sdk.query import col, count, mean, median
from tests.conftest import make_user
from tests.sdk.conftest import connect
from tests.sdk.test_synthesize import N, table

pytestmark = pytest.mark.usefixtures("sqlite_only")


@pytest.fixture
def survey(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    owner_client.upload_dataset(
        "survey",
        table(N, 0),
        bounds={"age": (0, 120), "bmi": (10, 70)},
        categories={"region": ["north", "south", "east"]},
    )
    return ds_client.dataset("survey")


@pytest.fixture
def copy(survey: sdk.DatasetHandle) -> sdk.DatasetHandle:
    return survey.synthesize(epsilon=2.0, delta=1e-6, seed=3, name="survey-copy")


def test_a_publish_on_a_synthetic_copy_is_its_tables_exact_value_and_charges_nothing(
    copy: sdk.DatasetHandle, ds_client: sdk.Client
) -> None:
    frame = copy.download().to_pandas()
    ledger, spent = ds_client.ledger(), ds_client.budget().spent_epsilon
    mean_bmi = copy["bmi"].mean().publish(epsilon=1.0)
    assert float(mean_bmi) == pytest.approx(frame["bmi"].mean(), rel=1e-12)
    receipt = mean_bmi.receipt
    assert (receipt.mechanism, receipt.ledger_id, receipt.epsilon) == ("exact", None, 0.0)
    assert "synthetic table" in (receipt.post_processing or "")
    # several tensors, an integer column and a boolean one, as torch computes them
    older, smokers = sdk.publish(
        [(copy["age"] > 50).sum(), copy["smoker"].float().mean()], epsilon=1.0
    )
    assert float(older) == float((frame["age"] > 50).sum())
    assert float(smokers) == pytest.approx(frame["smoker"].mean())
    # the query builder and describe: exact, without error bars
    result = (
        copy.query()
        .filter(col("age") > 30)
        .group_by("region")
        .agg(count(), mean("bmi"), median("age"))
        .publish(epsilon=1.0)
    )
    for row in result.rows():
        rows = frame[(frame["age"] > 30) & (frame["region"] == row["region"])]
        assert row["count"] == len(rows)
        assert row["bmi_mean"] == pytest.approx(rows["bmi"].mean())
        assert row["age_median"] == np.quantile(rows["age"], 0.5, method="lower")
        assert row["count_scale"] == row["bmi_mean_scale"] == row["age_median_scale"] == 0
    described = {r["column"]: r for r in copy.describe(epsilon=1.0).rows()}
    assert described["bmi"]["mean"] == pytest.approx(frame["bmi"].mean())
    # nothing reached the ledger or the budget
    assert ds_client.ledger() == ledger and ds_client.budget().spent_epsilon == spent
    # the terms are still checked, as the same code will ask them of the real dataset
    with pytest.raises(sdk.InvalidRequestError, match="epsilon"):
        copy["bmi"].mean().publish(epsilon=-1.0)


def test_the_real_dataset_and_a_mix_go_to_the_node_and_are_charged(
    copy: sdk.DatasetHandle,
    survey: sdk.DatasetHandle,
    ds_client: sdk.Client,
) -> None:
    before = len(ds_client.ledger())
    real = survey["bmi"].mean().publish(epsilon=1.0)
    assert real.receipt.mechanism == "laplace" and real.receipt.ledger_id is not None
    mixed = (survey["bmi"].mean() + copy["bmi"].mean()).publish(epsilon=1.0)
    assert mixed.receipt.ledger_id is not None and mixed.receipt.noise_scale > 0
    assert len(ds_client.ledger()) == before + 2


def test_someone_elses_synthetic_copy_is_published_by_the_node(
    copy: sdk.DatasetHandle, http: TestClient, context: NodeContext, admin_client: sdk.Client
) -> None:
    # another data scientist may not download the copy: a publish on it is the node's, as
    # for any dataset they read, and charged to them
    make_user(context, "other@example.org", "data_scientist")
    other = connect(http, "other@example.org")
    try:
        theirs = other.dataset(copy.id)
    except sdk.NotFoundError:
        pytest.skip("a synthetic copy is its maker's alone on this node")
    with pytest.raises(sdk.PermissionDeniedError):
        theirs.download()
    released = theirs["bmi"].mean().publish(epsilon=1.0)
    assert released.receipt.mechanism != "exact" and released.receipt.ledger_id is not None
    # the admin may download it: exact for them too
    exact = admin_client.dataset(copy.id)["bmi"].mean().publish(epsilon=1.0)
    assert exact.receipt.mechanism == "exact"
    assert torch.isfinite(exact)

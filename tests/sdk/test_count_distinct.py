"""Counting distinct values from the SDK: ``sdk.count_distinct(x)`` and the query builder's
``count_distinct(column)`` on float, wide integer and categorical columns, against the node
and in mock mode (docs/statistics.md, count_distinct)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from dpnode import sdk
from dpnode.sdk.query import col, count_distinct

pytestmark = pytest.mark.usefixtures("sqlite_only")

N = 300


def _frame(seed: int, n: int = N, rows_per_patient: int = 1) -> pd.DataFrame:
    """Whole-year ages held as float64 (as scikit-learn's diabetes table holds them), a wide
    integer column, a category and a subject id."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "patient_id": np.arange(n) // rows_per_patient,
            "age": rng.integers(19, 80, n).astype(np.float64),
            "income": rng.integers(0, 100_000, n),
            "sex": rng.choice(["F", "M"], n),
        }
    )


def _upload(
    owner: sdk.Client, scientist: sdk.Client, rows_per_patient: int = 1
) -> tuple[sdk.DatasetHandle, pd.DataFrame]:
    data = _frame(0, rows_per_patient=rows_per_patient)
    owner.upload_dataset(
        "patients",
        data,
        bounds={"age": (0, 120), "income": (0, 100_000)},
        categories={"sex": ["F", "M"]},
        subject_id="patient_id",
        mock=_frame(1, 60),
    )
    return scientist.dataset("patients"), data


def test_a_float_columns_distinct_values_publish_at_sensitivity_one(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds, data = _upload(owner_client, ds_client)
    counted = sdk.count_distinct(ds["age"])
    assert counted.shape == () and counted.dtype == torch.int64
    assert sdk.sensitivity(counted).l1 == pytest.approx(1.0)
    got = counted.publish(epsilon=2.0)
    truth = data["age"].nunique()
    assert got.receipt.sensitivity_l1 == pytest.approx(1.0)
    # Laplace at scale 1/2: 12 scales away has probability e^-12
    assert abs(float(got) - truth) <= 12 * got.receipt.noise_scale


def test_a_subject_with_several_rows_is_charged_them(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds, _ = _upload(owner_client, ds_client, rows_per_patient=3)
    assert sdk.sensitivity(sdk.count_distinct(ds["age"])).l1 == pytest.approx(3.0)
    query = ds.query().agg(count_distinct("age"))
    assert query.sensitivity()["distinct"].l1 == pytest.approx(3.0)


def test_torch_unique_is_refused_and_points_to_the_count(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds, _ = _upload(owner_client, ds_client)
    with pytest.raises(sdk.PrivateValueError, match=r"sdk\.count_distinct\(x\)"):
        torch.unique(ds["age"])


def test_a_local_tensor_is_counted_here_nan_once() -> None:
    x = torch.tensor([1.0, float("nan"), float("nan"), 0.0, -0.0, 1.0])
    assert sdk.count_distinct(x).item() == 3
    assert sdk.count_distinct(x.to(torch.bfloat16)).item() == 3
    with pytest.raises(TypeError, match="takes a tensor"):
        sdk.count_distinct([1, 2])  # type: ignore[arg-type]


def test_mock_mode_counts_the_mock(owner_client: sdk.Client, ds_client: sdk.Client) -> None:
    ds, _ = _upload(owner_client, ds_client)
    with sdk.mock(ds):
        got = sdk.count_distinct(ds["age"]).publish(epsilon=1.0)
        (row,) = ds.query().agg(count_distinct("age")).publish(epsilon=1.0).rows()
    assert 1 <= float(got) <= 60 and 0 <= row["age_count_distinct"] <= 60


def test_the_builder_counts_float_and_wide_integer_columns(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds, data = _upload(owner_client, ds_client)
    query = ds.query().agg(count_distinct("age"), count_distinct("income"))
    assert "distinct via count_distinct" in query.plan()
    (row,) = query.publish(epsilon=4.0).rows()
    for column in ("age", "income"):
        value, sd = row[f"{column}_count_distinct"], row[f"{column}_count_distinct_scale"]
        assert sd > 0 and abs(value - data[column].nunique()) <= 9 * sd  # Laplace, 9 sd
    assert 0 <= row["age_count_distinct"] <= N  # at most one value a row


def test_the_builder_counts_per_group_and_after_a_filter(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds, data = _upload(owner_client, ds_client)
    query = ds.query().filter(col("income") > 30_000).group_by("sex").agg(count_distinct("age"))
    assert query.sensitivity()["distinct"].l1 == pytest.approx(2.0)  # a row leaves, one enters
    result = query.publish(epsilon=8.0)
    kept = data[data["income"] > 30_000]
    for r in result.rows():
        truth = kept[kept["sex"] == r["sex"]]["age"].nunique()
        assert abs(r["age_count_distinct"] - truth) <= 9 * r["age_count_distinct_scale"]

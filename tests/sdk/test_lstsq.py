"""torch.linalg.lstsq: on public matrices it records and evaluates as torch computes it; on
private ones it is refused as it is recorded, pointing to sdk.linear_regression."""

from __future__ import annotations

import pytest
import torch

from dpnode import sdk
from dpnode.sdk._remote import evaluate, remote_input
from tests.sdk.conftest import remote_dataset


@pytest.mark.parametrize("driver", [None, "gelsy", "gels"])
@pytest.mark.parametrize(
    ("shape_a", "shape_b"), [((6, 3), (6, 2)), ((2, 5, 3), (2, 5, 1)), ((6, 3), (6,))]
)
def test_lstsq_of_public_matrices_is_torchs(
    driver: str | None, shape_a: tuple, shape_b: tuple
) -> None:
    g = torch.Generator().manual_seed(0)
    A = torch.randn(shape_a, generator=g, dtype=torch.float64)
    B = torch.randn(shape_b, generator=g, dtype=torch.float64)
    a = remote_input("model:1/A", shape_a, torch.float64)
    b = remote_input("model:1/B", shape_b, torch.float64)
    got = evaluate(
        list(torch.linalg.lstsq(a, b, driver=driver)),
        {"model:1/A": A.numpy(), "model:1/B": B.numpy()},
    )
    want = torch.linalg.lstsq(A, B, driver=driver)
    for g_, w in zip(got, want, strict=True):
        assert g_.shape == w.shape and g_.dtype == w.dtype
        torch.testing.assert_close(g_, w)


def test_a_rank_deficient_matrix_gets_the_minimum_norm_solution_and_its_rank() -> None:
    A = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]], dtype=torch.float64)  # rank 1
    B = torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64)
    a = remote_input("model:1/A", (3, 2), torch.float64)
    b = remote_input("model:1/B", (3, 1), torch.float64)
    sol, _, rank, _ = evaluate(
        list(torch.linalg.lstsq(a, b)), {"model:1/A": A.numpy(), "model:1/B": B.numpy()}
    )
    assert int(rank) == 1
    torch.testing.assert_close(sol, torch.linalg.pinv(A) @ B)


def test_other_drivers_are_refused_with_the_reason() -> None:
    a = remote_input("model:1/A", (6, 3), torch.float64)
    with pytest.raises(sdk.UnsupportedOperationError, match="default driver"):
        torch.linalg.lstsq(a, a[:, :1], driver="gelsd")


@pytest.mark.usefixtures("sqlite_only")
def test_lstsq_of_private_data_points_to_linear_regression(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    X = ds["scan"].reshape(40, 6)
    with pytest.raises(sdk.NotPublishableError, match=r"sdk\.linear_regression") as info:
        torch.linalg.lstsq(X, ds["bmi"])
    assert str(info.value).startswith("torch.linalg.lstsq on private data")

"""Through the app: a noised count comes back inside ``[0, n]``, and the receipt says how many
values were moved to the end of their public range."""

from __future__ import annotations

import torch

from dpnode import sdk
from tests.sdk.conftest import remote_dataset


def test_a_count_is_released_in_its_range_and_the_receipt_says_when_it_was_clipped(
    owner_client: sdk.Client, ds_client: sdk.Client, sqlite_only: None
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    n = ds.row_count
    clipped = 0
    for _ in range(12):
        count = ds["diabetic"].sum().publish(epsilon=0.01)  # Laplace of scale 100
        value, receipt = float(count), count.receipt
        assert 0 <= value <= n
        assert receipt.clipped in (0, 1)
        if receipt.clipped:
            assert value in (0.0, float(n))
        clipped += receipt.clipped
    assert clipped >= 3  # most draws of that noise leave [0, 40]


def test_symmetric_matrices_come_back_symmetric(
    owner_client: sdk.Client, ds_client: sdk.Client, sqlite_only: None
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    X = ds["scan"].reshape(40, 6)
    gram = (X.T @ X).publish(epsilon=1.0)
    assert torch.equal(gram, gram.T) and gram.receipt.symmetrized == 1
    centred = X - X.mean(0)
    cov = (centred.T @ centred / 39).publish(epsilon=1.0, delta=1e-6)
    assert torch.equal(cov, cov.T) and cov.receipt.symmetrized == 1
    # torch.cov is computed here from the released moments, symmetric by construction
    cov = torch.cov(X.T).publish(epsilon=1.0, delta=1e-6)
    assert torch.equal(cov, cov.T) and cov.receipt.post_processing is not None
    # not symmetric: X.T @ Y, and a square matrix that merely has the shape
    Y = ds["scan"].reshape(40, 6) * 2
    other = (X.T @ Y).publish(epsilon=1.0)
    assert other.receipt.symmetrized == 0 and not torch.equal(other, other.T)
    assert (X[:6] * 1.0).publish(epsilon=1.0).receipt.symmetrized == 0

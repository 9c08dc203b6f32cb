"""Through the app: a noised count comes back inside ``[0, n]``, and the receipt says how many
values were moved to the end of their public range."""

from __future__ import annotations

import sdk
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

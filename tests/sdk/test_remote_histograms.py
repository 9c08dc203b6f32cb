"""Histograms of remote tensors over public ranges: torch's counts, by comparisons only.

``histc``, ``histogram`` and ``histogramdd`` with a public range (or public edges) find each
value's bin by comparisons and fill the bins by a one-hot sum, so that a histogram of a
private column publishes at the sensitivity of a partition: replacing one row moves one count
from a bin to another (L1 2, L2 sqrt 2).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpnode import sdk
from dpnode.sdk._remote import evaluate, graph_for, remote_input
from dpnode.sdk._remote.rules_histogram import _histc_thresholds
from tests.sdk.conftest import remote_dataset

# values on the edges, at both ends of the range, outside it, and NaN
VALUES = torch.tensor(
    [10.0, 25.0, 24.999, 40.0, 55.0, 70.0, 70.001, 9.0, -3.0, 33.3, 61.2, math.nan, 12.5, 69.99]
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_histc_histogram_and_histogramdd_match_torch(dtype: torch.dtype) -> None:
    v = VALUES.to(dtype)
    x = remote_input("x", tuple(v.shape), dtype)
    edges = torch.tensor([10.0, 20.0, 45.0, 70.0], dtype=dtype)
    pts = torch.stack([v, v.flip(0)], dim=1)
    p = remote_input("p", tuple(pts.shape), dtype)
    cases = [
        (lambda t: torch.histc(t, bins=4, min=10, max=70), x, v),
        (lambda t: torch.histc(t, bins=7, min=-5.0, max=75.5), x, v),
        (lambda t: torch.histogram(t, bins=6, range=(10.0, 70.0)).hist, x, v),
        (lambda t: torch.histogram(t, bins=edges).hist, x, v),
        (lambda t: torch.histogram(t, bins=edges, weight=torch.ones_like(v) * 2).hist, x, v),
        (lambda t: torch.histogramdd(t, bins=[3, 2], range=[10.0, 70.0, 0.0, 80.0]).hist, p, pts),
    ]
    for fn, remote, local in cases:
        name = "x" if remote is x else "p"
        (got,) = evaluate([fn(remote)], {name: local.numpy()})
        torch.testing.assert_close(got, fn(local), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("lo", "hi", "bins"), [(10.0, 70.0, 4), (-5.0, 75.5, 7), (0.1, 0.7, 13)])
def test_histc_bins_values_at_and_beside_every_bin_edge_as_torch_does(
    dtype: torch.dtype, lo: float, hi: float, bins: int
) -> None:
    # torch's formula in float32 puts 6.4999995 in the second bin of [-5, 75.5] / 7: the
    # values either side of each edge are where a comparison with linspace edges would err
    edges = torch.linspace(lo, hi, bins + 1, dtype=dtype)
    near = torch.cat([edges, torch.nextafter(edges, edges + 1), torch.nextafter(edges, edges - 1)])
    v = torch.cat([near, torch.rand(2000, dtype=dtype) * (hi - lo) * 1.2 + lo - 0.1 * (hi - lo)])
    x = remote_input("x", tuple(v.shape), dtype)
    (got,) = evaluate([torch.histc(x, bins=bins, min=lo, max=hi)], {"x": v.numpy()})
    torch.testing.assert_close(got, torch.histc(v, bins=bins, min=lo, max=hi), rtol=0, atol=0)


def test_a_histc_recorded_again_reuses_its_thresholds_and_still_bins_as_torch() -> None:
    """The thresholds of a range are worked out once and kept read-only: a histogram
    recorded again (or over another range, another dtype) still bins as torch does."""
    v = VALUES.to(torch.float32)
    x = remote_input("x", tuple(v.shape), torch.float32)
    for lo, hi, bins in ((10.0, 70.0, 4), (10.0, 70.0, 4), (-5.0, 75.5, 7), (10.0, 70.0, 5)):
        (got,) = evaluate([torch.histc(x, bins=bins, min=lo, max=hi)], {"x": v.numpy()})
        torch.testing.assert_close(got, torch.histc(v, bins=bins, min=lo, max=hi), rtol=0, atol=0)
    kept = _histc_thresholds(10.0, 70.0, 4, torch.float32)
    assert kept is _histc_thresholds(10.0, 70.0, 4, torch.float32)
    assert not kept.flags.writeable
    assert _histc_thresholds(10.0, 70.0, 4, torch.float64).dtype == np.float64


@pytest.mark.usefixtures("sqlite_only")
def test_a_histogram_of_a_private_column_publishes_at_l1_2(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = remote_dataset(owner_client, ds_client)
    bmi = ds["bmi"]
    edges = torch.tensor([20.0, 30.0, 40.0])
    for hist in (
        torch.histc(bmi, bins=6, min=10, max=70),
        torch.histogram(bmi, bins=6, range=(10.0, 70.0)).hist,
        (torch.bucketize(bmi, edges).unsqueeze(-1) == torch.arange(4)).sum(0),
    ):
        ops = {n.op for n in graph_for([hist]).nodes}
        assert not ops & {"scatter_add", "searchsorted"}, ops
        s = hist.sensitivity()
        assert s.l1 == pytest.approx(2.0, rel=1e-6) and s.l2 == pytest.approx(
            math.sqrt(2), rel=1e-6
        )
    released = torch.histc(bmi, bins=6, min=10, max=70).publish(epsilon=1.0)
    assert released.shape == (6,) and np.all((released.numpy() >= 0) & (released.numpy() <= 40))
    # the data's own range (no min and max) makes private edges: still refused, with advice
    with pytest.raises(sdk.NotPublishableError, match="one comparison per bin"):
        torch.histc(bmi, bins=4)


def test_bucketize_and_searchsorted_on_one_sorted_row_match_torch_by_comparisons() -> None:
    boundaries = torch.tensor([-1.0, 0.5, 2.0, 2.0, 3.0, math.inf])
    v = torch.tensor(
        [[-5.0, -1.0, 0.5, 2.0], [2.5, 3.0, math.inf, -math.inf], [math.nan, 0.0, 7, 1]]
    )
    x = remote_input("x", tuple(v.shape), torch.float32)
    cases = [
        lambda t: torch.bucketize(t, boundaries),
        lambda t: torch.bucketize(t, boundaries, right=True, out_int32=True),
        lambda t: torch.searchsorted(boundaries, t),
        lambda t: torch.searchsorted(boundaries, t, side="right"),
    ]
    for fn in cases:
        out = fn(x)
        assert "searchsorted" not in {n.op for n in graph_for([out]).nodes}
        (got,) = evaluate([out], {"x": v.numpy()})
        torch.testing.assert_close(got, fn(v), rtol=0, atol=0)

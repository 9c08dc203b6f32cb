"""The SDK's cache of torch's output metadata: the same op on the same argument metadata
gives the same outputs, and anything else that torch's meta kernels read tells them apart."""

from __future__ import annotations

import torch

from dpnode.sdk._remote import dispatch, remote_input


def test_scalars_of_other_types_promote_differently_with_the_cache_warm() -> None:
    x = remote_input("x", (3,), torch.int64)
    for _ in range(2):  # the second round comes from the cache
        assert (x + 1).dtype == torch.int64
        assert (x + 1.0).dtype == torch.float32
        assert (x + True).dtype == torch.int64
        assert (x * 2.5).dtype == torch.float32
        assert torch.div(x, 2, rounding_mode="floor").dtype == torch.int64
        assert (x / 2).dtype == torch.float32


def test_a_remembered_output_is_a_fresh_tensor_of_the_same_layout() -> None:
    x = remote_input("x", (4, 3), torch.float32)
    first, second = x.t() @ x, x.t() @ x
    assert first.shape == second.shape == (3, 3) and first._meta is not second._meta
    assert first._meta.stride() == second._meta.stride()
    key_count = len(dispatch._OUTPUT_METAS)
    y = remote_input("y", (5, 3), torch.float64)
    assert (y.t() @ y).dtype == torch.float64  # other metadata: another entry
    assert len(dispatch._OUTPUT_METAS) > key_count


def test_ops_with_several_outputs_keep_their_kind() -> None:
    x = remote_input("x", (4, 3), torch.float32)
    for _ in range(2):
        out = torch.max(x, dim=1)
        assert type(out).__name__ == "max" and out.values.shape == (4,)
        assert out.indices.dtype == torch.int64

"""A refusal by the node names the prim and the torch call that recorded it; a privacy rule that
fails on arguments it was not written for is a refusal too (logged), never a 500."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from dpnode import sdk
from dpnode.core.privacy.rules import RULES
from dpnode.core.privacy.rules.base import Ctx
from dpnode.core.privacy.state import State


@pytest.fixture
def ds(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    rng = np.random.default_rng(3)
    owner_client.upload_dataset(
        "visits",
        {"income": rng.uniform(0, 2e5, 30), "age": rng.integers(0, 120, 30)},
        bounds={"income": (0, 2e5), "age": (0, 120)},
    )
    return ds_client.dataset("visits")


def test_a_refused_node_names_the_torch_call_that_recorded_it(
    ds: sdk.DatasetHandle, ds_client: sdk.Client, sqlite_only: None
) -> None:
    for call, record in (
        ("torch.exp", lambda: torch.exp(ds["income"]).sum()),
        ("Tensor.log", lambda: (ds["income"] - 1).log().mean()),
    ):
        with pytest.raises(sdk.PrivacyTrackingError) as caught:
            record().publish(epsilon=0.1)
        message = str(caught.value)
        assert message.startswith("node ") and f"[recorded by {call}]" in message, message
        with pytest.raises(sdk.PrivacyTrackingError, match=rf"\[recorded by {call}\]"):
            record().sensitivity()  # the free route names it the same way
    assert ds_client.budget().spent_epsilon == 0


def test_unbounded_values_name_the_node_where_they_became_unbounded(
    ds: sdk.DatasetHandle, sqlite_only: None
) -> None:
    with pytest.raises(sdk.PrivacyTrackingError) as caught:
        (1 / (ds["age"] - 60)).sum().publish(epsilon=0.1)  # divides by a range holding 0
    message = str(caught.value)
    assert message.startswith("output 0: its values are unbounded from node "), message
    assert "(reciprocal) on" in message and "[recorded by Tensor.__rtruediv__]" in message


def _broken(c: Ctx) -> State:
    raise ValueError("operands could not be broadcast together")


def test_a_rule_that_fails_is_a_named_refusal_and_the_node_keeps_serving(
    ds: sdk.DatasetHandle,
    ds_client: sdk.Client,
    sqlite_only: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setitem(RULES, "tanh", _broken)  # a rule bug, injected
    with (
        caplog.at_level(logging.ERROR, logger="dpnode"),
        pytest.raises(sdk.PrivacyTrackingError) as caught,
    ):
        torch.tanh(ds["income"] / 2e5).sum().publish(epsilon=0.1)
    message = str(caught.value)
    assert "(tanh)" in message and "internal error, ValueError" in message
    assert "nothing was charged" in message and "[recorded by torch.tanh]" in message
    assert any("privacy rule of tanh failed" in r.getMessage() for r in caplog.records)
    assert ds_client.budget().spent_epsilon == 0
    monkeypatch.undo()
    released = torch.tanh(ds["income"] / 2e5).sum().publish(epsilon=0.1)
    assert torch.isfinite(released)
    assert ds_client.budget().spent_epsilon == pytest.approx(0.1)

"""publish and sensitivity over HTTP, with graphs built directly in the engine's format."""

from __future__ import annotations

import numpy as np
import pytest

from dpnode import sdk
from dpnode.core.engine import GraphBuilder, encode
from dpnode.node.context import NodeContext


def _ages(owner: sdk.Client, n: int = 1000) -> sdk.DatasetHandle:
    rng = np.random.default_rng(3)
    return owner.upload_dataset(
        "ages", {"age": rng.integers(0, 101, n)}, bounds={"age": (0, 100)}, tags=["t"]
    )


def mean_frame(ds: sdk.DatasetHandle) -> bytes:
    b = GraphBuilder()
    age = b.input(f"dataset:{ds.id}/age", "int64", (ds.row_count,))
    as_float = b.op("convert_element_type", age, dtype="float64")
    return encode(b.build([b.op("mean", as_float)]))


def test_mean_is_published_with_exact_sensitivity_and_charged(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = _ages(owner_client)
    true_mean = float(owner_client.dataset("ages").download()["age"].mean())
    free = ds_client.sensitivity_of_frame(mean_frame(ds), epsilon=0.5)
    assert free["l1"] == pytest.approx(100 / 1000, rel=1e-9)  # float64 rounding: ~1e-10
    assert free["noise_scale"] == pytest.approx(0.2, rel=2e-3)  # + the grid's 0.1%
    assert ds_client.budget().spent_epsilon == 0.0  # asking is free
    values, receipt = ds_client.publish_frame(mean_frame(ds), epsilon=0.5)
    assert values[0].shape == ()
    assert abs(float(values[0]) - true_mean) < 0.2 * 40  # 40 scales: p < 1e-17
    assert receipt["mechanism"] == "laplace" and receipt["epsilon"] == 0.5
    assert receipt["remaining_epsilon"] == 9.5
    assert ds_client.budget().spent_epsilon == 0.5
    (entry,) = ds_client.ledger()
    assert entry.id == receipt["ledger_id"] and entry.dataset_ids == (ds.id,)


def test_over_budget_is_refused_and_releases_nothing(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = _ages(owner_client)
    ds_client.publish_frame(mean_frame(ds), epsilon=9.75)
    with pytest.raises(sdk.BudgetExceededError, match=r"remaining budget: epsilon 0\.25") as info:
        ds_client.publish_frame(mean_frame(ds), epsilon=0.5)
    assert len(ds_client.ledger()) == 1
    # the way out is named: a request for more, or less epsilon
    assert "client.request_budget(epsilon=..., reason=...)" in str(info.value)
    assert info.value.rule == "defaults.epsilon"


def test_a_datasets_cap_does_not_send_its_users_to_ask_for_more(
    owner_client: sdk.Client, ds_client: sdk.Client, admin_client: sdk.Client
) -> None:
    ds = _ages(owner_client)
    admin_client.set_policy("[datasets.ages]\nmax_epsilon = 1.0\n", reason="a promise")
    ds_client.publish_frame(mean_frame(ds), epsilon=0.75)
    with pytest.raises(sdk.BudgetExceededError) as info:
        ds_client.publish_frame(mean_frame(ds), epsilon=0.5)
    assert info.value.rule == "datasets.ages.max_epsilon"
    assert "request_budget" not in str(info.value)  # the cap is everyone's: no grant lifts it


@pytest.mark.parametrize(
    ("epsilon", "message"),
    [(float("nan"), "epsilon must be"), (-1.0, "epsilon must be"), (0.0, "at least 1e-9")],
)
def test_bad_epsilon_is_refused_before_any_work(
    owner_client: sdk.Client, ds_client: sdk.Client, epsilon: float, message: str
) -> None:
    ds = _ages(owner_client)
    with pytest.raises(sdk.InvalidRequestError, match=message):
        ds_client.publish_frame(mean_frame(ds), epsilon=epsilon)
    assert ds_client.ledger() == []


def test_unknown_inputs_and_garbage_frames_are_refused(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    b = GraphBuilder()
    x = b.input("file:/etc/passwd", "float64", (3,))
    with pytest.raises(sdk.GraphError, match="names no data on this node"):
        ds_client.publish_frame(encode(b.build([b.op("sum", x)])), epsilon=1.0)
    with pytest.raises(sdk.GraphError):
        ds_client.publish_frame(b"\x00" * 40, epsilon=1.0)
    b = GraphBuilder()
    x = b.input("dataset:999/age", "float64", (3,))
    with pytest.raises(sdk.NotFoundError, match="no dataset 999"):
        ds_client.publish_frame(encode(b.build([b.op("sum", x)])), epsilon=1.0)
    assert ds_client.ledger() == []


def test_the_free_noise_scale_is_the_one_the_release_uses(
    owner_client: sdk.Client, ds_client: sdk.Client
) -> None:
    ds = _ages(owner_client)
    for delta in (None, 1e-7):
        free = ds_client.sensitivity_of_frame(mean_frame(ds), epsilon=0.5, delta=delta)
        _, receipt = ds_client.publish_frame(mean_frame(ds), epsilon=0.5, delta=delta)
        assert receipt["noise_scale"] == free["noise_scale"]
        assert receipt["mechanism"] == ("laplace" if delta is None else "gaussian")


def test_graphs_over_the_configured_quotas_are_refused_before_any_work(
    owner_client: sdk.Client, ds_client: sdk.Client, context: NodeContext
) -> None:
    ds = _ages(owner_client)
    context.settings = context.settings.model_copy(update={"max_graph_flops": 10})
    with pytest.raises(sdk.QuotaExceededError, match="quota"):
        ds_client.publish_frame(mean_frame(ds), epsilon=1.0)
    context.settings = context.settings.model_copy(update={"max_graph_nodes": 2})
    with pytest.raises(sdk.PayloadTooLargeError, match="graph has 3 nodes; the limit is 2"):
        ds_client.sensitivity_of_frame(mean_frame(ds))
    assert ds_client.ledger() == []

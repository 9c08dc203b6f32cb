"""What an admin reads of a waiting publish (its computation, noise, description, the
requester's budget and the datasets' caps), and who may read a dataset's cap, through the SDK
against the in-process app."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from starlette.testclient import TestClient

from dpnode import sdk
from tests.conftest import PASSWORD
from tests.sdk.conftest import connect, remote_dataset

POLICY = """
[approval]
epsilon_above = 0.5

[datasets.cohort]
max_epsilon = 30.0
"""


@pytest.fixture
def cohort(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    return remote_dataset(owner_client, ds_client)


def _wait(publish: Callable[[], Any]) -> int:
    """The approval id of a publish that waits for an admin."""
    with pytest.raises(sdk.ApprovalRequiredError) as waiting:
        publish()
    assert waiting.value.approval_id is not None
    return waiting.value.approval_id


def test_an_admin_reads_the_computation_and_approves_it(
    cohort: sdk.DatasetHandle,
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    sqlite_only: None,
) -> None:
    admin_client.set_policy(POLICY, reason="big publishes get a look")
    mean = cohort["bmi"].mean()
    why = "mean BMI for the quarterly <b>report</b>"
    approval_id = _wait(lambda: mean.publish(epsilon=0.7, description=why))

    (pending,) = admin_client.publish_approvals(status="pending")
    assert (pending.id, pending.description, pending.mechanism) == (approval_id, why, "laplace")
    # what it computes, named as the scientist wrote it, with the noise the node plans
    scale = mean.noise_scale(epsilon=0.7)
    assert pending.noise_scale == scale
    assert pending.sensitivity is not None
    assert pending.sensitivity >= sdk.sensitivity(mean).l1 > 0
    assert pending.computation == (
        'x0 = cohort["bmi"]   # float32 (40,) bounds [10, 70]',
        "x1 = x0.mean()   # float32 ()",
        f"release x1  # shape (), L1 sensitivity {pending.sensitivity:.4g}, "
        f"laplace scale {scale:.4g}",
    )
    assert pending.outputs == ((),)
    assert pending.remaining_epsilon == ds_client.budget().remaining_epsilon
    (read,) = pending.datasets
    assert read.name == "cohort" and read.budget is not None
    assert (read.budget.epsilon, read.budget.epsilon_used) == (30.0, 0.0)
    shown = str(pending)
    assert why in shown and 'cohort["bmi"]' in shown and "cohort: epsilon 0 / 30 used" in shown

    approved = admin_client.approve_publish(approval_id, reason="an aggregate for the board")
    assert approved.status == "approved" and approved.computation == pending.computation
    (line,) = admin_client.audit(action="publish.approved")
    assert line.detail["description"] == why
    assert line.detail["computation"] == list(pending.computation)
    assert line.detail["noise_scale"] == scale and line.detail["mechanism"] == "laplace"
    assert line.detail["dataset_caps"] == {"cohort": "epsilon 0 of 30, delta 0 of 1e-06 used"}

    released = mean.publish(epsilon=0.7, description=why)
    assert released.receipt.noise_scale == scale
    (entry,) = ds_client.ledger_entries()
    assert entry.detail["description"] == why


def test_a_scientist_sees_only_their_own_requests_and_no_cap(
    cohort: sdk.DatasetHandle,
    http: TestClient,
    ds_client: sdk.Client,
    owner_client: sdk.Client,
    admin_client: sdk.Client,
    sqlite_only: None,
) -> None:
    admin_client.set_policy(POLICY, reason="big publishes get a look")
    admin_client.create_user("other@example.org", PASSWORD)
    other = connect(http, "other@example.org")
    theirs = other.dataset("cohort")["age"].float().sum()
    _wait(lambda: theirs.publish(epsilon=0.9, description="the other one's secret plan"))
    mine = _wait(lambda: cohort["bmi"].mean().publish(epsilon=0.6))

    (own,) = ds_client.publish_approvals()
    assert own.id == mine and own.user_email == "ds@example.org"
    assert all("age" not in line for line in own.computation)
    (read,) = own.datasets
    assert read.name == "cohort" and read.budget is None  # caps: owners and admins only
    with pytest.raises(sdk.PermissionDeniedError, match="owner of dataset 'cohort' and admins"):
        cohort.budget()
    body = ds_client._json("GET", "/datasets/cohort")
    assert body["budget"] is None
    assert len(admin_client.publish_approvals(status="pending")) == 2
    assert owner_client.dataset("cohort").budget().capped


def test_the_cap_figure_is_exact_after_a_few_publishes(
    cohort: sdk.DatasetHandle,
    http: TestClient,
    ds_client: sdk.Client,
    owner_client: sdk.Client,
    admin_client: sdk.Client,
    sqlite_only: None,
) -> None:
    admin_client.set_policy("[datasets.cohort]\nmax_epsilon = 30.0\n", reason="a lifetime cap")
    admin_client.create_user("other@example.org", PASSWORD)
    other = connect(http, "other@example.org").dataset("cohort")
    before = owner_client.dataset("cohort").budget()
    assert (before.capped, before.epsilon, before.epsilon_used, before.renews_at) == (
        True,
        30.0,
        0.0,
        None,
    )
    cohort["age"].float().mean().publish(epsilon=0.5)
    cohort["bmi"].sum().publish(epsilon=0.25)
    other["age"].float().sum().publish(epsilon=1.0)  # another user's spending counts too
    after = owner_client.dataset("cohort").budget()
    assert (after.epsilon_used, after.epsilon_remaining) == (1.75, 28.25)
    assert str(after).startswith("cohort: epsilon 1.75 / 30 used, 28.25 left")
    body = admin_client._json("GET", "/datasets/cohort")
    assert body["budget"]["epsilon_used"] == 1.75 and body["budget"]["epsilon"] == 30.0
    assert admin_client.dataset("cohort").budget() == after


def test_a_description_too_long_is_refused_and_nothing_is_charged(
    cohort: sdk.DatasetHandle, ds_client: sdk.Client, sqlite_only: None
) -> None:
    with pytest.raises(sdk.DPNodeError, match="description"):
        cohort["bmi"].mean().publish(epsilon=0.5, description="x" * 501)
    with pytest.raises(sdk.DPNodeError, match="control characters"):
        cohort["bmi"].mean().publish(epsilon=0.5, description="bell \x07")
    assert ds_client.ledger_entries() == []


def test_an_uncapped_dataset_says_so(
    cohort: sdk.DatasetHandle, owner_client: sdk.Client, sqlite_only: None
) -> None:
    found = owner_client.dataset("cohort").budget()
    assert not found.capped and found.epsilon is None and str(found) == "cohort: not capped"


def test_a_query_sends_its_description_with_its_publish(
    cohort: sdk.DatasetHandle, admin_client: sdk.Client, sqlite_only: None
) -> None:
    from dpnode.sdk.query import sum as total

    admin_client.set_policy(POLICY, reason="big publishes get a look")
    query = cohort.query().agg(total("age"))
    _wait(lambda: query.publish(epsilon=0.9, description="years lived, all patients"))
    (pending,) = admin_client.publish_approvals(status="pending")
    assert pending.description == "years lived, all patients"
    assert pending.computation[-1].startswith("release x")


def test_sql_sends_its_description_with_its_publish(
    cohort: sdk.DatasetHandle, ds_client: sdk.Client, admin_client: sdk.Client, sqlite_only: None
) -> None:
    admin_client.set_policy(POLICY, reason="big publishes get a look")
    why = "years lived, in SQL"
    _wait(lambda: ds_client.sql("SELECT SUM(age) FROM cohort", epsilon=0.9, description=why))
    (pending,) = admin_client.publish_approvals(status="pending")
    assert pending.description == why
    assert pending.computation[-1].startswith("release x")


def test_what_an_admin_reads_does_not_depend_on_the_data(
    cohort: sdk.DatasetHandle,
    owner_client: sdk.Client,
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    sqlite_only: None,
) -> None:
    from tests.sdk.conftest import cohort as columns

    # the same public contract (bounds, rows) over other values: every row replaced
    bounds = {"age": (0, 120), "bmi": (10, 70), "sex": (0, 1), "scan": (0, 1)}
    owner_client.upload_dataset("neighbour", columns(40, 7), bounds=bounds, tags=["health"])
    admin_client.set_policy(POLICY, reason="big publishes get a look")
    for name in ("cohort", "neighbour"):
        handle = ds_client.dataset(name)
        query = (handle["bmi"] * 2 - handle["age"].float()).clamp(-50, 50).sum()
        _wait(lambda q=query: q.publish(epsilon=0.8))
    second, first = admin_client.publish_approvals(status="pending")
    assert first.computation[4:6] == (
        "x4 = x1 - x3   # float32 (40,)",
        "x5 = x4.clamp(-50, 50)   # float32 (40,)",
    )
    assert [line.replace("neighbour", "cohort") for line in second.computation] == list(
        first.computation
    )
    assert (second.sensitivity, second.noise_scale) == (first.sensitivity, first.noise_scale)

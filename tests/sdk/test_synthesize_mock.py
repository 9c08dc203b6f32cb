"""``client.dataset(ref).synthesize_mock(...)``: a data owner makes a dataset's mock a
differentially private synthetic table, paid from the dataset's cap and not from the owner's
budget; end to end through the SDK and the real app, with its refusals."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from dpnode import sdk
from dpnode.node.context import NodeContext
from dpnode.node.db.models import LedgerEntry, SynthesisJob
from tests.conftest import make_user
from tests.sdk.conftest import connect, remote_dataset
from tests.sdk.test_synthesize import N, table

CAP = "[datasets.survey]\nmax_epsilon = 10.0\nmax_delta = 1e-5\n"


@pytest.fixture
def survey(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    """The survey, with a mock its owner uploaded (zeros: no relation between columns)."""
    fake = {k: np.zeros_like(np.asarray(v)) for k, v in table(50, 1).items()}
    fake["region"] = np.array(["north"] * 50, dtype=object)
    fake["age"] = np.full(50, 30)
    fake["bmi"] = np.full(50, 20.0)
    owner_client.upload_dataset(
        "survey",
        table(N, 0),
        tags=["health"],
        bounds={"age": (0, 120), "bmi": (10, 70)},
        categories={"region": ["north", "south", "east"]},
        mock=fake,
    )
    return owner_client.dataset("survey")


def _mock_unchanged(ds_client: sdk.Client) -> None:
    handle = ds_client.dataset("survey")
    assert handle.mock_synthetic is None and len(handle.mock()["age"]) == 50


def test_an_owners_synthetic_mock_is_paid_from_the_cap_not_from_the_owners_budget(
    survey: sdk.DatasetHandle,
    owner_client: sdk.Client,
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    context: NodeContext,
) -> None:  # on both databases: the charge, its flag, the cap's sums and the mock are rows
    admin_client.set_policy(CAP, reason="a promise to the survey's subjects")
    assert survey.budget().epsilon_used == 0
    asked = {"epsilon": 2.0, "delta": 1e-6, "idempotency_key": "mock-1"}
    made = survey.synthesize_mock(**asked)  # type: ignore[call-overload]
    again = survey.synthesize_mock(**asked)  # type: ignore[call-overload]
    assert again.receipt == made.receipt  # a retry under the key: the first answer
    receipt = made.receipt
    assert receipt is not None and receipt["paid_from"] == "cap"
    # the cap rose by the charge; the owner's own budget did not move
    cap = survey.budget()
    # (as the cap's filter counts it: the run's rho converted at the cap's delta)
    assert cap.epsilon_used is not None and cap.epsilon_used > 1.0
    assert cap.epsilon_remaining == pytest.approx(10.0 - cap.epsilon_used)
    assert receipt["cap_epsilon_used"] == pytest.approx(cap.epsilon_used)
    assert owner_client.budget().spent_epsilon == 0
    assert owner_client.budget().spent_delta == 0
    # one ledger row, the owner's, with the method and its parameters, marked cap-only
    (mine,) = owner_client.ledger()  # in the owner's ledger, using nothing of their budget
    assert mine.entries[0].cap_only and mine.entries[0].epsilon_used == 0
    assert "paid from the datasets' caps" in str(mine.entries[0])
    (line,) = admin_client.ledger(everyone=True)
    assert line.entries[0].id == receipt["ledger_id"] == made.mock_synthetic["ledger_id"]  # type: ignore[index]
    with context.sessions() as session:
        row = session.scalars(select(LedgerEntry)).one()
    assert row.user_id == owner_client.me().id and row.cap_only
    assert row.mechanism == "mst" and row.detail["mock"] and row.detail["epsilon"] == 2.0
    assert row.dataset_ids == [survey.id]

    # the mock replaced: the dataset's columns, in its order, dtypes and bounds; provenance
    seen = ds_client.dataset("survey")
    assert seen.mock_synthetic == made.mock_synthetic
    provenance = seen.mock_synthetic
    assert provenance is not None and "seed" not in provenance
    assert provenance["method"] == "mst" and provenance["epsilon"] == 2.0
    assert provenance["delta"] == 1e-6 and provenance["rows"] == N and provenance["at"]
    assert "synthetic: mst, epsilon 2" in repr(seen)
    mock = seen.mock()
    assert mock.synthetic == provenance
    assert list(mock) == list(seen.columns)  # the stored order, not the alphabet's
    real = survey.download()
    assert list(real) == list(seen.columns)
    for name, column in seen.columns.items():
        assert mock[name].dtype == real[name].dtype, name
        assert len(mock[name]) == N
        low, high = column.bounds
        assert (mock[name] >= low).all() and (mock[name] <= high).all(), name
    frame = mock.to_pandas()
    assert set(frame["region"]) <= {"north", "south", "east"}
    assert float((frame["smoker"] == frame["cough"]).mean()) > 0.7  # the relation kept

    # a data scientist's publish later sees the cap reduced by the mock's charge
    left = cap.epsilon_remaining
    assert left is not None and left < 9.0
    with pytest.raises(sdk.BudgetExceededError) as refused:
        ds_client.dataset("survey")["age"].float().mean().publish(epsilon=9.0)
    assert refused.value.rule == "datasets.survey.max_epsilon"
    ds_client.dataset("survey")["age"].float().mean().publish(epsilon=1.0)
    assert survey.budget().epsilon_used == pytest.approx(cap.epsilon_used + 1.0)


def test_only_the_owner_or_an_admin_may_and_an_unknown_dataset_is_not_found(
    survey: sdk.DatasetHandle,
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    http: object,
    context: NodeContext,
    sqlite_only: None,
) -> None:
    admin_client.set_policy(CAP, reason="a promise")
    other = make_user(context, "other@example.org", "data_owner")
    for client in (ds_client, connect(http, other.email)):  # type: ignore[arg-type]
        with pytest.raises(sdk.PermissionDeniedError) as refused:
            client.dataset("survey").synthesize_mock(epsilon=1.0, delta=1e-6)
        assert refused.value.status == 403
    with pytest.raises(sdk.NotFoundError):
        admin_client._json(
            "POST", "/datasets/nope/mock/synthesize", json={"epsilon": 1.0, "delta": 1e-6}
        )
    assert admin_client.ledger(everyone=True) == []
    _mock_unchanged(ds_client)
    # an admin may: paid from the cap, the admin's own budget untouched
    made = admin_client.dataset("survey").synthesize_mock(epsilon=1.0, delta=1e-6, method="aim")
    assert made.mock_synthetic is not None and made.mock_synthetic["method"] == "aim"
    assert admin_client.budget().spent_epsilon == 0


def test_a_dataset_without_a_cap_is_refused_naming_the_policys_datasets_table(
    survey: sdk.DatasetHandle, ds_client: sdk.Client, admin_client: sdk.Client, sqlite_only: None
) -> None:
    with pytest.raises(sdk.PolicyRefusedError, match=r"\[datasets.survey\] max_epsilon") as no:
        survey.synthesize_mock(epsilon=1.0, delta=1e-6)
    assert no.value.status == 403 and no.value.rule == "datasets.survey"
    assert "nothing was charged" in str(no.value)
    assert admin_client.ledger(everyone=True) == []
    _mock_unchanged(ds_client)


def test_a_mock_over_the_cap_is_refused_before_any_computation(
    survey: sdk.DatasetHandle,
    ds_client: sdk.Client,
    admin_client: sdk.Client,
    owner_client: sdk.Client,
    context: NodeContext,
    sqlite_only: None,
) -> None:
    admin_client.set_policy(
        "[datasets.survey]\nmax_epsilon = 0.5\nmax_delta = 1e-5\n", reason="a small cap"
    )
    with pytest.raises(sdk.BudgetExceededError, match=r"capped at epsilon 0\.5") as over:
        survey.synthesize_mock(epsilon=2.0, delta=1e-6)
    assert over.value.rule == "datasets.survey.max_epsilon"
    assert admin_client.ledger(everyone=True) == []
    with context.sessions() as session:  # no job started: nothing was read
        assert session.scalars(select(SynthesisJob)).all() == []
    assert survey.budget().epsilon_used == 0
    _mock_unchanged(ds_client)
    # the owner's own budget (10) is not what decides: a data scientist's larger one would
    # not help either, the cap does
    assert owner_client.budget().spent_epsilon == 0


def test_the_docs_example_runs(
    survey: sdk.DatasetHandle,
    owner_client: sdk.Client,
    admin_client: sdk.Client,
    sqlite_only: None,
) -> None:
    admin_client.set_policy(CAP, reason="a promise")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "synthetic.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    (example,) = [b for b in blocks if "synthesize_mock" in b]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example, "docs/synthetic.md", "exec"), {"owner": owner_client})  # our docs
    assert "'method': 'mst'" in out.getvalue() and f"mst ({N}, 5)" in out.getvalue()


def test_a_dataset_with_per_row_arrays_is_refused_with_the_way_out(
    owner_client: sdk.Client, ds_client: sdk.Client, admin_client: sdk.Client, sqlite_only: None
) -> None:
    cohort = remote_dataset(owner_client, ds_client)  # its "scan" is a 2x3 array per row
    admin_client.set_policy("[datasets.cohort]\nmax_epsilon = 10.0\n", reason="a promise")
    with pytest.raises(sdk.InvalidRequestError, match=r"'scan'.*upload a mock") as refused:
        owner_client.dataset(cohort.name).synthesize_mock(epsilon=1.0, delta=1e-6)
    assert refused.value.status == 422
    assert admin_client.ledger(everyone=True) == []

"""``ds.synthesize(...)``: a differentially private synthetic copy, end to end through the SDK
and the real app (in process), with its charge, its provenance and its refusals."""

from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import numpy as np
import pytest

from dpnode import sdk
from dpnode.node.context import NodeContext
from dpnode.node.services import synthesis_methods

N = 400


def table(n: int, seed: int) -> dict[str, object]:
    """Five columns, two of them strongly related (``smoker`` -> ``cough``)."""
    rng = np.random.default_rng(seed)
    smoker = rng.random(n) < 0.4
    cough = np.where(smoker, rng.random(n) < 0.9, rng.random(n) < 0.1)
    return {
        "age": rng.integers(18, 90, n),
        "bmi": rng.uniform(15, 45, n),
        "region": np.array(["north", "south", "east"], dtype=object)[rng.integers(0, 3, n)],
        "smoker": smoker,
        "cough": cough,
    }


@pytest.fixture
def survey(owner_client: sdk.Client, ds_client: sdk.Client) -> sdk.DatasetHandle:
    owner_client.upload_dataset(
        "survey",
        table(N, 0),
        tags=["health"],
        bounds={"age": (0, 120), "bmi": (10, 70)},
        categories={"region": ["north", "south", "east"]},
    )
    return ds_client.dataset("survey")


def test_a_synthetic_copy_is_charged_once_stored_and_downloadable(
    survey: sdk.DatasetHandle, ds_client: sdk.Client
) -> None:  # on both databases: the charge, the key and the new dataset are real rows
    before = ds_client.budget()
    asked = {"epsilon": 4.0, "delta": 1e-6, "seed": 7, "name": "survey-copy"}
    copy = survey.synthesize(**asked, idempotency_key="synth-1")  # type: ignore[call-overload]
    # a retry under the same key gets the first answer, charged once
    again = survey.synthesize(**asked, idempotency_key="synth-1")  # type: ignore[call-overload]
    assert again.id == copy.id and again.receipt == copy.receipt
    with pytest.raises(sdk.ConflictError, match="another"):  # the key names one request
        survey.synthesize(epsilon=1.0, delta=1e-6, idempotency_key="synth-1")
    receipt = copy.receipt
    assert receipt is not None and receipt["mechanism"] == "mst"
    # one ledger line for the whole run, with the method and its parameters
    ledger = ds_client.ledger()
    assert len(ledger) == 1
    assert receipt["ledger_id"] == ledger[0].entries[0].id
    spent = ds_client.budget()
    # what the receipt says the run took is what the budget lost, as the filter counts it
    used = spent.spent_epsilon - before.spent_epsilon
    assert receipt["epsilon"] == pytest.approx(used, abs=1e-8) and used > 0
    assert receipt["selection_epsilon"] == pytest.approx(0.4)
    # the new dataset: flagged synthetic, the caller's, same columns and bounds
    assert copy.synthetic is not None
    assert copy.synthetic["source"] == "survey" and copy.synthetic["method"] == "mst"
    assert copy.synthetic["epsilon"] == 4.0 and "seed" not in copy.synthetic
    assert copy.owner == "ds@example.org" and "synthetic" in copy.tags
    assert "synthetic from 'survey' (mst, epsilon 4.0)" in repr(copy)
    assert copy.row_count == N and list(copy.columns) == list(survey.columns)
    assert copy.bounds == survey.bounds
    assert ds_client.dataset("survey-copy").synthetic == copy.synthetic  # in the catalog
    frame = copy.download().to_pandas()
    assert len(frame) == N
    assert frame["age"].between(0, 120).all() and frame["bmi"].between(10, 70).all()
    assert frame["age"].dtype.kind == "i"
    assert list(frame.columns) == list(survey.columns)  # the stored order, not the alphabet's
    assert set(frame["region"]) <= {"north", "south", "east"}
    # the strong relation survives (4 columns of 5 joined by a tree of 4 pairs: the
    # smoker-cough pair scores far above the others and is chosen)
    assert ["smoker", "cough"] in receipt["tree"] or ["cough", "smoker"] in receipt["tree"]
    agree = float((frame["smoker"] == frame["cough"]).mean())
    assert agree > 0.75, agree
    assert copy.download().to_polars().height == N
    assert copy.download().to_arrow().num_rows == N
    # the source's real values stay refused
    with pytest.raises(sdk.PermissionDeniedError, match="synthesize"):
        survey.download()


def _nothing_happened(ds_client: sdk.Client, owner_client: sdk.Client) -> None:
    """No ledger row, no new dataset: a refusal charges and stores nothing."""
    assert ds_client.ledger() == []
    assert [d.name for d in owner_client.search()] == ["survey"]


@pytest.mark.parametrize(
    ("asked", "error", "words"),
    [
        ({"epsilon": 4.0, "delta": 0.0}, sdk.InvalidRequestError, "delta must be in"),
        ({"epsilon": math.nan, "delta": 1e-6}, sdk.InvalidRequestError, "epsilon"),
        ({"epsilon": 1.0, "delta": 1e-6, "method": "gan"}, sdk.InvalidRequestError, "mst"),
        ({"epsilon": 1.0, "delta": 1e-6, "bins": {"age": 0}}, sdk.InvalidRequestError, "bins"),
        ({"epsilon": 1.0, "delta": 1e-6, "columns": ["nope"]}, sdk.InvalidRequestError, "nope"),
        ({"epsilon": 1.0, "delta": 1e-6, "rows": 0}, sdk.InvalidRequestError, "rows"),
        ({"epsilon": 50.0, "delta": 1e-6}, sdk.BudgetExceededError, "budget"),
        ({"epsilon": 1.0, "delta": 1e-6, "name": "survey"}, sdk.ConflictError, "exists"),
        (
            {"epsilon": 1.0, "delta": 1e-6, "bins": {"age": 1024, "bmi": 1024}},
            sdk.QuotaExceededError,
            "times the node's memory quota",
        ),
    ],
)
def test_a_refused_synthesis_charges_and_stores_nothing(
    survey: sdk.DatasetHandle,
    ds_client: sdk.Client,
    owner_client: sdk.Client,
    context: NodeContext,
    asked: dict[str, object],
    error: type[Exception],
    words: str,
    sqlite_only: None,
) -> None:
    context.settings.max_graph_memory_bytes = 16 * 2**20
    with pytest.raises(error, match=words):
        survey.synthesize(**asked)  # type: ignore[call-overload]
    _nothing_happened(ds_client, owner_client)


def test_several_rows_per_subject_are_refused(
    owner_client: sdk.Client, ds_client: sdk.Client, sqlite_only: None
) -> None:
    owner_client.upload_dataset(
        "visits",
        {"patient": np.array([1, 1, 2, 3]), "cost": np.array([1.0, 2.0, 3.0, 4.0])},
        bounds={"cost": (0, 10)},
        subject_id="patient",
    )
    with pytest.raises(sdk.InvalidRequestError, match="rows per subject"):
        ds_client.dataset("visits").synthesize(epsilon=1.0, delta=1e-6)
    assert ds_client.ledger() == []


def test_the_docs_example_runs(
    survey: sdk.DatasetHandle, ds_client: sdk.Client, sqlite_only: None
) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "synthetic.md").read_text()
    first, explore, job, _mock = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    namespace: dict[str, object] = {"ds": survey}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(first, "docs/synthetic.md", "exec"), namespace)  # the repository's docs
    frame = namespace["frame"]
    assert len(frame) == N and "'method': 'mst'" in out.getvalue()  # type: ignore[arg-type]
    exec(compile(explore, "docs/synthetic.md", "exec"), namespace)  # the same code, twice
    older = frame[frame["age"] > 50]["bmi"].sum()  # type: ignore[index]
    assert float(namespace["exact"]) == pytest.approx(older)  # type: ignore[arg-type]
    assert namespace["noised"].receipt.ledger_id is not None  # type: ignore[attr-defined]
    exec(compile(job, "docs/synthetic.md", "exec"), namespace)  # the job's example
    assert isinstance(namespace["job"], sdk.SynthesisJob)
    assert namespace["copy"].synthetic["method"] == "aim"  # type: ignore[attr-defined]
    assert len(ds_client.ledger()) == 3  # the two copies and the real publish


def test_a_node_without_the_estimator_refuses_mst_before_charging_and_runs_aim(
    survey: sdk.DatasetHandle,
    ds_client: sdk.Client,
    owner_client: sdk.Client,
    monkeypatch: pytest.MonkeyPatch,
    sqlite_only: None,
) -> None:
    monkeypatch.setattr(synthesis_methods, "ESTIMATOR", "a_package_this_node_does_not_have")
    with pytest.raises(sdk.EvaluationUnavailableError, match="dpnode\\[synth\\]"):
        survey.synthesize(epsilon=1.0, delta=1e-6)
    _nothing_happened(ds_client, owner_client)
    # AIM estimates in NumPy: it runs there, charged once
    copy = survey.synthesize(epsilon=2.0, delta=1e-6, method="aim", columns=["smoker", "cough"])
    assert copy.synthetic is not None and copy.synthetic["method"] == "aim"
    assert len(ds_client.ledger()) == 1


def test_an_aim_copy_is_charged_once_at_its_total_and_reports_what_it_measured(
    survey: sdk.DatasetHandle, ds_client: sdk.Client, owner_client: sdk.Client, sqlite_only: None
) -> None:
    with pytest.raises(sdk.BudgetExceededError, match="budget"):  # before any computation
        survey.synthesize(epsilon=50.0, delta=1e-6, method="aim", columns=["smoker", "cough"])
    _nothing_happened(ds_client, owner_client)
    asked = {"epsilon": 6.0, "delta": 1e-6, "method": "aim", "seed": 3}
    asked |= {"columns": ["region", "smoker", "cough"], "idempotency_key": "aim-1"}
    copy = survey.synthesize(**asked)  # type: ignore[call-overload]
    again = survey.synthesize(**asked)  # type: ignore[call-overload]
    assert again.id == copy.id and again.receipt == copy.receipt
    receipt = copy.receipt
    assert receipt is not None and receipt["mechanism"] == "aim"
    (line,) = ds_client.ledger()  # one line for the whole run, at its total
    assert receipt["ledger_id"] == line.entries[0].id
    assert receipt["epsilon"] == pytest.approx(ds_client.budget().spent_epsilon, abs=1e-8)
    # the free utility report: the domain, the rounds, each measured column set's noise
    assert receipt["domain_size"] == 3 * 2 * 2
    assert 1 <= receipt["rounds"] <= receipt["rounds_planned"]
    measured = receipt["measured"]
    assert [m["columns"] for m in measured[:3]] == [["region"], ["smoker"], ["cough"]]
    assert len(measured) == 3 + receipt["rounds"] and all(m["sigma"] > 0 for m in measured)
    assert receipt["selection_epsilon"] == pytest.approx(
        sum(m["selection_epsilon"] for m in measured)
    )
    assert copy.synthetic is not None and copy.synthetic["method"] == "aim"
    assert copy.synthetic["measured"] == measured and "seed" not in copy.synthetic
    frame = copy.download().to_pandas()
    assert len(frame) == N and set(frame.columns) == {"region", "smoker", "cough"}
    assert float((frame["smoker"] == frame["cough"]).mean()) > 0.7  # the relation survives

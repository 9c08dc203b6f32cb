"""A data owner's synthetic mock: a dataset's mock made a differentially private synthetic
table, paid from the dataset's cap.

A mock is what data scientists dry-run their code on (``ds.mock()``); one the owner uploads
keeps the columns but none of their relations. Here the node synthesizes it from the real
values instead (MST or AIM, as :mod:`dpnode.node.services.synthesis` does for a copy), and
it replaces the mock: the same columns, dtypes and bounds, the run's provenance beside it
(``Dataset.mock_provenance``: method, epsilon, delta, rows, ledger row, when).

Who pays: the mock is a release to every data scientist, made by the dataset's owner for
them all, so it is paid from what the policy promises the dataset's subjects, its cap
(``[datasets.NAME]``), and not from the owner's own budget: one ledger row, the owner's,
marked ``cap_only`` (:func:`dpnode.policies.decide_cap` decides it on the caps alone). A
dataset without a cap has nothing to pay from and is refused. The order of events is a
synthesis's: everything refused before any value is read and with nothing charged, the
charge (under the budget mark, like any other), then the run as a job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from sqlalchemy import select

from dpnode.core.errors import InvalidRequestError, NotFoundError
from dpnode.node.context import NodeContext
from dpnode.node.db.base import utcnow
from dpnode.node.db.models import Dataset, DatasetColumn
from dpnode.node.services import (
    audit,
    blobs,
    budget_status,
    charge_rows,
    dataset_budgets,
    datasets,
    idempotency,
    synthesis,
    synthesis_methods,
    users,
)
from dpnode.node.services.catalog import require_owner, require_uploader
from dpnode.node.services.synthesis import Replayed, Started, SynthesisRequest
from dpnode.node.services.synthesis_jobs import Reporter
from dpnode.node.storage import array_to_bytes

__all__ = ["mock_public", "synthesize_mock"]

#: How :func:`synthesis.request_hash` names a mock's request under an idempotency key.
_WHAT = "synthesize_mock"


def mock_public(dataset: Dataset) -> dict[str, Any] | None:
    """A mock's provenance as the catalog shows it (``None``: uploaded by its owner, or no
    mock)."""
    return None if dataset.mock_row_count is None else dataset.mock_provenance


def _plan(
    context: NodeContext, actor_id: int, ref: int | str, request: SynthesisRequest
) -> tuple[Dataset, synthesis_methods.Plan, int]:
    synthesis_methods.check_estimator(request.method)
    with context.read_sessions() as session:
        actor = users.active(session, actor_id)
        source = datasets.get_dataset(session, ref)
        require_uploader(actor, "synthetic mock")
        require_owner(actor, source.owner_id, f"dataset {source.name!r}")
        if source.provenance is not None:
            raise InvalidRequestError(
                f"dataset {source.name!r} is itself synthetic (from "
                f"{source.provenance.get('source')!r}): download it instead, or give its "
                "source a synthetic mock"
            )
        shaped = [c for c in source.columns if c.row_shape]
        if shaped:
            raise InvalidRequestError(
                f"column {shaped[0].name!r} holds a {list(shaped[0].row_shape)} array per row; "
                "a synthetic mock has one value per cell and every column of the data: "
                "upload a mock for this dataset instead (upload_dataset(..., mock=...))"
            )
        plan, rows = synthesis.plan_for(context.settings, source, request)
        session.expunge_all()
    return source, plan, rows


def synthesize_mock(
    context: NodeContext,
    actor_id: int,
    ref: int | str,
    request: SynthesisRequest,
    answer: Callable[[Dataset, dict[str, Any]], dict[str, Any]],
    key: str | None = None,
) -> Started | Replayed:
    """Charge a synthetic mock of dataset ``ref`` to the dataset's cap and start computing it
    as a job, whose answer is ``answer`` of the dataset (its mock replaced) and the receipt.
    ``request`` names no columns (a mock has them all), no name and no seed.

    ``key``: the request's idempotency key, as for a synthesis.

    Raises (each before any private value is read, nothing charged):
        AuthenticationError: the account no longer exists or was deactivated.
        NotFoundError: no such dataset.
        PermissionDeniedError: the caller neither owns the dataset nor is an admin.
        InvalidRequestError: a bad epsilon, delta, rows, method or bins; a dataset with
            several rows per subject, or a synthetic one.
        QuotaExceededError: the domain is too large for the node's memory quota.
        EvaluationUnavailableError: the node is installed without ``mbi``.
        PolicyRefusedError: the policy sets no cap on the dataset (rule ``datasets.NAME``).
        BudgetExceededError: the mock does not fit what is left of the cap.
        ConflictError, PublishInProgressError, PublishLostError: as for a synthesis's key.
    """
    claim = None
    if key is not None:
        claim = idempotency.Claim(
            idempotency.check_key(key), synthesis.request_hash(ref, request, _WHAT)
        )
        stored = synthesis.replay(context, actor_id, claim)
        if stored is not None:
            return Replayed(stored)
    source, plan, rows = _plan(context, actor_id, ref, request)
    cost = synthesis.cost_of(plan, request, source)
    cost = replace(cost, cap_only=True, detail={**cost.detail, "mock": True})

    def work(entry: charge_rows.Charged, _: budget_status.Status, report: Reporter) -> Any:
        arrays, sampled = synthesis.sample(context, source, plan, request, rows, report)
        provenance = {
            "method": request.method,
            "epsilon": plan.epsilon,
            "delta": plan.delta,
            "rows": rows,
            "ledger_id": entry.id,
            "paid_from": "cap",
            "at": utcnow().isoformat(),
        }
        dataset = _replace_mock(context, actor_id, source, arrays, provenance)
        return answer(dataset, _receipt(context, entry, dataset, plan, sampled))

    return synthesis.start(context, actor_id, source, cost, claim, work)


def _receipt(
    context: NodeContext,
    entry: charge_rows.Charged,
    dataset: Dataset,
    plan: synthesis_methods.Plan,
    sampled: synthesis_methods.Sampled,
) -> dict[str, Any]:
    """What the mock cost and what is left of the cap after it (the owner's budget is not
    touched), with the run's utility report."""
    with context.read_sessions() as session:
        cap = dataset_budgets.budgets_of(session, context.settings, {dataset.id: dataset.name})
    left = cap[dataset.id]
    return {
        "ledger_id": entry.id,
        "mechanism": entry.mechanism,
        "paid_from": "cap",
        "asked_epsilon": plan.epsilon,
        "asked_delta": plan.delta,
        "cap_epsilon": left.epsilon,
        "cap_epsilon_used": left.epsilon_used,
        "cap_epsilon_remaining": left.epsilon_remaining,
        "cap_delta_used": left.delta_used,
        **sampled.report,
    }


def _replace_mock(
    context: NodeContext,
    actor_id: int,
    source: Dataset,
    arrays: list[Any],
    provenance: dict[str, Any],
) -> Dataset:
    """Store ``arrays`` (one per column, in the dataset's order) as the dataset's mock, with
    ``provenance``, audited; the old mock's blobs are released once nothing uses them."""
    names = [c.name for c in source.columns]
    staged = blobs.stage(
        context.store, ((array_to_bytes(np.ascontiguousarray(a)),) for a in arrays)
    )
    old: list[str | None] = []

    def check() -> None:
        # Locked, and read again: the dataset may have been deleted while the job ran.
        found = session.scalar(select(Dataset.id).where(Dataset.id == source.id).with_for_update())
        if found is None:
            raise NotFoundError(
                f"dataset {source.name!r} was deleted while its synthetic mock was computed; "
                "the charge stands"
            )

    def register(_: None, digests: list[str]) -> Dataset:
        columns = session.scalars(
            select(DatasetColumn)
            .where(DatasetColumn.dataset_id == source.id)
            .order_by(DatasetColumn.position)
        ).all()
        assert [c.name for c in columns] == names  # a dataset's columns never change
        for column, digest in zip(columns, digests, strict=True):
            old.append(column.mock_blob)
            column.mock_blob = digest
        dataset = session.get_one(Dataset, source.id)
        was = dataset.mock_provenance if dataset.mock_row_count is not None else None
        dataset.mock_row_count = int(arrays[0].shape[0])
        dataset.mock_provenance = provenance
        audit.record(
            session,
            users.active(session, actor_id),
            "dataset.mock_synthesize",
            target_type="dataset",
            target_id=source.id,
            name=source.name,
            replaced="none" if not any(old) else ("synthetic" if was else "uploaded"),
            **provenance,
        )
        session.commit()
        return datasets.get_dataset(session, source.id)

    with context.sessions() as session:
        blobs.register_with(session, context.store, staged, check, register)
        blobs.release(session, context.store, old)  # those no row names any more
        return datasets.get_dataset(session, source.id)

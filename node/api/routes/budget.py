from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from node.api.deps import CurrentUser, SessionDep, SettingsDep
from node.api.schemas import BudgetPublic, LedgerEntryPublic
from node.db.models import LedgerEntry, Role
from node.errors import PermissionDeniedError
from node.services import budget
from node.services.budget import EPSILON_UNIT, RHO_UNIT, TV_UNIT, Budget

router = APIRouter(tags=["budget"])


def budget_public(b: Budget) -> BudgetPublic:
    spent_epsilon, spent_delta = b.spent()
    return BudgetPublic(
        epsilon=b.epsilon,
        delta=b.delta,
        spent_epsilon=spent_epsilon,
        spent_delta=spent_delta,
        remaining_epsilon=b.remaining_epsilon,
        pure_epsilon=float(b.spent_epsilon_units * EPSILON_UNIT),
        rho=float(b.spent_rho_units * RHO_UNIT),
        sampler_tv=float(b.spent_tv_units * TV_UNIT),
    )


def ledger_public(e: LedgerEntry) -> LedgerEntryPublic:
    return LedgerEntryPublic(
        id=e.id,
        at=e.at,
        user_id=e.user_id,
        mechanism=e.mechanism,
        epsilon=float(e.epsilon_units * EPSILON_UNIT),
        rho=float(e.rho_units * RHO_UNIT),
        sampler_tv=float(e.tv_units * TV_UNIT),
        dataset_ids=e.dataset_ids,
        graph_hash=e.graph_hash,
        detail=e.detail,
    )


def _subject(user: CurrentUser, user_id: int | None) -> int:
    if user_id is None or user_id == user.id:
        return user.id
    if user.role is not Role.ADMIN:
        raise PermissionDeniedError("only admins may read another user's budget or ledger")
    return user_id


@router.get("/budget")
def get_budget(
    session: SessionDep, settings: SettingsDep, user: CurrentUser, user_id: int | None = None
) -> BudgetPublic:
    """Your privacy budget (admins: anyone's, with ``user_id``)."""
    return budget_public(budget.budget_of(session, settings, _subject(user, user_id)))


@router.get("/ledger")
def get_ledger(
    session: SessionDep,
    user: CurrentUser,
    user_id: int | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[LedgerEntryPublic]:
    """Your privacy charges, newest first (admins: anyone's, with ``user_id``)."""
    entries = budget.ledger_of(session, _subject(user, user_id), limit=limit)
    return [ledger_public(e) for e in entries]

"""The locks and reads that open a charging transaction, in the order every charge takes them.

A charge (``dpnode.node.services.budget.charge``) and a run's plan
(``dpnode.node.services.runs``) both begin by locking the user, then the datasets the release
reads, and reading under those locks the policy in force, the user's grants and their ledger
total. The statements are built once: the charge is on every publish's path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.orm import Session

from dpnode import policies
from dpnode.core.errors import AuthenticationError
from dpnode.node.db.direct import Direct, connection_of
from dpnode.node.db.models import User
from dpnode.node.services import policy as policy_service
from dpnode.node.services import users
from dpnode.node.services.ledger_sums import (
    _DATASETS,
    _GRANTS,
    _TOTALS,
    Account,
    _total,
    policy_user,
)
from dpnode.node.services.policy import InForce

__all__ = ["Locked", "lock"]

_USERS = User.__table__
#: The account as a charge needs it (a plain row: no ORM object is built).
_USER = select(_USERS.c.id, _USERS.c.email, _USERS.c.role, _USERS.c.is_active).where(
    _USERS.c.id == bindparam("user_id")
)
_USER_DATASETS = (
    select(_DATASETS.c.id, _DATASETS.c.name)
    .where(_DATASETS.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(_DATASETS.c.id)
)
#: The same for one dataset, the usual case (an expanding IN is rendered anew on each call).
_USER_DATASET = select(_DATASETS.c.id, _DATASETS.c.name).where(_DATASETS.c.id == bindparam("id"))
#: The same, locking the rows on PostgreSQL (see :func:`lock`); the account's on the cursor.
_LOCK_USER = Direct(_USER.with_for_update(key_share=True))
_LOCK_DATASETS = _USER_DATASETS.with_for_update(key_share=True)
_LOCK_DATASET = _USER_DATASET.with_for_update(key_share=True)
#: One dataset's, run on the cursor (:class:`Direct`), by PostgreSQL; several datasets' (an
#: expanding IN), by PostgreSQL.
_DATASET_QUERY = {False: Direct(_USER_DATASET), True: Direct(_LOCK_DATASET)}
_DATASETS_QUERY = {False: _USER_DATASETS, True: _LOCK_DATASETS}


def _of_user(column: Any) -> Any:
    return select(column).where(_TOTALS.c.user_id == bindparam("user_id")).scalar_subquery()


#: What a charge reads after the lock (see :func:`lock`): the policy revision in force, the
#: user's ledger total (NULLs: no row) and whether any budget was granted to them.
_STATE = (
    *policy_service.NEWEST,
    *(_of_user(_TOTALS.c[k]) for k in ("epsilon_units", "rho_units", "tv_units", "newest_at")),
    select(_GRANTS.c.id).where(_GRANTS.c.user_id == bindparam("user_id")).exists(),
)
_READ_STATE = Direct(select(*_STATE))
#: SQLite: the account and the state in one statement (BEGIN IMMEDIATE serialised it all).
_USER_STATE = Direct(_USER.add_columns(*_STATE))


@dataclass(frozen=True)
class Locked:
    """What a charging transaction reads first, under the user's lock (:func:`lock`)."""

    user: Account
    #: the name of each dataset found, by id
    found: dict[int, str]
    in_force: InForce
    #: the user as the policies see it, with their grants
    puser: policies.User
    #: the user's ledger total, for ``ledger_sums._load``
    total: tuple[int, int, int, datetime | None]


def lock(on: Session | Connection, user_id: int, dataset_ids: Sequence[int]) -> Locked:
    """Lock the user, then the datasets in id order (PostgreSQL; SQLite's BEGIN IMMEDIATE has
    already serialised the whole transaction). Every publish takes its locks in this order,
    so two publishes cannot wait on each other in a cycle. ``FOR NO KEY UPDATE`` serialises
    charges as ``FOR UPDATE`` would, without blocking rows that merely reference the user or
    the dataset (an audit line, a login) meanwhile.

    Then reads the policy in force, the user's grants and ledger total: on PostgreSQL in a
    statement of their own after the lock, whose snapshot has every charge committed before
    the lock was granted (read in the locking statement, they would be as of before its wait:
    a charge committed meanwhile would be missed); on SQLite with the account.

    Raises:
        AuthenticationError: the account no longer exists or was deactivated (whoever asks
            for a charge holds a token for it).
    """
    connection = connection_of(on)
    values = {"user_id": user_id}
    postgres = connection.dialect.name != "sqlite"
    rows = (_LOCK_USER if postgres else _USER_STATE).execute(connection, values)
    if not rows or not rows[0][3]:  # a publish comes with a token: its account is gone
        raise AuthenticationError(users.GONE)
    row = rows[0]
    state: Sequence[Any] = _READ_STATE.execute(connection, values)[0] if postgres else row[4:]
    user = Account(*row[:3])
    found: dict[int, str] = {}
    ids = sorted(set(dataset_ids))
    if len(ids) == 1:
        found = dict(_DATASET_QUERY[postgres].execute(connection, {"id": ids[0]}))
    elif ids:
        several = connection.execute(_DATASETS_QUERY[postgres], {"ids": ids}).all()
        found = {int(ident): str(name) for ident, name in several}
    in_force = policy_service.in_force(connection, (state[0], state[1]))
    puser = policy_user(connection, user, granted=bool(state[6]))
    return Locked(user, found, in_force, puser, _total(state[2:6]))

"""The rows a charge writes and the transaction it writes them in.

The charge (``dpnode.node.services.budget.charge``) is on every publish's path, so its rows
(the ledger row, the datasets it read) are plain INSERTs built once, and its transaction runs
on a bare connection: an ORM session, whose work around a transaction costs more than the
charge's statements, joins it only on the rare paths that need one (:class:`Transaction`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert
from sqlalchemy.orm import Session

from dpnode.node.db.base import table_of
from dpnode.node.db.direct import Direct
from dpnode.node.db.models import LedgerEntryDataset
from dpnode.node.db.session import sync_wal
from dpnode.node.services.ledger_sums import _LEDGER

__all__ = ["INSERT_LEDGER", "INSERT_READS", "Charged", "Transaction"]


@dataclass(frozen=True)
class Charged:
    """The ledger row ``budget.charge`` wrote, as it wrote it (a ``ledger_entries`` row)."""

    id: int
    at: datetime
    user_id: int
    mechanism: str
    epsilon_units: int
    rho_units: int
    tv_units: int
    dataset_ids: list[int]
    graph_hash: str | None
    detail: dict[str, Any]
    policy_revision: int | None
    #: the planned training run it is a step of (``None``: a publish of its own)
    run_id: int | None = None
    #: paid from the caps of the datasets it read alone, not from the user's budget
    cap_only: bool = False


#: The rows of a charge: every column given (``Direct`` computes no Python default), the
#: ledger row's as :class:`Charged` holds them.
INSERT_LEDGER = Direct(
    insert(_LEDGER).returning(_LEDGER.c.id), [f.name for f in fields(Charged) if f.name != "id"]
)
INSERT_READS = Direct(
    insert(table_of(LedgerEntryDataset)), ("ledger_id", "dataset_id", "dataset_name")
)


class Transaction:
    """A charge's transaction on ``connection``, with an ORM session joined to it for the rare
    paths that need one (approvals, a refusal's audit line), made on first use. The session
    never commits or closes the transaction (a rollback does roll it back): :meth:`commit`
    writes what it holds, then commits."""

    def __init__(self, connection: Connection, *, relaxed: bool = False) -> None:
        self.connection = connection
        #: begun with ``synchronous=NORMAL`` (see ``budget.charge``): only a commit the budget
        #: mark covers may skip the disk
        self.relaxed = relaxed
        self._session: Session | None = None

    @property
    def session(self) -> Session:
        """The ORM session joined to the transaction, made on first use."""
        if self._session is None:
            self._session = Session(
                self.connection, join_transaction_mode="rollback_only", expire_on_commit=False
            )
        return self._session

    def commit(self, *, covered: bool = False) -> None:
        """Commit; durably unless ``covered`` (the budget mark holds the charge)."""
        if self._session is not None:
            self._session.flush()
        self.connection.commit()
        if self.relaxed and not covered:
            sync_wal(self.connection)

"""The spending mark: a record of privacy spending kept outside the database, which only grows.

Restoring an older backup of the database (or rolling an upgrade back) would otherwise hand
every user back what they spent since. The mark is a file in the node's data directory
(``DPNODE_BUDGET_MARK_FILE``) holding, for each user and each dataset name, spending the
ledger must not fall below, and the ledger's newest row id. Before a process serves its first
publish it compares the database with the mark (:meth:`SpendingMark.verify`); while the
database is behind, publishes are refused (``503 budget_mark_behind``) until an admin runs
``dpnode budget carry-forward`` (``dpnode.node.services.carry_forward``).

Writing the mark durably (an fsync) on every charge would make it the publish's slowest step.
Instead each process *reserves* spending in chunks (a lease, ``DPNODE_BUDGET_MARK_
RESERVE_*``): the file says "up to this much may have been released", and the process charges
from its lease in memory, writing the file only when a charge does not fit what is left. The
mark is ``settled`` (spending known committed) plus every live lease. Each time a process takes
a reservation, and when it stops cleanly (:meth:`SpendingMark.close`), what it charged moves
from its lease into ``settled``, so that a lease holds only what is left of it and what is in
flight. A process that stopped without returning its lease (killed, crashed) leaves the mark
unable to tell its unused reservation from spending a restore removed, so its users and
datasets count as behind, and carry-forward counts that reservation, at most one
reservation per key (:func:`dpnode.node.services.mark_file.spare`), as spent (docs/privacy.md).

Every process holds an exclusive ``flock`` on a file of its own in ``<mark>.leases/`` for its
lifetime, which says its lease is live; read-modify-writes of the mark take ``<mark>.lock``.
The file is replaced atomically (write a temporary file, fsync, rename, fsync the directory).
"""

from __future__ import annotations

import fcntl
import os
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, func, select

from dpnode.core.errors import BudgetMarkBehindError, BudgetMarkError
from dpnode.node.db.base import table_of
from dpnode.node.db.models import LedgerEntry, LedgerEntryDataset, LedgerTotal
from dpnode.node.db.session import sync_wal
from dpnode.node.services.costs import DELTA_UNIT, EPSILON_UNIT, RHO_UNIT, units_up
from dpnode.node.services.mark_file import (
    CARRY_FORWARD,
    FORMAT,
    ZERO,
    Amount,
    MarkState,
    Room,
    add,
    at_least,
    dataset_key,
    fits,
    fix,
    lease_dir,
    live_leases,
    locked,
    read_state,
    spare,
    sub,
    user_key,
    write_state,
)
from dpnode.node.settings import Settings

__all__ = [
    "CARRY_FORWARD",
    "FORMAT",
    "Amount",
    "Gap",
    "MarkState",
    "Room",
    "SpendingMark",
    "Totals",
    "dataset_key",
    "describe",
    "find_gap",
    "live_leases",
    "locked",
    "read_state",
    "read_totals",
    "spare",
    "user_key",
    "write_state",
]


@dataclass(frozen=True)
class Totals:
    """What the database holds: lifetime spending by key and the newest ledger row id."""

    amounts: dict[str, Amount]
    sequence: int


_LEDGER = table_of(LedgerEntry)
_READS = table_of(LedgerEntryDataset)
_TOTALS = table_of(LedgerTotal)


def read_totals(connection: Connection) -> Totals:
    """Every user's and dataset name's lifetime spending, and the newest ledger row id.

    Reads the whole ledger index of dataset reads: done when a process starts and by
    carry-forward, never on a publish's path.
    """
    amounts: dict[str, Amount] = {}
    users = select(_TOTALS.c.user_id, _TOTALS.c.epsilon_units, _TOTALS.c.rho_units)
    for user_id, e, r, d in connection.execute(users.add_columns(_TOTALS.c.tv_units)):
        amounts[user_key(int(user_id))] = (int(e), int(r), int(d))
    sums = [func.sum(_LEDGER.c[c]) for c in ("epsilon_units", "rho_units", "tv_units")]
    by_name = (
        select(_READS.c.dataset_name, *sums)
        .join(_LEDGER, _LEDGER.c.id == _READS.c.ledger_id)
        .where(_READS.c.dataset_name.is_not(None))
        .group_by(_READS.c.dataset_name)
    )
    for name, e, r, d in connection.execute(by_name):
        amounts[dataset_key(str(name))] = (int(e), int(r), int(d))
    newest = connection.scalar(select(func.max(_LEDGER.c.id)))
    return Totals(amounts, int(newest or 0))


def describe(amount: Amount) -> str:
    """Spending in words.

    >>> describe((1_250_000_000, 0, 2))
    'epsilon 1.25, rho 0, delta 2e-18'
    """
    e, r, d = (
        float(n * u) for n, u in zip(amount, (EPSILON_UNIT, RHO_UNIT, DELTA_UNIT), strict=True)
    )
    return f"epsilon {e:.9g}, rho {r:.9g}, delta {d:.3g}"


@dataclass(frozen=True)
class Gap:
    """How far the database is behind the mark: what to carry forward, by key, and why."""

    #: spending to carry forward, by key (the mark's ceiling less the database)
    missing: dict[str, Amount]
    #: the newest ledger row id the mark knows of, and the database's
    sequence: tuple[int, int]
    #: leases of processes that stopped without returning them
    stale: list[str]

    @property
    def behind(self) -> bool:
        return bool(self.missing) or self.sequence[1] < self.sequence[0] or bool(self.stale)

    def describe(self) -> str:
        """The gap in words, for the refusal and the command line."""
        parts: list[str] = []
        if self.sequence[1] < self.sequence[0]:
            parts.append(
                f"the ledger ends at row {self.sequence[1]} but row {self.sequence[0]} "
                "was committed (a restored backup or a rolled-back upgrade)"
            )
        if self.stale:
            parts.append(
                f"{len(self.stale)} node process(es) stopped without returning their "
                "reservation (their unused part counts as spent)"
            )
        if self.missing:
            shown = ", ".join(f"{k} ({describe(v)})" for k, v in sorted(self.missing.items())[:5])
            more = len(self.missing) - 5
            parts.append("missing spending: " + shown + (f" and {more} more" if more > 0 else ""))
        return "; ".join(parts)


def find_gap(state: MarkState, totals: Totals, live: set[str]) -> Gap:
    """Compare the database with the mark. A key is behind when the database holds less than
    ``settled`` or a stopped process's lease names it; what it misses is then everything the
    mark allows for it (its ceiling, live leases included: they may have charged already)."""
    stale = sorted(t for t in state.leases if t not in live)
    suspect = {k for t in stale for k, v in state.leases[t].items() if v != ZERO}
    missing: dict[str, Amount] = {}
    for key in state.all_keys():
        held = totals.amounts.get(key, ZERO)
        if key in suspect or not fits(state.settled.get(key, ZERO), held):
            lacking = at_least(sub(state.ceiling(key), held), ZERO)
            if lacking != ZERO:
                missing[key] = lacking
    return Gap(missing, (state.sequence, totals.sequence), stale)


class SpendingMark:
    """This process's view of the mark: its lease, charged from in memory (see the module).

    Thread-safe: charges of several users run at once on PostgreSQL.
    """

    def __init__(self, path: Path, chunk: Amount) -> None:
        self.path = path
        self.chunk = chunk
        self.token = secrets.token_hex(8)
        self._lock = threading.Lock()
        self._verified = False
        #: by key: what this process's lease holds in the mark (``taken``), which is what it
        #: has left to charge, charges in flight (``pending``) and charges committed since
        #: the lease was last settled (``used``)
        self._taken: dict[str, Amount] = {}
        self._left: dict[str, Amount] = {}
        self._pending: dict[str, Amount] = {}
        self._used: dict[str, Amount] = {}
        #: by key: what its last reservation took beyond its charge (see :func:`spare`)
        self._spare: dict[str, Amount] = {}
        self._lease_fd: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> SpendingMark:
        chunk = (
            units_up(settings.budget_mark_reserve_epsilon, EPSILON_UNIT, "reserve epsilon"),
            units_up(settings.budget_mark_reserve_rho, RHO_UNIT, "reserve rho"),
            units_up(settings.budget_mark_reserve_delta, DELTA_UNIT, "reserve delta"),
        )
        return cls(settings.budget_mark_path, chunk)

    def _hold_lease_file(self) -> None:
        """Lock this process's lease file, which says its lease is live (see the module)."""
        if self._lease_fd is None:
            folder = lease_dir(self.path)
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / self.token, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lease_fd = fd

    def verify(self, connection: Connection) -> None:
        """Check the database holds at least the mark; a fresh node (no mark, an empty
        ledger) starts one. Once it passed, a process does not check again.

        Raises:
            BudgetMarkBehindError: the database is behind: publishes are refused.
            BudgetMarkError: the mark is missing (with spending in the ledger) or corrupt.
        """
        with self._lock:
            if not self._verified:
                self._verify(connection)

    def _verify(self, connection: Connection) -> None:
        self._hold_lease_file()
        with locked(self.path):
            state = read_state(self.path)
            totals = read_totals(connection)
            if state is None:
                if totals.sequence:
                    raise BudgetMarkError(
                        f"the budget mark {self.path} is missing while the ledger holds "
                        f"{totals.sequence} rows: {fix(self.path)}"
                    )
                state = MarkState()
            live = live_leases(self.path)
            if (state.verified & live) - {self.token}:
                # A process that verified the database and served since is still running: no
                # restore can have happened meanwhile (``dpnode restore`` refuses while one
                # runs), so a killed process's reservation is only that; kept as forfeited.
                # Its charges may have committed without an fsync (``ledger_fsync``): synced
                # first, so that a power loss cannot take them back once nothing marks them.
                killed = [t for t in state.leases if t not in live]
                if killed:
                    sync_wal(connection)
                for token in killed:
                    state.forfeit(token)
            gap = find_gap(state, totals, live)
            if gap.behind:
                raise BudgetMarkBehindError(
                    "publishing is stopped: the database holds less privacy spending than the "
                    f"node's budget mark ({gap.describe()}); an admin must run "
                    f"`{CARRY_FORWARD}`, which records the missing spending in the ledger; "
                    "nothing was charged"
                )
            state.verified = (state.verified & live) | {self.token}
            write_state(self.path, state)
        self._verified = True

    def reserve(
        self,
        connection: Connection,
        keys: Iterable[str],
        amount: Amount,
        *,
        room: Room = (None, None, None),
    ) -> None:
        """Make sure the mark covers ``amount`` more spending under each of ``keys``, before
        the charge commits; then :meth:`committed` or :meth:`rolled_back` says how it went.

        When it writes the mark it reserves :func:`spare` beyond ``amount`` (``room``: what
        the user may still spend after this charge, by component; ``None``: unknown), and
        uses what was left of the previous reservation, so that a crash never counts more
        than the user could have spent.

        Raises:
            BudgetMarkBehindError, BudgetMarkError: as :meth:`verify`, or the mark cannot be
                written; the caller rolls the charge back.
        """
        wanted = list(keys)
        with self._lock:
            if not self._verified:
                self._verify(connection)
            if any(not fits(amount, self._left.get(k, ZERO)) for k in wanted):
                self._take(wanted, amount, room)
            for key in wanted:
                self._left[key] = sub(self._left[key], amount)
                self._pending[key] = add(self._pending.get(key, ZERO), amount)

    def committed(self, keys: Iterable[str], amount: Amount) -> None:
        """The charge :meth:`reserve` covered committed: its amount is spent."""
        with self._lock:
            for key in keys:
                self._pending[key] = sub(self._pending[key], amount)
                self._used[key] = add(self._used.get(key, ZERO), amount)

    def rolled_back(self, keys: Iterable[str], amount: Amount) -> None:
        """The charge :meth:`reserve` covered did not commit: its reservation is free again."""
        with self._lock:
            for key in keys:
                self._pending[key] = sub(self._pending[key], amount)
                self._left[key] = add(self._left.get(key, ZERO), amount)

    def _settle_into(self, state: MarkState) -> None:
        """Move what this process charged (committed) from its lease into ``settled``, so
        that a lease never holds more than what it has left and has in flight."""
        taken = state.leases.pop(self.token, {})
        if taken != self._taken:  # the mark was adopted anew meanwhile: nothing of ours in it
            self._left, self._used = {}, {}
        for key, used in self._used.items():
            state.settled[key] = add(state.settled.get(key, ZERO), used)
        self._used = {}
        self._taken = {
            k: add(self._left.get(k, ZERO), self._pending.get(k, ZERO))
            for k in set(self._left) | set(self._pending)
        }

    def _take(self, wanted: list[str], amount: Amount, room: Room) -> None:
        try:
            with locked(self.path):
                state = read_state(self.path)
                if state is None:
                    raise BudgetMarkError(
                        f"the budget mark {self.path} disappeared while the node ran: "
                        f"{fix(self.path)}"
                    )
                self._settle_into(state)
                for key in wanted:
                    left = self._left.get(key, ZERO)
                    if not fits(amount, left):
                        extra = spare(amount, self.chunk, room, self._spare.get(key, ZERO))
                        more = add(at_least(sub(amount, left), ZERO), extra)
                        self._spare[key] = extra
                        self._left[key] = add(left, more)
                        self._taken[key] = add(self._taken.get(key, ZERO), more)
                state.leases[self.token] = {k: v for k, v in self._taken.items() if v != ZERO}
                self._taken = dict(state.leases[self.token])
                write_state(self.path, state)
        except OSError as exc:
            raise BudgetMarkError(
                f"the budget mark {self.path} cannot be written ({exc}); nothing was charged"
            ) from None

    def close(self) -> None:
        """Return this process's lease at a clean stop: what it charged goes into ``settled``,
        what it had left is released."""
        with self._lock:
            try:
                if self._taken or self._verified:
                    with locked(self.path):
                        state = read_state(self.path)
                        if state is not None:
                            self._settle_into(state)
                            state.leases.pop(self.token, None)
                            state.verified.discard(self.token)
                            write_state(self.path, state)
                    self._taken, self._left, self._verified = {}, {}, False
            except (OSError, BudgetMarkError):
                pass  # the lease stays in the mark: it counts as spent (see the module)
            finally:
                if self._lease_fd is not None:
                    lease_dir(self.path).joinpath(self.token).unlink(missing_ok=True)
                    os.close(self._lease_fd)
                    self._lease_fd = None

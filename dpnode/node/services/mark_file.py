"""The budget mark's file: its content, read and written atomically, its lock, and the lease
files that say which node processes are running (``dpnode.node.services.spending_mark``)."""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpnode.core.errors import BudgetMarkError

__all__ = [
    "CARRY_FORWARD",
    "FORMAT",
    "GROWTH",
    "ZERO",
    "Amount",
    "MarkState",
    "Room",
    "add",
    "at_least",
    "dataset_key",
    "fits",
    "fix",
    "lease_dir",
    "live_leases",
    "locked",
    "read_state",
    "spare",
    "sub",
    "user_key",
    "write_state",
]

#: Spending in the ledger's whole units: (epsilon, rho, delta) as ``ledger_entries`` holds them.
Amount = tuple[int, int, int]
ZERO: Amount = (0, 0, 0)
FORMAT = "dpnode-budget-mark/1"
#: The command the node's refusals name.
CARRY_FORWARD = "dpnode budget carry-forward"


def user_key(user_id: int) -> str:
    """The mark's key for a user's lifetime spending.

    >>> user_key(7)
    'user:7'
    """
    return f"user:{user_id}"


def dataset_key(name: str) -> str:
    """The mark's key for a dataset's lifetime spending (by name, as caps count it).

    >>> dataset_key("diabetes")
    'dataset:diabetes'
    """
    return f"dataset:{name}"


def add(a: Amount, b: Amount) -> Amount:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def sub(a: Amount, b: Amount) -> Amount:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def at_least(a: Amount, b: Amount) -> Amount:
    return (max(a[0], b[0]), max(a[1], b[1]), max(a[2], b[2]))


def fits(a: Amount, b: Amount) -> bool:
    """Whether ``a`` is at most ``b`` in every component."""
    return a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2]


#: A reservation holds at least this many more charges like the one that needed it, and
#: twice what the key's last reservation held beyond its charge, within half of what the user
#: may still spend: a steady stream of charges writes the mark a number of times that grows
#: with the logarithm of their count (at epsilon 1 a publish, the default chunk of 0.5 alone
#: would write it on every publish).
GROWTH = 4
#: A component whose room is unknown.
Room = tuple[int | None, int | None, int | None]


def spare(amount: Amount, chunk: Amount, room: Room, last: Amount = ZERO) -> Amount:
    """What a reservation takes beyond ``amount``, by component.

    A component the charge does not spend takes nothing (a reservation a killed process left
    unused counts as spent). One it spends takes ``chunk``, or more: :data:`GROWTH` times the
    charge or twice ``last`` (the key's previous spare), at most half of ``room`` (what the
    user may still spend after the charge); never more than ``room``. A component whose room
    is ``None`` takes ``chunk``.

    >>> spare((10, 0, 2), (5, 5, 5), (1000, None, None))
    (40, 0, 5)
    >>> spare((10, 0, 2), (5, 5, 5), (1000, 0, 0), last=(300, 0, 0))
    (500, 0, 0)
    >>> spare((10, 0, 0), (50, 5, 5), (30, None, None))
    (30, 0, 0)
    """
    parts = []
    for a, c, r, b in zip(amount, chunk, room, last, strict=True):
        if not a:
            parts.append(0)
        elif r is None:
            parts.append(c)
        else:
            parts.append(min(max(c, min(max(GROWTH * a, 2 * b), r // 2)), max(r, 0)))
    return (parts[0], parts[1], parts[2])


@dataclass
class MarkState:
    """The mark file's content: spending known committed, leases taken since, the sequence."""

    #: the newest ledger row id known committed
    sequence: int = 0
    settled: dict[str, Amount] = field(default_factory=dict)
    #: reservations by process token: what each one took, by key
    leases: dict[str, dict[str, Amount]] = field(default_factory=dict)
    #: reservations of processes killed while a verified one served on (see
    #: :meth:`SpendingMark.verify`): possibly spent, kept until a carry-forward counts them
    forfeited: dict[str, Amount] = field(default_factory=dict)
    #: tokens of the processes that found the database not behind and serve publishes
    verified: set[str] = field(default_factory=set)

    def ceiling(self, key: str) -> Amount:
        """The most that may have been released under ``key``."""
        total = add(self.settled.get(key, ZERO), self.forfeited.get(key, ZERO))
        for taken in self.leases.values():
            total = add(total, taken.get(key, ZERO))
        return total

    def all_keys(self) -> set[str]:
        """Every key the mark holds."""
        found = set(self.settled) | set(self.forfeited)
        for taken in self.leases.values():
            found |= set(taken)
        return found

    def forfeit(self, token: str) -> None:
        """Keep a killed process's lease as possibly spent (its unused part cannot be told
        from spending), out of the leases."""
        for key, taken in self.leases.pop(token, {}).items():
            self.forfeited[key] = add(self.forfeited.get(key, ZERO), taken)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "sequence": self.sequence,
            "settled": {k: list(v) for k, v in sorted(self.settled.items())},
            "leases": {
                t: {k: list(v) for k, v in sorted(taken.items())}
                for t, taken in sorted(self.leases.items())
            },
            "forfeited": {k: list(v) for k, v in sorted(self.forfeited.items())},
            "verified": sorted(self.verified),
        }


def _amount(value: Any) -> Amount:
    if (
        not isinstance(value, list)
        or len(value) != 3
        or not all(type(v) is int and v >= 0 for v in value)
    ):
        raise ValueError(f"{value!r} is not three whole non-negative numbers")
    return (value[0], value[1], value[2])


def _parse(text: str) -> MarkState:
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} document")
    sequence = data.get("sequence")
    if type(sequence) is not int or sequence < 0:
        raise ValueError("its sequence is not a whole number")
    settled = {str(k): _amount(v) for k, v in dict(data["settled"]).items()}
    leases = {
        str(t): {str(k): _amount(v) for k, v in dict(taken).items()}
        for t, taken in dict(data["leases"]).items()
    }
    forfeited = {str(k): _amount(v) for k, v in dict(data.get("forfeited", {})).items()}
    verified = {str(t) for t in list(data.get("verified", []))}
    return MarkState(sequence, settled, leases, forfeited, verified)


def fix(path: Path) -> str:
    """How to resolve a missing or unreadable mark, for the error that says so."""
    return (
        f"restore {path} from where it is copied, or, if you are sure the database holds all "
        f"spending, adopt it as the mark: {CARRY_FORWARD} --new-mark --reason '...' (audited)"
    )


def read_state(path: Path) -> MarkState | None:
    """The mark at ``path``; ``None`` when there is no file.

    Raises:
        BudgetMarkError: the file cannot be read or is not a mark.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise BudgetMarkError(
            f"the budget mark {path} cannot be read ({exc}): {fix(path)}"
        ) from None
    try:
        return _parse(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise BudgetMarkError(f"the budget mark {path} is corrupt ({exc}): {fix(path)}") from None


def write_state(path: Path, state: MarkState) -> None:
    """Replace the mark at ``path`` atomically and durably (call under :func:`locked`)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    data = json.dumps(state.to_json(), indent=1).encode()
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the mark's read-modify-write lock (``<mark>.lock``), across processes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def lease_dir(path: Path) -> Path:
    return path.with_name(path.name + ".leases")


def live_leases(path: Path) -> set[str]:
    """The tokens of the processes using the mark now (each holds its lease file locked);
    removes the files of those that stopped."""
    live: set[str] = set()
    folder = lease_dir(path)
    if not folder.is_dir():
        return live
    for entry in folder.iterdir():
        try:
            fd = os.open(entry, os.O_RDWR)
        except FileNotFoundError:  # its process stopped meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            live.add(entry.name)
        else:
            entry.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return live

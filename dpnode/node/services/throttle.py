"""Throttles kept in memory: login attempts, and requests anyone may send without a login.

Logins: failed attempts per account, attempts per client address.

Every login attempt costs an Argon2 hash, so the throttle is consulted before the hash is
computed. It keeps two sliding windows in process memory:

- per account (the normalised email, known or not, so that the answer never reveals whether
  an account exists): at most ``login_max_failures`` failed attempts per
  ``login_failure_window_seconds``; a successful login clears the account's count;
- per client address: at most ``login_max_attempts_per_address`` attempts, failed or not,
  per ``login_address_window_seconds``.

The trade-off: memory rather than the database, so a refusal costs no I/O and an attacker
cannot make the node write rows at will; the price is that each worker process counts on
its own (a node with ``k`` workers allows up to ``k`` times the limits) and a restart forgets.
The tables are bounded (``max_keys`` per window, least recently used evicted first) and
entries older than their window are dropped as they are met.

An attempt is counted as a failure for its account when it is admitted, before the hash,
and forgiven if the password turns out right: concurrent guesses cannot all slip in under
the limit while their hashes run.

Public requests (:class:`RequestLimit`: a network's search and member list, which need no
login since the catalogs are public): at most so many per client address in a sliding
window, counted the same way, in the same memory and with the same per-process trade-off.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from dpnode.core.errors import RateLimitedError
from dpnode.node.settings import Settings

#: Keys kept per window before the least recently used are forgotten: a full table of
#: accounts at 10 failures each holds about 30 MB. Evicting a locked account takes this many
#: other keys touched since, which the per-address limit makes slow to produce.
MAX_KEYS = 50_000


class SlidingWindow:
    """Recent event times per key: at most ``limit`` events in any ``window`` seconds.

    Each key keeps its last ``limit`` times only, in a plain list (a deque costs several
    times the memory of a short list, and the table may hold ``max_keys`` of them).
    Not thread-safe on its own; :class:`LoginThrottle` holds the lock.

    >>> w = SlidingWindow(limit=2, window=10.0, max_keys=8)
    >>> w.add("k", 0.0); w.add("k", 1.0); w.wait("k", 5.0)
    5.0
    >>> w.wait("k", 10.0)
    0.0
    """

    def __init__(self, *, limit: int, window: float, max_keys: int = MAX_KEYS) -> None:
        self.limit = limit
        self.window = window
        self.max_keys = max_keys
        self._events: OrderedDict[str, list[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._events)

    def _recent(self, key: str, now: float) -> list[float] | None:
        events = self._events.get(key)
        if events is None:
            return None
        cutoff = now - self.window
        if events[0] <= cutoff:
            events[:] = [t for t in events if t > cutoff]
            if not events:
                del self._events[key]
                return None
        return events

    def wait(self, key: str, now: float) -> float:
        """Seconds until ``key`` may have another event (0: it may now)."""
        events = self._recent(key, now)
        if events is None or len(events) < self.limit:
            return 0.0
        # The list holds at most ``limit`` times: the oldest leaving the window frees a slot.
        return events[0] + self.window - now

    def add(self, key: str, now: float) -> None:
        events = self._recent(key, now)
        if events is None:
            self._events[key] = [now]
            while len(self._events) > self.max_keys:
                self._events.popitem(last=False)
            return
        self._events.move_to_end(key)
        events.append(now)
        if len(events) > self.limit:
            del events[0]

    def forget(self, key: str) -> None:
        self._events.pop(key, None)


@dataclass(frozen=True)
class Refusal:
    """Why an attempt was refused, for the audit log."""

    scope: str  # "account" or "address"
    retry_after: int
    #: True for the first refusal since the limit was reached (later ones repeat it).
    first: bool


class LoginThrottle:
    """The node's login throttle (one per process; see the module docstring).

    Args:
        now: the clock, in seconds (monotonic); tests pass their own.
    """

    def __init__(
        self,
        *,
        max_failures: int,
        failure_window: float,
        max_attempts_per_address: int,
        address_window: float,
        max_keys: int = MAX_KEYS,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.accounts = SlidingWindow(limit=max_failures, window=failure_window, max_keys=max_keys)
        self.addresses = SlidingWindow(
            limit=max_attempts_per_address, window=address_window, max_keys=max_keys
        )
        self.now = now
        self._lock = threading.Lock()
        # Keys refused since their limit was reached: only the first refusal is audited.
        self._refused: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._max_keys = max_keys

    @classmethod
    def from_settings(cls, settings: Settings) -> LoginThrottle:
        return cls(
            max_failures=settings.login_max_failures,
            failure_window=settings.login_failure_window_seconds,
            max_attempts_per_address=settings.login_max_attempts_per_address,
            address_window=settings.login_address_window_seconds,
        )

    def admit(self, account: str, address: str) -> Refusal | None:
        """Count an attempt on ``account`` from ``address``, or refuse it.

        Returns ``None`` when the attempt may go on to the password check (it now counts as
        a failure of ``account`` until :meth:`succeeded` forgives it), else the refusal; a
        refused attempt counts towards neither limit.
        """
        with self._lock:
            now = self.now()
            for scope, window, key in (
                ("address", self.addresses, address),
                ("account", self.accounts, account),
            ):
                wait = window.wait(key, now)
                if wait > 0:
                    first = (scope, key) not in self._refused
                    self._refused[(scope, key)] = None
                    self._refused.move_to_end((scope, key))
                    while len(self._refused) > self._max_keys:
                        self._refused.popitem(last=False)
                    return Refusal(scope, max(1, math.ceil(wait)), first)
            for scope, key in (("address", address), ("account", account)):
                self._refused.pop((scope, key), None)
            self.addresses.add(address, now)
            self.accounts.add(account, now)
            return None

    def succeeded(self, account: str) -> None:
        """The password was right: clear the account's failures."""
        with self._lock:
            self.accounts.forget(account)


def refusal_error(refusal: Refusal) -> RateLimitedError:
    """The error a refused login answers with (the same for known and unknown emails).

    >>> refusal_error(Refusal("account", 90, True)).detail
    'too many failed logins for this email address; try again in 90 seconds'
    """
    what = {
        "account": "too many failed logins for this email address",
        "address": "too many login attempts from your address",
    }[refusal.scope]
    seconds = "second" if refusal.retry_after == 1 else "seconds"
    return RateLimitedError(
        f"{what}; try again in {refusal.retry_after} {seconds}", retry_after=refusal.retry_after
    )


class RequestLimit:
    """At most ``limit`` requests per ``window`` seconds from one client address, refused
    with :class:`RateLimitedError` (429, ``Retry-After``) beyond it; refused requests do
    not count, so a client that waits as told gets in.

    Args:
        what: what is limited, as the refusal says it (``"network searches"``).
        now: the clock, in seconds (monotonic); tests pass their own.

    >>> clock = iter([0.0, 0.5, 0.9, 2.0]).__next__
    >>> limit = RequestLimit(what="searches", limit=2, window=2.0, now=clock)
    >>> limit.admit("1.2.3.4"); limit.admit("1.2.3.4")
    >>> try:
    ...     limit.admit("1.2.3.4")
    ... except RateLimitedError as refused:
    ...     print(refused.retry_after, refused.detail)
    2 too many searches from your address; try again in 2 seconds
    >>> limit.admit("1.2.3.4")  # two seconds on, the first has left the window
    """

    def __init__(
        self,
        *,
        what: str,
        limit: int,
        window: float,
        max_keys: int = MAX_KEYS,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.addresses = SlidingWindow(limit=limit, window=window, max_keys=max_keys)
        self.now = now
        self._lock = threading.Lock()

    @classmethod
    def network_searches(cls, settings: Settings) -> RequestLimit:
        """The limit on a network's public routes (``network_search_*`` settings)."""
        return cls(
            what="network searches",
            limit=settings.network_search_max_per_address,
            window=settings.network_search_window_seconds,
        )

    def admit(self, address: str) -> None:
        """Count a request from ``address``, or refuse it.

        Raises:
            RateLimitedError: ``address`` sent ``limit`` requests in the last ``window``
                seconds; ``retry_after`` says when the oldest leaves the window.
        """
        with self._lock:
            now = self.now()
            wait = self.addresses.wait(address, now)
            if wait <= 0:
                self.addresses.add(address, now)
                return
        seconds = max(1, math.ceil(wait))
        unit = "second" if seconds == 1 else "seconds"
        raise RateLimitedError(
            f"too many {self.what} from your address; try again in {seconds} {unit}",
            retry_after=seconds,
        )

"""Tracking once per structure: a report that holds for every value a changing constant
takes inside a public box.

A training loop publishes the same graph every step with new weights (constants). The
tracker's report depends on those values, so it cannot simply be kept; but the rules are
sound for *intervals*, so a report computed with each changing constant replaced by a
public interval ``[v - r, v + r]`` (a box around its value) holds for every value inside
the box. :class:`TrackingCache` keeps, per graph structure and inputs' metadata, such a
report: a later publish whose changing constants lie in their boxes, and whose other
constants are the same bytes, reuses it without tracking; otherwise it is tracked exactly
and, from the change it shows, a new box is tried.

Which constants change is learnt from two publishes of the same structure in a row: those
whose bytes differ. A box's radius is :data:`REACH` times the largest change of any of the
tensor's elements (plus a small relative margin), so a loop that keeps stepping about as far
stays inside it for several steps. The boxed report is kept only when it is as tight as the
exact one (its sensitivities at most a relative ``1e-6`` larger: the noise must not grow for
the cache) and the boxed tracking refuses nothing the exact one allowed. The reach adapts
per structure: a box that held doubles it for the next box (up to :data:`_MOST_REACH`, so
that a loop stepping steadily is tracked less and less often), one that failed (refused:
the graph's bounds overflow over a wide box, as a transformer's attention's do; or looser)
halves it, and the reach never comes back to one that failed. Below one step, the
structure is tracked exactly every time its constants change. The exact report is kept with the
constants it was tracked with (their bits), so the same publish again reuses it. The report
used is always one that holds for the constants published, so the release is as sound as
with exact tracking: the cache decides only how often the tracker runs. All of it is public
metadata (constants are the client's own public values).
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.engine import Plan, structure_hash
from dpnode.core.privacy.spec import InputSpec
from dpnode.core.privacy.state import PrivacyTrackingError
from dpnode.core.privacy.subjects import Subjects
from dpnode.core.privacy.tracker import PrivacyReport, track

__all__ = ["REACH", "TrackingCache"]

#: a box first reaches this many times an element's last change on either side
REACH = 8.0
#: and at most this many
_MOST_REACH = 64.0
#: and at least this relative margin of the value (a weight that did not move this step)
_RELATIVE = 1e-3
#: a boxed report may be this much looser than the exact one, relatively
_LOOSER = 1e-6
#: graphs with more constant elements are tracked every time (a box holds 3 copies)
_MOST_ELEMENTS = 4_000_000


@dataclass
class _Entry:
    """What one structure (and inputs' metadata) has shown so far."""

    #: the constants of the last publish tracked, by node index
    last: dict[int, npt.NDArray[Any]]
    #: the boxed report, its boxes, and the other constants it was tracked with
    report: PrivacyReport | None = None
    boxes: dict[int, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]] = field(
        default_factory=dict
    )
    fixed: dict[int, npt.NDArray[Any]] = field(default_factory=dict)
    #: boxes reach this many times a constant's last change: doubled after a box that held,
    #: up to :data:`_MOST_REACH` and below ``ceiling``, the reach of the last box that failed
    reach: float = REACH
    ceiling: float = math.inf
    #: boxes failed at every reach down to one step: track exactly from now on
    exact_only: bool = False


class TrackingCache:
    """Per-process reports of graph structures tracked with boxed constants (see module).

    ``hits`` and ``tracked`` count reuses and tracker runs, for tests and benchmarks.
    """

    def __init__(self, entries: int = 16) -> None:
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._size = entries
        self._lock = threading.Lock()
        self.hits = 0
        self.tracked = 0

    def report(self, planned: Plan, specs: Mapping[str, InputSpec]) -> PrivacyReport:
        """The report of ``planned`` (a plan made with ``accurate=True``) for ``specs``:
        reused when it holds for these constants, else tracked (and boxed when it can be).

        Raises:
            PrivacyTrackingError: as :func:`dpnode.core.privacy.track`.
        """
        constants = {i: n.value for i, n in enumerate(planned.graph.nodes) if n.op == "constant"}
        size = sum(0 if v is None else v.size for v in constants.values())
        if self._size <= 0 or size > _MOST_ELEMENTS:
            return track(planned, specs)
        key = (structure_hash(planned.graph), _specs_key(specs))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                if entry.report is not None and _inside(entry, constants):
                    self.hits += 1
                    return entry.report
        exact = track(planned, specs)  # refuses as ever: nothing is cached for a refusal
        self.tracked += 1
        boxed, boxes = None, {}
        if entry is not None and not entry.exact_only:
            boxes = _boxes(entry.last, constants, entry.reach)
            if boxes:
                boxed = _boxed_report(planned, specs, boxes, exact)
                if boxed is None:  # too wide for the graph (its bounds overflow, or looser)
                    entry.ceiling, entry.reach = entry.reach, entry.reach / 2
                    entry.exact_only = entry.reach < 1
                elif 2 * entry.reach < entry.ceiling:
                    entry.reach = min(2 * entry.reach, _MOST_REACH)
        known = {i: v for i, v in constants.items() if v is not None}
        with self._lock:
            if entry is None:
                # the exact report holds for these very constants: the same publish again
                # (a dashboard's query) is not tracked again
                self._entries[key] = _Entry(known, exact, fixed=dict(known))
                while len(self._entries) > self._size:
                    self._entries.popitem(last=False)
            else:
                # a report is kept only with the constants it was tracked with
                entry.last = known
                entry.report = boxed if boxed is not None else exact
                entry.boxes = boxes if boxed is not None else {}
                entry.fixed = {i: v for i, v in known.items() if i not in entry.boxes}
        return exact


def _specs_key(specs: Mapping[str, InputSpec]) -> str:
    """A digest of every input's public metadata (bounds, subjects, public values)."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(specs):
        spec = specs[name]
        h.update(name.encode())
        h.update(repr((spec.is_public, spec.row_axis)).encode())
        for part in (spec.lower, spec.upper, spec.value):
            h.update(b"|")
            if part is not None:
                a = np.ascontiguousarray(np.asarray(part))
                h.update(a.dtype.str.encode() + repr(a.shape).encode() + a.tobytes())
        subjects = spec.subjects
        h.update(b"|")
        if isinstance(subjects, Subjects) and subjects.is_identity:
            # row i is subject i: its n alone say it (hashing 8 bytes a row took seconds)
            h.update(f"identity {subjects.rows}".encode())
            continue
        column = subjects.column if isinstance(subjects, Subjects) else subjects
        if column is not None:
            h.update(np.ascontiguousarray(column).tobytes())
    return h.hexdigest()


def _boxes(
    last: dict[int, npt.NDArray[Any]], now: dict[int, npt.NDArray[Any] | None], reach: float
) -> dict[int, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]]:
    """Boxes around the float constants that changed since ``last``, ``reach`` times their
    change (none if any other constant changed, or one changed shape: then nothing is
    learnt)."""
    boxes = {}
    for i, v in now.items():
        before = last.get(i)
        if v is None or before is None or v.shape != before.shape or v.dtype != before.dtype:
            return {}
        if np.array_equal(v, before):
            continue
        if v.dtype.kind != "f" or not (np.isfinite(v).all() and np.isfinite(before).all()):
            return {}
        value = v.astype(np.float64)
        # the tensor's largest step, for all its elements: an optimizer's steps vary per
        # element from one step to the next (momentum changing sign), much less per tensor
        step = float(np.max(np.abs(value - before.astype(np.float64))))
        radius = reach * step + _RELATIVE * np.abs(value)
        boxes[i] = (value - radius, value + radius)
    return boxes


def _boxed_report(
    planned: Plan,
    specs: Mapping[str, InputSpec],
    boxes: dict[int, tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]],
    exact: PrivacyReport,
) -> PrivacyReport | None:
    """The report with ``boxes`` for the changing constants, if it is as tight as ``exact``."""
    try:
        boxed = track(planned, specs, boxes=boxes)
    except PrivacyTrackingError:
        return None
    for b, e in zip(boxed.outputs, exact.outputs, strict=True):
        if not (b.l1 <= e.l1 * (1 + _LOOSER) and b.l2 <= e.l2 * (1 + _LOOSER)):
            return None
    return boxed


def _same_bits(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> bool:
    """Equal dtype, shape and bytes (so -0.0 is not 0.0, and a NaN equals its own bits).

    >>> nan, zero = np.array([np.nan]), np.array([0.0])
    >>> _same_bits(zero, -zero), _same_bits(nan, nan.copy())
    (False, True)
    """
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = [np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in (a, b)]
    return bool(np.array_equal(bits[0], bits[1]))


def _inside(entry: _Entry, constants: dict[int, npt.NDArray[Any] | None]) -> bool:
    """Whether every changing constant lies in its box and every other is unchanged."""
    for i, v in constants.items():
        if v is None:
            return False
        box = entry.boxes.get(i)
        if box is None:
            before = entry.fixed.get(i)
            if before is None or not _same_bits(v, before):
                return False
            continue
        if v.shape != box[0].shape:
            return False
        value = v.astype(np.float64)
        if not (np.all(value >= box[0]) and np.all(value <= box[1])):  # NaN fails too
            return False
    return True

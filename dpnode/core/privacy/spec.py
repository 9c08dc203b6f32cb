"""Public metadata of a graph input: bounds and subject structure, or "public".

This is everything the tracker may know about an input. Private inputs have one
subject per slice along ``row_axis`` (``subjects[i]`` for row ``i``; by default row
``i`` is subject ``i``); all private inputs of one graph share one subject id space
(the columns of one dataset). Bounds must be finite: they are the privacy contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.engine.dtypes import DType
from dpnode.core.privacy.state import PUBLIC, PrivacyTrackingError, State, fit, public_state
from dpnode.core.privacy.subjects import Subjects

__all__ = ["InputSpec"]


@dataclass(frozen=True)
class InputSpec:
    """Public metadata of one input.

    Args:
        lower, upper: bounds of every value, scalars or arrays broadcastable to the
            shape of one row (the input's shape without ``row_axis``).
        subjects: int64 subject index per row (or its :class:`Subjects` structure, which
            can be shared by the columns of a dataset), or None for one subject per row.
        row_axis: the axis along which rows (and subjects) run.
        is_public: the input is public (a model weight): it never changes.
        value: a public input's value, if the tracker may use it (e.g. matmul weights).

    >>> InputSpec(0.0, 1.0).is_public
    False
    >>> InputSpec.public().is_public
    True
    """

    lower: Any = None
    upper: Any = None
    subjects: npt.NDArray[np.int64] | Subjects | None = None
    row_axis: int = 0
    is_public: bool = False
    value: npt.NDArray[Any] | None = None

    @classmethod
    def private(
        cls,
        lower: Any,
        upper: Any,
        subjects: npt.NDArray[np.int64] | Subjects | None = None,
        row_axis: int = 0,
    ) -> InputSpec:
        """A private input with declared bounds and optional subject index per row."""
        return cls(lower, upper, subjects, row_axis)

    @classmethod
    def public(
        cls, value: npt.NDArray[Any] | None = None, lower: Any = None, upper: Any = None
    ) -> InputSpec:
        """A public input (model weights, public data), optionally with its value or bounds."""
        return cls(lower, upper, is_public=True, value=value)

    def subject_count(self, shape: tuple[int, ...]) -> int:
        """Subjects this input's ids span (max id + 1)."""
        if self.is_public or not shape:
            return 0
        n = shape[self.row_axis % len(shape)]
        if self.subjects is None:
            return n
        if isinstance(self.subjects, Subjects):
            return self.subjects.count
        return int(np.max(self.subjects)) + 1 if len(self.subjects) else 0

    def structure(self, n: int) -> Subjects:
        """The subject structure of ``n`` rows (computed here; the tracker computes it once)."""
        if self.subjects is None:
            return Subjects.identity(n)
        if isinstance(self.subjects, Subjects):
            return self.subjects
        try:
            return Subjects.of(self.subjects)
        except ValueError:
            raise PrivacyTrackingError(
                f"subjects must be {n} non-negative integers, one per row"
            ) from None

    def state(
        self, name: str, shape: tuple[int, ...], dt: DType, structure: Subjects | None = None
    ) -> State:
        """The tracker state of this input (validating the metadata against its shape).

        ``structure``: this input's :meth:`structure`, if the caller has it already.
        """
        where = f"input {name!r}"
        if self.is_public:
            return self._public_state(where, shape, dt)
        if not shape:
            raise PrivacyTrackingError(f"{where}: a private input needs a row axis")
        axis = self.row_axis % len(shape)
        n = shape[axis]
        row_shape = shape[:axis] + shape[axis + 1 :]
        lo, hi = (self._bound(where, b, row_shape, axis) for b in (self.lower, self.upper))
        if np.any(lo > hi):
            raise PrivacyTrackingError(f"{where}: a lower bound exceeds its upper bound")
        try:
            subj = (structure or self.structure(n)).column
        except PrivacyTrackingError as exc:
            raise PrivacyTrackingError(f"{where}: {exc}") from None
        if subj.shape != (n,):
            raise PrivacyTrackingError(
                f"{where}: subjects must be {n} non-negative integers, one per row"
            )
        # a view of the read-only subject column: rules recognise it (dpnode.core.privacy.subjects)
        owner = subj.reshape((1,) * axis + (n,) + (1,) * (len(shape) - axis - 1))
        with np.errstate(over="ignore"):  # bounds wider than the largest float: unbounded
            width = hi - lo
        zero = fit(0.0, shape)
        return State(
            shape,
            dt,
            fit(lo, shape),
            fit(hi, shape),
            fit(owner, shape),
            fit(width, shape),
            zero,
        )

    def _public_state(self, where: str, shape: tuple[int, ...], dt: DType) -> State:
        if self.value is not None:
            v = np.asarray(self.value)
            if v.shape != shape:
                raise PrivacyTrackingError(
                    f"{where}: public value has shape {v.shape}, not {shape}"
                )
            return public_state(v.astype(dt.np, copy=False), dt)
        lo = -np.inf if self.lower is None else self.lower
        hi = np.inf if self.upper is None else self.upper
        z = fit(0.0, shape)
        return State(
            shape,
            dt,
            fit(np.asarray(lo, float), shape),
            fit(np.asarray(hi, float), shape),
            fit(np.int64(PUBLIC), shape),
            z,
            z,
        )

    @staticmethod
    def _bound(where: str, b: Any, row_shape: tuple[int, ...], axis: int) -> np.ndarray:
        if b is None:
            raise PrivacyTrackingError(f"{where}: private inputs need lower and upper bounds")
        a = np.asarray(b, dtype=np.float64)
        if not np.all(np.isfinite(a)):
            raise PrivacyTrackingError(f"{where}: bounds must be finite numbers (no NaN or inf)")
        try:
            a = np.broadcast_to(a, row_shape) if a.ndim else a
        except ValueError:
            raise PrivacyTrackingError(
                f"{where}: bounds of shape {list(a.shape)} do not fit rows of shape "
                f"{list(row_shape)}"
            ) from None
        return np.expand_dims(a, axis) if a.ndim else a

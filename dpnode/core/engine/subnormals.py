"""Subnormal numbers, kept out of the engine's arithmetic on private values.

Most CPUs compute with subnormal floats (nonzero, below ``2^-1022`` in float64, ``2^-126`` in
float32) through a slow path: on the dev box a float64 division with a subnormal operand or
result takes 2.2 times as long, ``sqrt`` and ``exp`` 1.5 times. The time of an answered publish
is seen by the analyst, so a graph that makes values subnormal where a private predicate holds
(``where(x > t, x * 1e-309, x)``, then forty divisions) turned the evaluation's time into a
count of the rows above ``t``, read at any epsilon (measured through the node: 35 ms with no
row above ``t``, about 60 ms with a quarter or more).

Two measures close it:

* **No arithmetic result is subnormal.** While the engine evaluates private values, the
  evaluating thread runs with the CPU's *flush to zero* mode (x86-64's ``MXCSR.FTZ``): a
  result that would be subnormal is ``±0`` instead, at full speed. The tracker's
  rounding model counts this: the absolute error of a rounding is up to the smallest *normal*
  float (:func:`dpnode.core.privacy.rounding.tiny`), not the smallest subnormal.
* **No operand the analyst chooses is subnormal.** Constants and public values arrive in the
  analyst's frames and are flushed to ``±0`` when decoded (:func:`flush`); uploaded columns are
  flushed when stored. Without operands and results that are subnormal, the slow path is never
  taken. (Data stored before this measure may hold subnormal values; their count in a column is
  what the time of a publish reading them could still show.)

The mode is set per thread, for the evaluation only (:func:`flushing`): elsewhere (the
tracker's own arithmetic, the noise) IEEE gradual underflow holds. BLAS runs its matrix
products in the calling thread (:func:`single_threaded_blas`), so they run under the same mode.
Where the mode cannot be set (a C library without ``fegetenv``/``fesetenv``, a CPU other than
x86-64), :data:`SUPPORTED` is false and evaluation runs as before; the node logs a warning
when it starts.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

__all__ = ["SUPPORTED", "flush", "flushing", "single_threaded_blas"]

log = logging.getLogger("dpnode")

#: the smallest normal magnitude per float dtype kind: below it (and above 0), subnormal
_NORMAL = {
    np.dtype(np.float64): np.finfo(np.float64).smallest_normal,
    np.dtype(np.float32): np.finfo(np.float32).smallest_normal,
    np.dtype(np.float16): np.finfo(np.float16).smallest_normal,
}


def _environment() -> tuple[Any, int, int, int] | None:
    """``(libm, fenv_t size, byte offset, flag)`` of the flush-to-zero control, or None.

    glibc's ``fenv_t`` holds the SSE control register ``MXCSR`` at byte 28 on x86-64, whose
    FTZ (bit 15) flushes results only; ``fesetenv`` loads it. (AArch64's ``FPCR.FZ`` also
    reads subnormal *operands* as zero, which the tracker's model does not cover: not used.)"""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    layout = (32, 28, 1 << 15)
    name = ctypes.util.find_library("m")
    if name is None or platform.system() != "Linux":
        return None
    try:
        libm = ctypes.CDLL(name)
        libm.fegetenv.argtypes = [ctypes.c_void_p]
        libm.fesetenv.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return (libm, *layout)


_ENV = _environment()


class _Mode:
    """Flush to zero on this thread, nested: the previous environment is restored by the
    outermost exit."""

    local = threading.local()

    @classmethod
    def enter(cls) -> None:
        assert _ENV is not None
        depth = getattr(cls.local, "depth", 0)
        cls.local.depth = depth + 1
        if depth:
            return
        libm, size, offset, flag = _ENV
        saved = (ctypes.c_uint8 * size)()
        libm.fegetenv(saved)
        mode = (ctypes.c_uint8 * size).from_buffer_copy(saved)
        word = int.from_bytes(bytes(mode[offset : offset + 4]), "little") | flag
        mode[offset : offset + 4] = list(word.to_bytes(4, "little"))
        cls.local.saved = saved
        libm.fesetenv(mode)

    @classmethod
    def exit(cls) -> None:
        assert _ENV is not None
        cls.local.depth -= 1
        if not cls.local.depth:
            _ENV[0].fesetenv(cls.local.saved)


def _works() -> bool:
    """Whether the mode does what it should here: a subnormal product becomes 0 inside, and
    stays subnormal outside."""
    if _ENV is None:
        return False
    x = np.full(4, 1e-300)
    _Mode.enter()
    try:
        inside = x * 1e-20
    finally:
        _Mode.exit()
    outside = x * 1e-20
    return bool(np.all(inside == 0.0) and np.all(outside > 0.0))


#: Whether this platform flushes subnormal results while the engine evaluates.
SUPPORTED = _works()


@contextmanager
def flushing() -> Iterator[None]:
    """Arithmetic in this thread gives ``±0`` for a result that would be subnormal, inside.

    A no-op where the mode is not :data:`SUPPORTED`."""
    if not SUPPORTED:
        yield
        return
    _Mode.enter()
    try:
        yield
    finally:
        _Mode.exit()


def flush(a: Any) -> Any:
    """``a`` with its subnormal values replaced by zeros of their sign (a copy only if one
    is replaced; other dtypes are returned as they are).

    The test reads magnitudes, which takes no slow path (no arithmetic).

    >>> flush(np.array([1e-310, -1e-320, 2.0, 0.0])).tolist()
    [0.0, -0.0, 2.0, 0.0]
    """
    if not isinstance(a, np.ndarray) or a.dtype not in _NORMAL:
        return a
    small = (np.abs(a) < _NORMAL[a.dtype]) & (a != 0)
    if not np.any(small):
        return a
    out = np.array(a, copy=True)
    np.copyto(out, np.copysign(0.0, out).astype(a.dtype), where=small)
    return out


_BLAS_LOCK = threading.Lock()
_BLAS_SET = False


def single_threaded_blas() -> None:
    """Make BLAS compute in its caller's thread, for the whole process (once).

    BLAS's own threads were started without the flush-to-zero mode: a matrix product spread
    over them would take the slow path on subnormal results. Every request of a node already
    runs in a thread of its own."""
    global _BLAS_SET
    with _BLAS_LOCK:
        if _BLAS_SET:
            return
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
        _BLAS_SET = True
        if not SUPPORTED:
            log.warning(
                "this platform (%s, %s) cannot flush subnormal results to zero: the time of "
                "a publish may show how many of its values were subnormal (docs/privacy.md)",
                platform.system(),
                platform.machine(),
            )

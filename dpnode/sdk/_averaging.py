"""Averaging the iterates of a private training run: free post-processing of its releases.

Each step of a run moves the parameters by a noised gradient, so the last iterate carries the
last steps' noise undamped. An average of the iterates damps that jitter (not the noise the
run integrated before, a random walk that the average follows: on the bench's rows it gained
nothing, docs/performance.md). It is computed from the released gradients alone (the
iterates are functions of them and of the public start), so it costs no privacy: the node
charges the same steps.

Two averages, both fixed in advance by the run's public step count ``steps``:

* ``"tail"``: the plain mean of the last ``steps - steps // 2`` iterates (the last half), as
  in tail-averaged SGD;
* ``"ema"``: an exponential moving average whose window is a quarter of the run (decay
  ``1 - 4 / steps``), which is the running mean of the iterates until that window fills
  (the decay at step ``t`` is at most ``(t - 1) / t``), so that the random start weighs no
  more than any iterate.

The averages are kept in float32 at least (a bfloat16 model's average is rounded once, at
the end) and updated as ``mean += w * (x - mean)``, so that a parameter the steps leave
alone keeps its value exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dpnode.sdk._exceptions import DPNodeError

__all__ = ["AVERAGES", "DEFAULT_AVERAGE", "IterateAverage", "iterate_average"]

#: what a run's parameters hold after its last step: the last iterate, which neither average
#: beat on the same runs (docs/performance.md, "Averaging the iterates")
DEFAULT_AVERAGE: str | None = None

#: the EMA's window, as a fraction of the run's steps
_EMA_WINDOW = 0.25


def _tail_weight(step: int, steps: int) -> float:
    """The weight of iterate ``step`` (from 1) in the running mean of the last half; 0 before.

    >>> [_tail_weight(t, 4) for t in range(1, 5)]
    [0.0, 0.0, 1.0, 0.5]
    >>> _tail_weight(1, 1)
    1.0
    """
    start = steps // 2  # the iterates after steps start + 1 .. steps
    return 0.0 if step <= start else 1.0 / (step - start)


def _ema_weight(step: int, steps: int) -> float:
    """The weight of iterate ``step`` (from 1) in the EMA: ``1 - decay``, with the decay at
    most ``(step - 1) / step`` (a running mean until the window fills).

    >>> [_ema_weight(t, 8) for t in range(1, 5)]
    [1.0, 0.5, 0.5, 0.5]
    >>> _ema_weight(3, 80)
    0.3333333333333333
    """
    return max(1.0 / step, min(1.0, 1.0 / (_EMA_WINDOW * steps)))


#: each average's weight of the newest iterate, by name
AVERAGES: dict[str, Callable[[int, int], float]] = {"ema": _ema_weight, "tail": _tail_weight}


class IterateAverage:
    """The running average of a run's parameter iterates, of the kind ``AVERAGES[kind]``.

    Args:
        kind: ``"ema"`` or ``"tail"`` (see the module).
        model: whose parameters are averaged (its buffers are left as they are).
        steps: the run's step count (public), which fixes the weights.
    """

    def __init__(self, kind: str, model: torch.nn.Module, steps: int) -> None:
        self.weight = AVERAGES[kind]
        self.params = dict(model.named_parameters())
        self.steps, self.taken = steps, 0
        self.means = {
            name: torch.zeros_like(p.detach(), dtype=torch.promote_types(p.dtype, torch.float32))
            for name, p in self.params.items()
        }

    def update(self) -> None:
        """Fold in the parameters' values now, as the iterate after the next step."""
        self.taken += 1
        w = self.weight(self.taken, self.steps)
        if w == 0.0:
            return
        with torch.no_grad():
            for name, p in self.params.items():
                mean = self.means[name]
                mean.lerp_(p.detach().to(mean.dtype), w)

    def load(self) -> dict[str, torch.Tensor]:
        """Copy the average into the parameters, in place (the optimizer keeps them and its
        state); returns the iterate they held, by name (detached copies)."""
        held = {name: p.detach().clone() for name, p in self.params.items()}
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(self.means[name])
        return held


def iterate_average(kind: Any, model: torch.nn.Module, steps: int) -> IterateAverage | None:
    """An :class:`IterateAverage` of ``kind`` (``None``: none, the last iterate is kept).

    Raises:
        DPNodeError: ``kind`` is not a name in :data:`AVERAGES` nor ``None``.
    """
    if kind is None:
        return None
    if not isinstance(kind, str) or kind not in AVERAGES:
        names = ", ".join(repr(name) for name in sorted(AVERAGES))
        raise DPNodeError(
            f"average must be one of {names} or None (the last iterate), got {kind!r}"
        )
    return IterateAverage(kind, model, steps)

"""Splitting a total epsilon over the steps of a training run, as the node's filter counts it.

A run of ``steps`` Gaussian releases (``publish_grads(..., max_grad_norm=C)``) composes in the
node's privacy filter (``dpnode.core.dp.accounting``: zCDP totals converted at the budget's delta,
plus each release's sampler terms), not by adding epsilons: 30 steps of epsilon 0.1 cost
far less than 3. :func:`step_budget` inverts that count: the largest per-step epsilon whose
``steps`` releases cost at most ``epsilon`` on a fresh budget with delta ``budget_delta``.
On a budget that has already paid for Gaussian releases they cost no more than that (the
filter's conversion is concave in the zCDP total and zero at zero, so it is subadditive).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dpnode.core.dp import accounting
from dpnode.sdk._exceptions import DPNodeError

__all__ = ["StepBudget", "step_budget", "step_count"]

#: the delta each step's Gaussian is calibrated with (it only fixes the rho charged)
_STEP_DELTA = 1e-6
#: headroom for the ledger's rounding of every step's rho up to its unit
_MARGIN = 1e-4


@dataclass(frozen=True)
class StepBudget:
    """What to pass each step: ``publish_grads(model, epsilon=s.epsilon, delta=s.delta, ...)``."""

    epsilon: float
    delta: float


def step_budget(
    *, epsilon: float, steps: int, budget_delta: float, values: int = 1_000_000
) -> StepBudget:
    """The per-step privacy parameters of a run of ``steps`` Gaussian releases in ``epsilon``.

    Args:
        epsilon: the total the run may cost.
        steps: how many releases (``publish_grads`` calls) the run makes.
        budget_delta: the delta of your allowance (``client.budget().delta``), at which the
            node converts zCDP totals.
        values: the most values one release noises (the model's parameter count); the
            default covers models up to a million parameters.

    Raises:
        DPNodeError: invalid arguments, or a total too small for that many steps.

    >>> s = step_budget(epsilon=1.0, steps=30, budget_delta=1e-6)
    >>> 1 / 30 < s.epsilon < 1.0, s.delta
    (True, 1e-06)
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise DPNodeError(f"epsilon must be a positive number, got {epsilon!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise DPNodeError(f"steps must be a positive integer, got {steps!r}")
    if not (0 < budget_delta < 1):
        raise DPNodeError(f"budget_delta must be in (0, 1), got {budget_delta!r}")

    def total(step: float) -> float:
        rho = accounting.calibrate_rho(step, _STEP_DELTA)
        charge = accounting.Charge(rho=rho, tv=values * accounting.GAUSSIAN_TV)
        return accounting.spent([charge] * steps, epsilon=epsilon, delta=budget_delta)[0]

    target = epsilon * (1 - _MARGIN)
    lo, hi = 1e-9, epsilon
    if total(lo) > target:
        raise DPNodeError(
            f"epsilon {epsilon:g} cannot pay for {steps} Gaussian releases at a budget delta "
            f"of {budget_delta:g}: use fewer steps or a larger epsilon"
        )
    for _ in range(64):  # geometric bisection: the step epsilon spans orders of magnitude
        mid = math.sqrt(lo * hi)
        if mid in (lo, hi):  # converged: further rounds change nothing
            break
        lo, hi = (mid, hi) if total(mid) <= target else (lo, mid)
    return StepBudget(lo, _STEP_DELTA)


def step_count(steps: Any, epochs: Any, batch: Any, rows: int) -> int:
    """The run's step count from ``steps`` or Opacus's ``epochs`` (one step each: every
    step sees every row), refusing an ``expected_batch_size`` other than the row count."""
    if steps is not None and epochs is not None and steps != epochs:
        raise DPNodeError(
            f"steps={steps!r} and epochs={epochs!r} disagree: every step uses every row, so "
            "an epoch is one step; give one of them"
        )
    count = steps if steps is not None else epochs
    name = "steps" if steps is not None or epochs is None else "epochs"
    if count is None:
        raise DPNodeError("pass steps= (each step uses every row, so an epoch is one step)")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DPNodeError(f"{name} must be a positive integer, got {count!r}")
    if batch is not None and batch != rows:
        raise DPNodeError(
            f"expected_batch_size={batch!r}: the node trains with full batches (every step "
            f"uses all {rows} rows); it does not sample batches, which under its neighbours "
            "(replacing a row) would not lower the noise per step (docs/remote-tensors.md). "
            "Leave expected_batch_size out"
        )
    return count

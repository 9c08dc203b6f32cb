"""A release of the keys private data holds: ``key_counts(x)`` published above a threshold.

``key_counts`` of one integer key per row (a column, or several combined into one code by the
SDK) is released by :mod:`dpnode.core.dp.keysets`: each key present gets its count plus
discrete Laplace noise, and only keys whose noisy count clears a threshold derived from
``(epsilon, delta)`` are released, sorted, with their noisy counts. The answer's length
depends on the data only through that thresholding.

What the plan needs, from public metadata only (as for a quantile:
:func:`~dpnode.core.privacy.tracker.selection_inputs`): that the keys are integers on every
dataset within the declared bounds, their public range (the most distinct keys there can be),
and how many rows replacing one subject may change (``k``, which scales the noise and the
threshold). Float keys are refused: they have no finite set of values to be counted on, and a
caller grouping by them names the keys (``keys=``) or bins them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dpnode.core.dp import keysets
from dpnode.core.dp.mechanisms import NoisePlan, Release
from dpnode.core.dp.samplers import Source, word_source
from dpnode.core.engine import Graph, Plan, plan, run
from dpnode.core.engine.graph import Ref
from dpnode.core.errors import InvalidRequestError
from dpnode.core.privacy.spec import InputSpec
from dpnode.core.privacy.state import PrivacyTrackingError
from dpnode.core.privacy.tracker import OutputSensitivity, PrivacyReport, selection_inputs

__all__ = ["MAX_KEY_SPAN", "KeyRelease", "plan_keys_release", "run_keys_release"]

#: Keys are released as float64 values: their range must hold them all exactly.
MAX_KEY_SPAN = 2.0**53


@dataclass(frozen=True)
class KeyRelease:
    """What a key release decided before any value: its plan and the keys' public range."""

    plan: keysets.KeysPlan
    lo: float
    hi: float


def plan_keys_release(
    planned: Plan, specs: Mapping[str, InputSpec], *, epsilon: float, delta: float | None
) -> tuple[Plan, PrivacyReport, NoisePlan, KeyRelease] | None:
    """The plan of a key release; None when the graph publishes no ``key_counts``.

    Returns:
        the plan of the keys' evaluation, the report the receipt shows (L1 ``2k``), the
        noise plan (what is charged: ``epsilon`` and the sampler's deviation; ``delta`` is
        charged as asked) and the key release itself.

    Raises:
        PrivacyTrackingError: ``key_counts`` published with other outputs.
        InvalidRequestError: keys that are not integers within finite public bounds, keys
            of public values, a missing or bad delta.
    """
    nodes, outputs = planned.graph.nodes, planned.graph.outputs
    found = [o for o in outputs if nodes[o].op == "key_counts"]
    if not found:
        return None
    if len(outputs) != 1:
        raise PrivacyTrackingError(
            "the keys of private data (key_counts) are released on their own, above a noisy "
            "threshold: publish them by themselves, then the statistics per released key"
        )
    arg = nodes[found[0]].args[0]
    if not isinstance(arg, Ref):
        raise PrivacyTrackingError("key_counts takes a tensor")
    of = plan(Graph(nodes, (arg.index,)), accurate=True)
    report, moves, spans = selection_inputs(of, specs)
    span, k = spans[0], moves[0]
    if k is None:
        raise InvalidRequestError(
            "these keys are public (they depend on no private value): read them without a release"
        )
    if not span.integral:
        raise InvalidRequestError(
            "keys are discovered from integer columns (declared integer, or categorical codes) "
            "only; these keys may take non-integer values: name the keys with keys=[...] (or "
            "bin the column) to group by them"
        )
    lo, hi = span.lo, span.hi
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo + 1 > MAX_KEY_SPAN:
        raise InvalidRequestError(
            f"the keys' public range [{lo:g}, {hi:g}] must be finite and hold at most 2^53 "
            "values: declare narrower bounds for the column, or name the keys with keys=[...]"
        )
    n = math.prod(of.outputs[0].shape)
    domain = span.values.size if span.values is not None else int(hi - lo) + 1
    kp = keysets.plan_keys(
        epsilon=epsilon, delta=delta, rows_moved=max(k, 1), draws=max(min(n, domain), 1)
    )
    rows = kp.rows_moved
    shape = (n, 2)
    shown = PrivacyReport(
        (
            OutputSensitivity(
                shape,
                2.0 * rows,
                math.sqrt(2.0) * rows,
                np.full(shape, min(lo, 0.0)),
                np.full(shape, max(hi, float(n))),
                np.full(1, 2.0 * rows),
                np.full(1, math.sqrt(2.0) * rows),
                2.0 * rows,
                math.sqrt(2.0) * rows,
                0.0,
                0.0,
                True,
            ),
        ),
        report.subjects,
    )
    noise = NoisePlan(
        mechanism="threshold",
        count=kp.draws,
        grid_exponent=-keysets.GRID_BITS,
        scale=kp.scale,
        sensitivity=2.0 * rows,
        epsilon=epsilon,
        rho=0.0,
        sampler_tv=kp.sampler_tv,
        sampler=kp.sampler,
    )
    return of, shown, noise, KeyRelease(kp, lo, hi)


def run_keys_release(
    of: Plan,
    release: KeyRelease,
    inputs: Mapping[str, npt.NDArray[Any]] | Callable[[], Mapping[str, npt.NDArray[Any]]],
    *,
    rng: np.random.Generator | None,
    source: Source,
) -> tuple[npt.NDArray[np.float64], Release, str | None]:
    """Evaluate the keys, count them, noise and threshold: an ``(m, 2)`` array of the
    released keys and their noisy counts, the release for the receipt, and a failure for
    the operator (then no key is released: the public stand-in)."""
    kp = release.plan
    failure: str | None = None
    try:
        values = inputs() if callable(inputs) else inputs
        x = np.asarray(run(of, values, rng=rng).outputs[0], dtype=np.float64).reshape(-1)
        # the same work whatever the values: inside the public range, integers, no NaN
        x = np.where(np.isnan(x), release.lo, np.clip(np.round(x), release.lo, release.hi))
        keys, counts = np.unique(x, return_counts=True)
        words = word_source(source, kp.sampler.word_rows * kp.draws)
        kept, noisy = keysets.release_keys(keys, counts.astype(np.float64), kp, words=words)
    except Exception as exc:  # once charged, always answered: no key
        failure = f"{type(exc).__name__}: {exc}"
        kept, noisy = np.zeros(0), np.zeros(0)
    answer = np.stack([kept, noisy], axis=1) if kept.size else np.zeros((0, 2))
    done = Release(
        values=answer.reshape(-1),
        mechanism="threshold",
        grid_exponent=-keysets.GRID_BITS,
        scale=kp.scale,
        sensitivity=2.0 * kp.rows_moved,
        epsilon=kp.epsilon,
        rho=0.0,
        sampler_tv=kp.sampler_tv,
    )
    return answer, done, failure

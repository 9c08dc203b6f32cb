"""Differential-privacy mechanisms and accounting: pure functions, no I/O.

* :mod:`dpnode.core.dp.mechanisms` — ``laplace`` (epsilon-DP) and ``gaussian`` (rho-zCDP) on a
  data-independent 2^k grid, returning a :class:`Release`;
* :mod:`dpnode.core.dp.samplers` — constant-work, vectorised discrete Laplace / Gaussian samplers;
* :mod:`dpnode.core.dp.tables` — their exact-arithmetic 128-bit alias tables and deviation bounds;
* :mod:`dpnode.core.dp.grid` — the grid and its effect on sensitivity;
* :mod:`dpnode.core.dp.accounting` — zCDP composition, conversion, calibration, the filter.
* :mod:`dpnode.core.dp.run_accounting` — a training run's filter held at one Rényi order.

See ``docs/privacy.md`` for the guarantees and their references.
"""

from dpnode.core.dp.accounting import (
    Charge,
    calibrate_rho,
    compose,
    fits,
    gaussian_sigma,
    pure_to_zcdp,
    spent,
    zcdp_delta,
    zcdp_to_dp,
    zcdp_to_dp_cks,
)
from dpnode.core.dp.mechanisms import Release, gaussian, gaussian_scale, laplace, laplace_scale

__all__ = [
    "Charge",
    "Release",
    "calibrate_rho",
    "compose",
    "fits",
    "gaussian",
    "gaussian_scale",
    "gaussian_sigma",
    "laplace",
    "laplace_scale",
    "pure_to_zcdp",
    "spent",
    "zcdp_delta",
    "zcdp_to_dp",
    "zcdp_to_dp_cks",
]

"""Differential-privacy mechanisms and accounting: pure functions, no I/O.

* :mod:`node.dp.mechanisms` — ``laplace`` (epsilon-DP) and ``gaussian`` (rho-zCDP) on a
  data-independent 2^k grid, returning a :class:`Release`;
* :mod:`node.dp.samplers` — constant-work, vectorised discrete Laplace / Gaussian samplers;
* :mod:`node.dp.tables` — their exact-arithmetic 128-bit alias tables and deviation bounds;
* :mod:`node.dp.grid` — the grid and its effect on sensitivity;
* :mod:`node.dp.accounting` — zCDP composition and conversion, calibration, the budget filter.

See ``docs/privacy.md`` for the guarantees and their references.
"""

from node.dp.accounting import (
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
from node.dp.mechanisms import Release, gaussian, gaussian_scale, laplace, laplace_scale

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

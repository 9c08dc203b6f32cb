"""The moment vector's layout, weights, norm and exact norm bound (pure arithmetic).

See :mod:`dpnode.sdk._moments` for the release: each row's columns centred and scaled into
``[-1, 1]``, the row one vector ``[a u_i, b (u_i^2 - 1), c u_i u_j]`` clipped by the node to
:attr:`MomentPlan.bound`, the weights and the norm chosen here for the least expected error.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from dpnode.core.dp.accounting import gaussian_sigma

__all__ = ["PRIOR_MEAN", "MomentPlan", "choose_plan", "weighted_plan"]

#: the distance of a column's mean from the middle of its bounds, over half their width,
#: that the weights are chosen for
PRIOR_MEAN = 0.5
#: the weights tried for the first moments and the products (the squares' is 1: only the
#: ratios matter)
_GRID = np.geomspace(1 / 8, 8, 49)


@dataclass(frozen=True)
class MomentPlan:
    """Which moments a row's vector holds, their weights, and the norm it is clipped in.

    ``features`` columns come with their squares and all their products; with ``target``,
    one more (last) column comes with its sum and its products with the features only (what
    least squares needs). ``order`` is 1 (L1, Laplace) or 2 (L2, Gaussian).
    """

    features: int
    target: bool
    order: int
    first: float = 1.0
    square: float = 1.0
    cross: float = 1.0

    @property
    def columns(self) -> int:
        return self.features + int(self.target)

    def pairs(self) -> list[tuple[int, int]]:
        """The products ``u_i u_j`` (``i < j``) in the vector, in order.

        >>> MomentPlan(2, True, 1).pairs()
        [(0, 1), (0, 2), (1, 2)]
        """
        k = self.features
        own = [(i, j) for i in range(k) for j in range(i + 1, k)]
        return own + ([(i, k) for i in range(k)] if self.target else [])

    @property
    def size(self) -> int:
        """The vector's length."""
        return self.columns + self.features + len(self.pairs())

    @property
    def bound(self) -> float:
        """The largest norm of a row's vector over ``u`` in ``[-1, 1]^columns``.

        >>> MomentPlan(2, False, 1).bound, round(MomentPlan(2, False, 2).bound ** 2, 6)
        (3.0, 3.0)
        """
        k, a, b, c = self.features, self.first, self.square, self.cross
        ends = (0, 1) if self.target else (0,)
        if self.order == 1:
            # with s = |u|, the norm is a sum(s) + b sum(1 - s^2) + c sum_{i<j} s_i s_j (+ the
            # target's a s_y + c s_y sum(s)): at a fixed sum T of the features' s it is
            # largest when they are equal (sum(s^2) >= T^2 / k), which leaves a quadratic
            # in T on [0, k], and a line in s_y
            q = c / 2 - (b + c / 2) / k
            best = 0.0
            for y in ends:
                slope = a + c * y
                points = [0.0, float(k)]
                if q < 0:
                    points.append(min(max(-slope / (2 * q), 0.0), float(k)))
                best = max(best, *(b * k + a * y + slope * t + q * t * t for t in points))
            return best
        # with r = u^2, the squared norm is convex in each r_i (its r_i^2 term is b^2 r_i^2):
        # largest at a corner, where m of the features are at an end of their bounds
        return math.sqrt(
            max(
                a * a * (m + y) + b * b * (k - m) + c * c * (m * (m - 1) / 2 + y * m)
                for m in range(k + 1)
                for y in ends
            )
        )

    def error(self) -> float:
        """The expected squared error of the covariances (scaled units), per unit of noise
        variance on the vector's coordinates, for means at :data:`PRIOR_MEAN`."""
        k, a, b, c, m2 = self.features, self.first, self.square, self.cross, PRIOR_MEAN**2
        squares = k * (1 / b**2 + 4 * m2 / a**2)
        products = (k * (k - 1) + (k if self.target else 0)) * (1 / c**2 + 2 * m2 / a**2)
        return squares + products


@functools.lru_cache(maxsize=128)
def weighted_plan(features: int, target: bool, order: int) -> MomentPlan:
    """The plan whose weights give the least error for its norm (a search over a grid)."""
    best: tuple[float, MomentPlan] | None = None
    for first in _GRID:
        for cross in _GRID:
            plan = MomentPlan(features, target, order, float(first), 1.0, float(cross))
            score = plan.bound**2 * plan.error()
            if best is None or score < best[0]:
                best = (score, plan)
    assert best is not None
    return best[1]


def choose_plan(
    features: int, *, target: bool = False, epsilon: float, delta: float | None
) -> MomentPlan:
    """The weights and the norm with the least expected error: L1 (Laplace) without
    ``delta``; with it, whichever of L1 and L2 (Gaussian) noises less at ``epsilon`` and
    ``delta`` (pure epsilon is also (epsilon, delta)-DP).

    >>> [choose_plan(k, epsilon=1.0, delta=1e-6).order for k in (2, 13)]
    [1, 2]
    """
    laplace = weighted_plan(features, target, 1)
    if delta is None:
        return laplace
    gaussian = weighted_plan(features, target, 2)
    # noise variance per coordinate: 2 b^2 for Laplace of scale b = 2C / epsilon
    by_laplace = 2 * (2 * laplace.bound / epsilon) ** 2 * laplace.error()
    sigma = gaussian_sigma(2 * gaussian.bound, epsilon=epsilon, delta=delta)
    return gaussian if sigma**2 * gaussian.error() < by_laplace else laplace

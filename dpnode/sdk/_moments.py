"""Covariance, correlation and least squares from one release of each row's moments.

Each row's columns are centred on the middle of their public bounds and scaled by half their
width, ``u = (x - mid) / half`` in ``[-1, 1]``, and the row becomes one vector of the moments
the statistic needs::

    [a * u_i  (every column),  b * (u_i^2 - 1)  (every feature),  c * u_i u_j  (pairs i < j)]

whose norm is bounded from the public bounds alone. The node clips each row to that norm
(``clip_by_subject_norm``, so the bound holds whatever the rows are), sums the rows and
noises the sum once: a replaced row moves it by twice the bound. Everything after (means,
the covariance, the correlations, the normal equations) is computed here from the noised
sums and the public row count: post-processing, free.

Three choices make the noise small, each measured in ``bench/moments.py``:

* **the squares enter as** ``u^2 - 1`` (in ``[-1, 0]``, recovered exactly from the public row
  count): a row at the corners of the bounds, whose first moments and products are the
  largest, adds nothing to them, and a row in the middle, whose squares are the largest,
  adds nothing to the rest. For two columns the L1 norm of a row's vector is at most 3,
  against 5 with the squares as they are (4 with them centred on 1/2): the noise of a
  two-column covariance is 0.6 of what the plain vector needs.
* **weights per part** (``a``, ``b``, ``c``): the first moments only enter through the
  columns' means times their noise, so they get a smaller share of the norm. The weights
  minimise the covariance's expected squared error in the scaled units, for columns whose
  means lie half-way between the middle and an end of their bounds (:data:`PRIOR_MEAN`: the
  data cannot be looked at to choose them); a further 5 to 10 % less error.
* **the norm**: L1 with Laplace noise (pure epsilon) or L2 with Gaussian noise (with
  ``delta``), whichever gives the smaller expected error at the publish's epsilon and delta
  (:func:`choose_plan`): L1 up to four columns at delta 1e-6 and epsilon 1, L2 from five on.

The row's norm bound is exact (the largest norm over the box of the bounds, in closed form:
:meth:`MomentPlan.bound`), so no row that respects its bounds is ever clipped and the
release is unbiased.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dpnode.core.dp.accounting import gaussian_sigma
from dpnode.sdk._exceptions import DPNodeError, PrivacyTrackingError
from dpnode.sdk._remote import RemoteTensor
from dpnode.sdk._remote.graph import Node

if TYPE_CHECKING:
    from dpnode.sdk._publish import Receipt

__all__ = [
    "PRIOR_MEAN",
    "MomentPlan",
    "MomentRelease",
    "Moments",
    "choose_plan",
    "decode",
    "moment_release",
    "release_moments",
    "weighted_plan",
]

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


@dataclass(frozen=True)
class Moments:
    """Released moments of ``columns`` columns over ``rows`` rows, in the scaled units
    ``u = (x - mid) / half``: the sums of ``u`` and of the products ``u_i u_j`` (NaN where
    not released: the target's square). Means, covariances and correlations in the columns'
    own units are computed from them (post-processing)."""

    rows: int
    mid: torch.Tensor
    half: torch.Tensor
    sums: torch.Tensor
    products: torch.Tensor
    plan: MomentPlan
    receipt: Receipt

    def mean(self) -> torch.Tensor:
        """Each column's mean."""
        return self.mid + self.half * self.sums / self.rows

    def scaled_cov(self, correction: int = 1) -> torch.Tensor:
        """The features' covariance matrix in the scaled units, projected onto the positive
        semidefinite matrices (its negative eigenvalues set to 0: the true covariance is
        positive semidefinite, so this never moves the release further from it in the
        Frobenius norm)."""
        k, s = self.plan.features, self.sums[: self.plan.features]
        raw = (self.products[:k, :k] - torch.outer(s, s) / self.rows) / (self.rows - correction)
        values, vectors = torch.linalg.eigh((raw + raw.T) / 2)
        projected: torch.Tensor = (vectors * values.clamp(min=0)) @ vectors.T
        return (projected + projected.T) / 2  # exactly symmetric, as the rounding is not

    def cov(self, correction: int = 1) -> torch.Tensor:
        """The features' covariance matrix (``torch.cov``'s, with its ``correction``)."""
        h = self.half[: self.plan.features]
        return self.scaled_cov(correction) * torch.outer(h, h)

    def corrcoef(self) -> torch.Tensor:
        """The features' correlation matrix, in ``[-1, 1]``, from the projected covariance.
        A feature whose projected variance is 0 (the noise could not tell it from a constant)
        gets NaN in its row and column, as ``torch.corrcoef`` gives a constant."""
        c = self.scaled_cov()
        d = torch.diagonal(c)
        positive = d > 0
        inverse = torch.where(positive, d.clamp(min=1e-300).rsqrt(), torch.nan)
        r = (c * torch.outer(inverse, inverse)).clamp(-1, 1)  # NaN stays NaN
        r[positive, positive] = 1.0
        return r


@dataclass(frozen=True)
class MomentRelease:
    """The remote vector of a moment release (:attr:`vector`: publish it, alone or with other
    tensors, at the epsilon and delta its plan was chosen for) and how to read it back."""

    vector: RemoteTensor
    plan: MomentPlan
    rows: int
    mid: torch.Tensor
    half: torch.Tensor

    def finish(self, released: torch.Tensor, receipt: Receipt) -> Moments:
        """The moments from the published :attr:`vector`."""
        return decode(self.plan, self.rows, self.mid, self.half, released, receipt)


def decode(
    plan: MomentPlan,
    rows: int,
    mid: torch.Tensor,
    half: torch.Tensor,
    released: torch.Tensor,
    receipt: Any,
) -> Moments:
    """The moments from a released vector laid out as ``plan`` says (weights undone, the
    squares' offset added back from the public row count ``rows``)."""
    k, cols = plan.features, plan.columns
    v = released.to(torch.float64)
    sums = v[:cols] / plan.first
    products = torch.full((cols, cols), torch.nan, dtype=torch.float64)
    idx = torch.arange(k)
    products[idx, idx] = v[cols : cols + k] / plan.square + rows
    for (i, j), value in zip(plan.pairs(), v[cols + k :] / plan.cross, strict=True):
        products[i, j] = products[j, i] = value
    return Moments(rows, mid, half, sums, products, plan, receipt)


def moment_release(
    x: torch.Tensor,
    *,
    epsilon: float,
    delta: float | None = None,
    target: bool = False,
    plan: MomentPlan | None = None,
    client: Any = None,
) -> MomentRelease:
    """The clipped moment vector of the rows of remote ``x`` (``(rows, columns)``), unpublished.

    One free request asks the node for the columns' public bounds.

    Args:
        x: remote rows; each column needs finite bounds (declared at upload, or a clamp).
        epsilon, delta: the publish's, to choose the norm (:func:`choose_plan`).
        target: the last column is a target (least squares): its sum and its products
            with the other columns, not its square.
        plan: the weights and norm to use instead of :func:`choose_plan`'s.
        client: the node session (default: the one the data came from).

    Raises:
        DPNodeError: ``x`` is not remote ``(rows, columns)``.
        PrivacyTrackingError: a column has no finite bounds (the message names the dataset
            columns it comes from); nothing is charged.
    """
    from dpnode.sdk._per_sample import clipped_sum
    from dpnode.sdk._scaling import tracked_ranges

    if not isinstance(x, RemoteTensor) or x.dim() != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise DPNodeError("moments need a remote (rows, columns) tensor with rows and columns")
    rows, cols = int(x.shape[0]), int(x.shape[1])
    features = cols - int(target)
    if features < 1:
        raise DPNodeError("moments need at least one column besides the target")
    xf: Any = x.to(torch.float64)
    try:
        ranges = tracked_ranges([xf[:, j] for j in range(cols)], client=client)
    except PrivacyTrackingError as exc:  # a column the tracker cannot bound at all
        found = re.match(r"output ([0-9]+):", exc.detail)
        if found is None:
            raise
        detail = f"{_unbounded_message(xf, [int(found.group(1))])} ({exc.detail})"
        raise PrivacyTrackingError(detail, status=exc.status, code=exc.code) from exc
    unbounded = [j for j, (lo, hi) in enumerate(ranges) if not _finite(lo, hi)]
    if unbounded:
        raise DPNodeError(_unbounded_message(xf, unbounded))
    lo = torch.tensor([r[0] for r in ranges], dtype=torch.float64)
    hi = torch.tensor([r[1] for r in ranges], dtype=torch.float64)
    mid, half = (lo + hi) / 2, ((hi - lo) / 2).clamp(min=1e-300)
    plan = plan or choose_plan(features, target=target, epsilon=epsilon, delta=delta)
    u: Any = ((xf - mid) / half).clamp(-1, 1)  # the clamp only absorbs rounding
    parts = [u * plan.first, (u[:, :features] ** 2 - 1) * plan.square]
    pairs = plan.pairs()
    if pairs:
        left = torch.tensor([i for i, _ in pairs])
        right = torch.tensor([j for _, j in pairs])
        parts.append(u.index_select(1, left) * u.index_select(1, right) * plan.cross)
    # a whisker above the exact bound: a row at the bounds' corners is not clipped by rounding
    vector = clipped_sum(parts, max_norm=plan.bound * (1 + 1e-9), ord=plan.order)
    return MomentRelease(vector, plan, rows, mid, half)


def release_moments(
    x: torch.Tensor,
    *,
    epsilon: float,
    delta: float | None = None,
    target: bool = False,
    client: Any = None,
) -> Moments:
    """:func:`moment_release` published on its own: the moments of ``x``'s rows, charged once.

    Raises:
        DPNodeError: as :func:`moment_release`.
        BudgetExceededError, GraphError: as :func:`sdk.publish`.
    """
    from dpnode.sdk._publish import publish

    release = moment_release(x, epsilon=epsilon, delta=delta, target=target, client=client)
    released = publish(
        release.vector,
        epsilon=epsilon,
        delta=delta if release.plan.order == 2 else None,
        client=client,
    )
    return release.finish(released, released.receipt)


def _finite(lo: float, hi: float) -> bool:
    return math.isfinite(lo) and math.isfinite(hi)


def _inputs_under(node: Node) -> list[str]:
    """The dataset columns ``node`` is computed from, in the order met."""
    seen: set[int] = set()
    found: list[str] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.op == "input" and n.private and _column_name(n) not in found:
            found.append(_column_name(n))
        stack.extend(a for a in reversed(n.args) if type(a) is Node)
    return found


def _feature_columns(node: Node, axis: int, index: int) -> list[str]:
    """The dataset columns feature ``index`` along ``axis`` of ``node`` is computed from,
    following the views and concatenations that ``torch.stack``, ``.T`` and ``x[:, j]``
    record; past any other op, every column under it."""
    while True:
        op, attrs = node.op, node.attrs
        args = [a for a in node.args if type(a) is Node]
        if op == "slice" and attrs["dim"] == axis:
            index = attrs["start"] + index * attrs["step"]
        elif op == "permute":
            axis = attrs["dims"][axis]
        elif op == "squeeze" and args[0].shape is not None:
            rank = len(args[0].shape)
            dims = {d % rank for d in attrs["dims"]}
            axis = [d for d in range(rank) if d not in dims][axis]
        elif op == "unsqueeze":
            if attrs["dim"] == axis:
                return _inputs_under(args[0])
            axis -= int(attrs["dim"] < axis)
        elif op == "cat" and attrs["dim"] == axis:
            for piece in args:
                size = _size(piece, axis)
                if size is None:
                    break
                if index < size:
                    node = piece
                    break
                index -= size
            else:
                return _inputs_under(node)
            if size is None:
                return _inputs_under(node)
            continue
        elif op != "convert_element_type" or len(args) != 1:
            return _inputs_under(node)
        node = args[0]


def _size(node: Node, axis: int) -> int | None:
    if node.shape is not None:
        return int(node.shape[axis])
    if node.op == "unsqueeze" and node.attrs["dim"] == axis:
        return 1
    return None


def _column_name(node: Node) -> str:
    return str(node.attrs["name"]).split("/", 1)[-1]


def _unbounded_message(x: torch.Tensor, unbounded: list[int]) -> str:
    assert isinstance(x, RemoteTensor)
    where = []
    for j in unbounded:
        names = _feature_columns(x.node, 1, j)
        where.append(f"column {j} (from {', '.join(map(repr, names))})" if names else f"column {j}")
    return (
        f"moments need every column's public range, and {'; '.join(where)} has no finite "
        "bounds: declare bounds at upload, or clamp the values first (x.clamp(low, high))"
    )

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

A correlation divides a covariance by the two standard deviations, and where the noise is of
the size of the variances (a few columns of a small table), the noise on the covariances,
divided by variances the noise itself has made small, becomes correlations of noise, large in
size. So each variance divides no lower than :data:`VARIANCE_FLOOR` (2) standard deviations of
its own noise (known from the receipt's scale, the plan's weights and the released sums): where
the signal is well above the noise nothing changes, and where it is not, the correlations
shrink towards 0 (on 178 rows of five columns at epsilon 1, a mean absolute error of 0.43 where
it was 0.52; a bias that costs a strong correlation released within the noise:
docs/performance.md).

The row's norm bound is exact (the largest norm over the box of the bounds, in closed form:
:meth:`MomentPlan.bound`), so no row that respects its bounds is ever clipped and the
release is unbiased.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dpnode.sdk._exceptions import DPNodeError, PrivacyTrackingError
from dpnode.sdk._moment_plans import PRIOR_MEAN, MomentPlan, choose_plan, weighted_plan
from dpnode.sdk._remote import RemoteTensor
from dpnode.sdk._remote.graph import Node

if TYPE_CHECKING:
    from dpnode.sdk._publish import Receipt

#: a correlation's divisor, each feature's variance, is at least this many standard deviations
#: of its noise (measured in ``bench/utility_stats``: docs/performance.md)
VARIANCE_FLOOR = 2.0

__all__ = [
    "PRIOR_MEAN",
    "VARIANCE_FLOOR",
    "MomentPlan",
    "MomentRelease",
    "Moments",
    "choose_plan",
    "decode",
    "moment_release",
    "release_moments",
    "weighted_plan",
]


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

    def var(self, correction: int = 1) -> torch.Tensor:
        """Each feature's variance (the projected covariance's diagonal: never negative)."""
        return torch.diagonal(self.cov(correction)).clone()

    def std(self, correction: int = 1) -> torch.Tensor:
        """Each feature's standard deviation."""
        return self.var(correction).sqrt()

    def noise_sd(self) -> float | None:
        """The standard deviation of the noise on each coordinate of the released vector
        (before its weights are undone), from the receipt; None without one."""
        scale = getattr(self.receipt, "noise_scale", None)
        if scale is None:
            return None
        laplace = getattr(self.receipt, "mechanism", "laplace") == "laplace"
        return float(scale) * (math.sqrt(2) if laplace else 1.0)

    def variance_noise_sd(self, noise: float) -> torch.Tensor:
        """The standard deviation of the noise on each feature's scaled variance, for a noise of
        standard deviation ``noise`` on each coordinate of the vector: from its square's sum
        and, through the squared mean, its sum (to first order, at the released sums)."""
        k = self.plan.features
        mean = self.sums[:k] / self.rows
        square, first = noise / self.plan.square, noise / self.plan.first
        return (square**2 + (2 * mean * first) ** 2).sqrt() / (self.rows - 1)

    def corrcoef(self, noise: float | None = None) -> torch.Tensor:
        """The features' correlation matrix, in ``[-1, 1]``, from the projected covariance.

        A variance divides its correlations only down to :data:`VARIANCE_FLOOR` standard
        deviations of its noise: below that the noise cannot tell it from a smaller one, and
        dividing by it would turn the noise on the covariances into large correlations (see
        the module's docstring). A feature whose projected variance is 0 (the noise could
        not tell it from a constant) has no covariance left either (the projection is
        positive semidefinite), so its correlations are 0 and its own 1: the release says
        nothing of them, rather than NaN. Only without a noise to go by (``noise`` 0, or
        no receipt) does such a feature get NaN in its row and column, as
        ``torch.corrcoef`` gives for a constant.

        Args:
            noise: the standard deviation of the noise on each coordinate of the released
                vector (default: the receipt's, :meth:`noise_sd`; None and no receipt: no
                floor).
        """
        c = self.scaled_cov()
        d = torch.diagonal(c)
        positive = d > 0
        noise = self.noise_sd() if noise is None else noise
        if noise is not None:
            d = torch.maximum(d, VARIANCE_FLOOR * self.variance_noise_sd(noise))
        noised = noise is not None and noise > 0
        known = positive | noised
        inverse = torch.where(known, d.clamp(min=1e-300).rsqrt(), torch.nan)
        r = (c * torch.outer(inverse, inverse)).clamp(-1, 1)  # NaN stays NaN
        r[known, known] = 1.0  # the masks index in pairs: the diagonal
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
    subjects: torch.Tensor | None = None,
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
        subjects: int64 ``(rows,)``, which rows belong to one subject (a dataset's
            ``subjects``, or its rows of ``x``): their moments are summed, then clipped as one
            vector. None: each row is clipped on its own, and the node charges a subject's
            most rows times the bound.
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
    vector = clipped_sum(parts, max_norm=plan.bound * (1 + 1e-9), groups=subjects, ord=plan.order)
    return MomentRelease(vector, plan, rows, mid, half)


def release_moments(
    x: torch.Tensor,
    *,
    epsilon: float,
    delta: float | None = None,
    target: bool = False,
    subjects: torch.Tensor | None = None,
    client: Any = None,
) -> Moments:
    """:func:`moment_release` published on its own: the moments of ``x``'s rows, charged once.

    Raises:
        DPNodeError: as :func:`moment_release`.
        BudgetExceededError, GraphError: as :func:`sdk.publish`.
    """
    from dpnode.sdk._publish import publish

    release = moment_release(
        x, epsilon=epsilon, delta=delta, target=target, subjects=subjects, client=client
    )
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

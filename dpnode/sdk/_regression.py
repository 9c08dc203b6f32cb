"""Linear and logistic regression on remote data.

**Linear regression**, from noised sufficient statistics.

``sdk.linear_regression(X, y, epsilon=1.0)`` releases the sufficient statistics of least
squares as one clipped vector per row (:mod:`dpnode.sdk._moments`): each feature and the
target centred on the middle of their public bounds and scaled by half their width, the
row's sums, the features' squares and products, and their products with the target, with
the norm bounded from the bounds, summed and noised once. The normal equations are solved
here (post-processing, free) in those scaled units, which keeps them well conditioned
whatever the features' units, and the coefficients mapped back. The noised Gram matrix,
where the noise has made it indefinite, is shifted by the smallest ridge that makes it
positive definite plus the noise's scale, so that the solve is stable; pass ``ridge=`` to
choose it yourself.

**Logistic regression**, by private gradient descent. Its sufficient statistics do not help
here: a second-order one (``X^T X``) carries noise for ``|x|^2`` per entry, far above its
signal on a few hundred rows of tens of features. ``sdk.logistic_regression(X, y,
epsilon=1.0)`` instead runs :func:`sdk.private_training` on a linear model (every step one
ordinary clipped-gradient publish, the run planned to ``epsilon`` on the node's ledger) with
what the measurements in ``docs/performance.md`` found a small table needs and a hand-written
loop rarely does:

* each feature centred and scaled into ``[-1, 1]`` by its **public** bounds (the node's
  tracker reports them, free: ``/sensitivity``), so that the rows' clipped gradients point
  apart by class instead of all along the features' mean: on breast cancer (455 rows, 30
  features in ``[0, 1]``) this alone took validation accuracy at epsilon 1 from 0.89 to 0.92
  (8 seeds, the same steps and optimizer);
* weights starting at zero (the loss is convex: no random start to spread the runs);
* Adam, whose per-coordinate steps suit noise-dominated gradients, at a learning rate and a
  step count fixed in advance (40 steps, 0.2), and a clipping bound below every row's
  gradient (all rows clipped: the bound then only scales the noise and the signal together).

The fitted weights are mapped back to the original features (post-processing, free).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from dpnode.sdk._averaging import DEFAULT_AVERAGE
from dpnode.sdk._exceptions import DPNodeError
from dpnode.sdk._remote import RemoteTensor
from dpnode.sdk._scaling import bounds_scaler

if TYPE_CHECKING:
    from dpnode.sdk._moments import Moments
    from dpnode.sdk._publish import Receipt
    from dpnode.sdk._training import PrivateTraining

__all__ = [
    "LinearRegression",
    "LogisticRegression",
    "fit_from_moments",
    "linear_regression",
    "logistic_regression",
]

#: logistic_regression's defaults (chosen on a validation split of the benchmark's training
#: rows only: docs/performance.md, "Private training against Opacus")
LOGISTIC_STEPS = 40
LOGISTIC_LR = 0.2
#: below every row's gradient at the start (0.5 |x| >= 0.5 for features in [-1, 1] and the
#: intercept's 1), so every row is clipped: with Adam the bound then cancels out
LOGISTIC_CLIP = 0.5


@dataclass(frozen=True)
class LinearRegression:
    """A fitted linear model: ``y ~ X @ coef + intercept``, and the publish's receipt."""

    coef: torch.Tensor
    intercept: float
    ridge: float
    receipt: Receipt

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.coef.dtype) @ self.coef + self.intercept


def linear_regression(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epsilon: float,
    delta: float | None = None,
    fit_intercept: bool = True,
    ridge: float | None = None,
) -> LinearRegression:
    """Least squares of ``y`` on ``x`` from one release of their sufficient statistics.

    Args:
        x: remote ``(rows, features)`` features, each with finite public bounds.
        y: remote ``(rows,)`` targets, with finite public bounds.
        epsilon, delta: the release's privacy: Laplace without ``delta``; with it, Gaussian
            or Laplace, whichever noises less (see :func:`dpnode.sdk._moments.choose_plan`).
        fit_intercept: fit an intercept (the features are then centred on the middle of
            their bounds; without it, only scaled).
        ridge: added to the diagonal of the features' Gram matrix, in the features' units
            scaled by half their bounds' width (the intercept is not penalised); ``None``
            chooses it from the noise (see the module docstring).

    Raises:
        DPNodeError: ``x`` or ``y`` not remote, or their shapes do not match.
        PrivacyTrackingError: a feature or the target has no finite bounds (named).
    """
    from dpnode.sdk._moments import release_moments

    if not (isinstance(x, RemoteTensor) and isinstance(y, RemoteTensor)):
        raise DPNodeError("linear_regression needs remote x and y (a dataset's columns)")
    if x.dim() != 2 or y.shape != (x.shape[0],):
        raise DPNodeError(
            f"x must be (rows, features) and y (rows,): got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if ridge is not None and not (math.isfinite(ridge) and ridge >= 0):
        raise DPNodeError(f"ridge must be a finite number >= 0, got {ridge!r}")
    rows = torch.cat([x.to(torch.float64), y.to(torch.float64).unsqueeze(1)], dim=1)
    m = release_moments(rows, epsilon=epsilon, delta=delta, target=True)
    noise = float(m.receipt.noise_scale) / m.plan.cross
    coef, intercept, ridge = fit_from_moments(
        m, fit_intercept=fit_intercept, ridge=ridge, noise=noise
    )
    return LinearRegression(coef, intercept, ridge, m.receipt)


def fit_from_moments(
    m: Moments, *, fit_intercept: bool, ridge: float | None, noise: float
) -> tuple[torch.Tensor, float, float]:
    """Least squares of the last column of released moments (a target) on the others:
    ``(coef, intercept, ridge)`` in the columns' units. ``noise``: the scale of the noise on
    the released products (scaled units), the default ridge's share beyond the shift that
    makes the Gram matrix positive definite."""
    k, n = m.plan.features, float(m.rows)
    s, p = m.sums, m.products
    sx, sy = s[:k], s[k]
    if fit_intercept:  # centred on the noised means: the normal equations with an intercept
        gram = p[:k, :k] - torch.outer(sx, sx) / n
        moment = p[:k, k] - sx * sy / n
    else:  # in x / half: u plus the constant mid / half
        c = m.mid / m.half
        cx, cy = c[:k], c[k]
        gram = n * torch.outer(cx, cx) + torch.outer(cx, sx) + torch.outer(sx, cx) + p[:k, :k]
        moment = n * cx * cy + cx * sy + sx * cy + p[:k, k]
    if ridge is None:
        ridge = max(0.0, -float(torch.linalg.eigvalsh(gram).min())) + noise
    w = torch.linalg.solve(gram + ridge * torch.eye(k, dtype=gram.dtype), moment)
    hx, hy = m.half[:k], m.half[k]
    coef = w * hy / hx
    if not fit_intercept:
        return coef, 0.0, ridge
    w0 = (sy - w @ sx) / n
    return coef, float(m.mid[k] + hy * (w0 - w @ (m.mid[:k] / hx))), ridge


@dataclass(frozen=True)
class LogisticRegression:
    """A fitted logistic model: ``P(y = 1 | x) = sigmoid(x @ coef + intercept)``, in the units
    of the features given, and the training run that released it (its receipts, its
    epsilon as the ledger counts it)."""

    coef: torch.Tensor
    intercept: float
    run: PrivateTraining

    @property
    def epsilon(self) -> float:
        """What the fit cost, as the node's ledger counts it."""
        return self.run.epsilon

    def decision_function(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.coef.dtype) @ self.coef + self.intercept

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.decision_function(x))

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return (self.decision_function(x) > 0).long()


def logistic_regression(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epsilon: float,
    steps: int = LOGISTIC_STEPS,
    lr: float = LOGISTIC_LR,
    max_grad_norm: float = LOGISTIC_CLIP,
    subjects: Any = None,
    progress: bool | None = None,
    client: Any = None,
    average: str | None = DEFAULT_AVERAGE,
) -> LogisticRegression:
    """Logistic regression of binary ``y`` on ``x`` by private gradient descent.

    A run of :func:`sdk.private_training` (full-batch steps, each row's gradient clipped to
    ``max_grad_norm``, Gaussian noise; planned so that the node's ledger counts the whole
    fit at most ``epsilon`` at your allowance's delta) on a linear model over the features
    centred and scaled into ``[-1, 1]`` by their public bounds, from zero weights, with
    Adam (see the module docstring for why each). Nothing but the run's steps is charged.

    Args:
        x: remote ``(rows, features)`` features, with finite bounds (a dataset's columns, or
            computed from them).
        y: remote ``(rows,)`` labels, 0 or 1 (or bool).
        epsilon: what the whole fit may cost, as the node's ledger counts it.
        steps, lr, max_grad_norm: the run's step count, Adam's learning rate and the
            clipping bound; the defaults suit tables of a few hundred rows and more.
        subjects: which rows belong to one subject (see :func:`sdk.publish_grads`).
        progress: show the run's progress bar.
        client: the node session (default: the one the data came from).
        average: which average of the run's iterates the fit keeps (``"ema"``, ``"tail"``
            or ``None``, the last; see :func:`sdk.private_training`), free of charge.

    Raises:
        DPNodeError: ``x`` or ``y`` not remote, their shapes do not match, or a feature has
            no finite bound.
        BudgetExceededError, ApprovalRequiredError, PolicyRefusedError: as for
            :func:`sdk.private_training`, before any step.
    """
    from dpnode.sdk._training import private_training

    if not (isinstance(x, RemoteTensor) and isinstance(y, RemoteTensor)):
        raise DPNodeError("logistic_regression needs remote x and y (a dataset's columns)")
    if x.dim() != 2 or y.shape != (x.shape[0],):
        raise DPNodeError(
            f"x must be (rows, features) and y (rows,): got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    scaler = bounds_scaler(x, client=client)
    model = torch.nn.Linear(x.shape[1], 1)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    scaled = scaler(x)
    run = private_training(
        model,
        torch.optim.Adam(model.parameters(), lr=lr),
        (scaled, y),
        loss_fn=_logistic_loss,
        target_epsilon=epsilon,
        steps=steps,
        max_grad_norm=max_grad_norm,
        loss_bound=None,
        subjects=subjects,
        progress=progress,
        client=client,
        average=average,
    )
    run.fit()
    # sigmoid(w . ((x - mid) * scale) + b) = sigmoid((w * scale) . x + b - (w * scale) . mid)
    coef = model.weight.detach()[0] * scaler.scale
    intercept = float(model.bias.detach()[0] - coef @ scaler.mid)
    return LogisticRegression(coef, intercept, run)


def _logistic_loss(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(out.squeeze(1), y.float(), reduction=reduction)

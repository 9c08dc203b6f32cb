"""Linear regression on remote data, from noised sufficient statistics.

``sdk.linear_regression(X, y, epsilon=1.0)`` releases ``X^T X``, ``X^T y`` and the sums of
``X`` and ``y`` in one publish, charged once, assembles ``Z^T Z`` and ``Z^T y`` (``Z`` is
``X`` with a column of ones for the intercept: its block of ``Z^T Z`` is the public row
count) and solves the normal equations here: post-processing, free. The noised ``Z^T Z``
is made symmetric (the average with its transpose, which only removes noise) and, where the
noise has made it indefinite,
shifted by the smallest ridge that makes it positive definite plus the noise's scale, so that
the solve is stable; pass ``ridge=`` to choose it yourself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sdk._exceptions import DPNodeError
from sdk._remote import RemoteTensor

if TYPE_CHECKING:
    from sdk._publish import Receipt

__all__ = ["LinearRegression", "linear_regression"]


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
        x: remote ``(rows, features)`` features (bounded by the dataset's declared bounds).
        y: remote ``(rows,)`` targets.
        epsilon, delta: the release's privacy (Laplace without ``delta``, else Gaussian).
        fit_intercept: add a column of ones.
        ridge: added to the diagonal of ``Z^T Z`` before solving; ``None`` chooses it from
            the noise (see the module docstring).

    Raises:
        DPNodeError: ``x`` or ``y`` not remote, or their shapes do not match.
    """
    from sdk._publish import publish

    if not (isinstance(x, RemoteTensor) and isinstance(y, RemoteTensor)):
        raise DPNodeError("linear_regression needs remote x and y (a dataset's columns)")
    if x.dim() != 2 or y.shape != (x.shape[0],):
        raise DPNodeError(
            f"x must be (rows, features) and y (rows,): got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if ridge is not None and not (math.isfinite(ridge) and ridge >= 0):
        raise DPNodeError(f"ridge must be a finite number >= 0, got {ridge!r}")
    xf, yf = x.to(torch.float64), y.to(torch.float64)
    # Z^T Z and Z^T y in blocks: the column of ones is public, so its blocks are sums
    xx, xs, xy, ys = publish(
        [xf.T @ xf, xf.sum(0), xf.T @ yf, yf.sum()], epsilon=epsilon, delta=delta
    )
    receipt = xx.receipt
    gram, moment = (xx + xx.T) / 2, xy
    if fit_intercept:
        rows = float(x.shape[0])
        gram = torch.cat(
            [
                torch.cat([gram, xs.unsqueeze(1)], dim=1),
                torch.cat([xs, torch.tensor([rows], dtype=xs.dtype)]).unsqueeze(0),
            ]
        )
        moment = torch.cat([xy, ys.reshape(1)])
    k = gram.shape[0]
    if ridge is None:
        lowest = float(torch.linalg.eigvalsh(gram).min())
        ridge = max(0.0, -lowest) + float(receipt.noise_scale)
    w = torch.linalg.solve(gram + ridge * torch.eye(k, dtype=gram.dtype), moment)
    if fit_intercept:
        return LinearRegression(w[:-1], float(w[-1]), ridge, receipt)
    return LinearRegression(w, 0.0, ridge, receipt)

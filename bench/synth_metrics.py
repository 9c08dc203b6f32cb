"""The synthetic-data bench's utility measures, on binned codes.

* :func:`marginal_error`: the average L1 distance between the real and synthetic normalised
  marginals, over every 1-way and 2-way marginal (0: the same marginals; at most 2);
* :func:`accuracy`: train on synthetic, test on real: a logistic regression fitted on the
  synthetic rows (every other column one-hot encoded) predicting the target column, scored
  on real rows the synthesizer never saw.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from dpnode.core.synth.mst import marginal

Codes = npt.NDArray[np.int64]


def marginal_error(real: Codes, synthetic: Codes, sizes: Sequence[int]) -> float:
    """Average L1 distance of the normalised 1- and 2-way marginals.

    >>> real = np.array([[0, 1], [1, 0], [1, 1], [0, 0]])
    >>> marginal_error(real, real, [2, 2])
    0.0
    >>> round(marginal_error(real, np.array([[0, 0], [1, 1]] * 2), [2, 2]), 3)
    0.333
    """
    d, out = len(sizes), []
    for k in (1, 2):
        for cols in itertools.combinations(range(d), k):
            shape = [sizes[c] for c in cols]
            p = marginal(real[:, list(cols)], shape) / real.shape[0]
            q = marginal(synthetic[:, list(cols)], shape) / synthetic.shape[0]
            out.append(float(np.abs(p - q).sum()))
    return float(np.mean(out))


def one_hot(codes: Codes, sizes: Sequence[int]) -> npt.NDArray[np.float64]:
    """Each column's codes as indicator columns (``sum(sizes)`` of them).

    >>> one_hot(np.array([[0, 2], [1, 0]]), [2, 3]).tolist()
    [[1.0, 0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0, 0.0]]
    """
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    out = np.zeros((codes.shape[0], int(sum(sizes))))
    np.put_along_axis(out, codes + offsets, 1.0, axis=1)
    return out


def accuracy(synthetic: Codes, test: Codes, sizes: Sequence[int], target: int) -> float:
    """Train on ``synthetic``, test on the real held-out ``test`` rows: the share of test rows
    whose ``target`` a logistic regression on the other columns (one-hot) gets right. A
    synthetic table with a single class predicts that class."""
    from sklearn.linear_model import LogisticRegression

    features = [j for j in range(len(sizes)) if j != target]
    widths = [sizes[j] for j in features]
    x_train, y_train = one_hot(synthetic[:, features], widths), synthetic[:, target]
    x_test, y_test = one_hot(test[:, features], widths), test[:, target]
    classes = np.unique(y_train)
    if classes.size < 2:
        return float(np.mean(y_test == classes[0]))
    with warnings.catch_warnings():  # a noisy synthetic table may not converge in 1000 steps
        warnings.simplefilter("ignore")
        model = LogisticRegression(max_iter=1000).fit(x_train, y_train)
    return float(np.mean(model.predict(x_test) == y_test))

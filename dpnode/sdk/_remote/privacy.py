"""Which recorded values are private, and the record-time refusal of public-only prims.

Every prim declares in the engine's registry whether it may touch private data
(``PrimDef.privacy == "rule"``: the node's privacy layer has a rule for it) or is
public-only (no rule). The node refuses, at publish, any graph that applies a
public-only prim to private data; the SDK refuses it earlier, as the op is recorded,
with :class:`~sdk.NotPublishableError` naming the torch call that was written.

What is private is decided from public metadata only, never from a value:

- the values of a dataset's columns (inputs named ``dataset:<id>/<column>``) are
  private, and so is everything computed from a private value;
- local tensors (constants), model weights (``model:<id>/<tensor>``: the node computes a
  publish from a model's weights only where the caller may see them) and a dataset's
  subject grouping (``dataset:<id>/@subject``) are public, and so is everything
  computed from public values only.

The torch call named is the outermost torch function that received a remote tensor
(``RemoteTensor.__torch_function__`` remembers it while it runs): ``torch.median``, not
the ``argsort`` its decomposition records. Inside ``loss.backward()`` the ops come from
autograd, and the refusal names the backward call and the autograd node computing the
gradient.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import torch

from dpnode.core.engine import REGISTRY
from dpnode.sdk._exceptions import NotPublishableError

__all__ = [
    "CALLS",
    "PUBLIC_ONLY",
    "display_call",
    "is_private_input",
    "not_publishable",
    "not_selectable",
]

#: prims without a privacy rule: they may only ever see public values
PUBLIC_ONLY: frozenset[str] = frozenset(
    name for name, d in REGISTRY.items() if d.privacy == "public_only"
)

_PRIVATE_INPUT = re.compile(r"^dataset:\d+/(?!@subject$)")


def is_private_input(name: str) -> bool:
    """Whether the graph input ``name`` holds private values (a dataset's column)."""
    return _PRIVATE_INPUT.match(name) is not None


class _Calls(threading.local):
    #: the outermost torch function running on a remote tensor, if any
    func: Any = None


CALLS = _Calls()

_DOCS = "docs/prims.md lists the prims with and without a privacy rule"

_ORDER = (
    "Sorts, top-k and running max/min of private values have no sensitivity bound. A median "
    "or quantiles of all of a tensor's elements publish by the exponential mechanism: "
    "torch.median(x) or torch.quantile(x, q) (along a dim: one column at a time, x[:, j]); "
    "or compare against public thresholds, e.g. (x <= t).float().mean() for a public t."
)
_MATRIX = (
    "Decompositions, inverses and solves of a private matrix have no privacy rule: publish "
    "the matrix they start from (e.g. (X.T @ X).publish(epsilon=...)) and factor, invert or "
    "solve the published, public matrix locally; for least squares, "
    "sdk.linear_regression(X, y, epsilon=...) does exactly that."
)
_POLYNOMIAL = (
    "For a public degree, write its three-term recurrence with mul and sub, which have "
    "privacy rules (e.g. T(k+1) = 2 * x * T(k) - T(k-1) for Chebyshev's T)."
)
_WRITE = (
    "Writing private values at chosen positions has no privacy rule: build the result with "
    "torch.where over a public mask, or torch.cat of slices."
)
_CONV = (
    "A convolution's weight gradient on private data is recorded per example when the "
    "input is batched, (N, C, ...): add a batch dimension (x.unsqueeze(0)); a transposed "
    "convolution's is not."
)

#: prim -> what to write instead (where an obvious alternative exists)
ADVICE: dict[str, str] = {
    **dict.fromkeys(("argsort", "topk", "cumargmax", "cumargmin"), _ORDER),
    "searchsorted": (
        "torch.bucketize and torch.searchsorted against one sorted row of boundaries record "
        "as comparisons, which have privacy rules; for several rows, compare row by row: "
        "(x.unsqueeze(-1) >= row).sum(-1) is torch.bucketize(x, row, right=True)."
    ),
    "cumsum": (
        "A cumulative sum along the last dim is a product with a public triangular matrix: "
        "x @ torch.ones(n, n).triu() (matmul has a privacy rule)."
    ),
    "logcumsumexp": (
        "Along the last dim it is (x.exp() @ torch.ones(n, n).triu()).log(), whose ops have "
        "privacy rules."
    ),
    "prod": "For positive values, x.log().sum().exp() has privacy rules.",
    "copysign": "torch.where(y < 0, -x.abs(), x.abs()) has privacy rules.",
    "bitwise_left_shift": "Multiply by a power of two instead.",
    "bitwise_right_shift": "Floor-divide by a power of two instead.",
    "convolution_weight_grad": _CONV,
    **dict.fromkeys(("index_put", "scatter", "scatter_add", "scatter_reduce"), _WRITE),
    **dict.fromkeys(
        (
            "cholesky",
            "lu_factor",
            "lu_pivots",
            "lu_solve",
            "qr_q",
            "qr_r",
            "geqrf",
            "geqrf_tau",
            "householder_product",
            "ormqr",
            "ldl_factor",
            "ldl_pivots",
            "ldl_solve",
            "eigvalsh",
            "eigh_vectors",
            "svdvals",
            "svd_u",
            "svd_vh",
            "inv",
            "det",
            "slogdet",
            "matrix_exp",
            "solve",
            "solve_triangular",
        ),
        _MATRIX,
    ),
    **dict.fromkeys((n for n in REGISTRY if "_polynomial_" in n), _POLYNOMIAL),
}
_HISTOGRAM = (
    "A histogram over public bins is one comparison per bin: give the range, "
    "torch.histc(x, bins, min=lo, max=hi) or torch.histogram(x, bins, range=(lo, hi)), or "
    "write ((x.unsqueeze(-1) >= edges[:-1]) & (x.unsqueeze(-1) < edges[1:])).sum(0); without "
    "a range the edges come from the data's own minimum and maximum, which are private."
)
#: torch call -> what to write instead, where it says more than the prim's advice
CALL_ADVICE: dict[str, str] = dict.fromkeys(
    ("torch.histc", "Tensor.histc", "torch.histogram", "Tensor.histogram", "torch.histogramdd"),
    _HISTOGRAM,
)
_GENERIC = (
    "Publish what it applies to first and apply it to the published (public) values "
    "locally, or write it with ops that have privacy rules."
)


def display_call(func: Any) -> str:
    """How a torch function reads in a message: ``torch.median``, ``Tensor.cumsum_``."""
    name: str | None
    try:
        name = torch.overrides.resolve_name(func)
    except Exception:  # pragma: no cover - resolve_name only knows torch's own functions
        name = None
    if not name:
        module = getattr(func, "__module__", None) or ""
        qual = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
        name = f"{module}.{qual}" if module and qual else str(qual or func)
    name = name.removesuffix(".__get__")
    return name.removeprefix("torch.") if name.startswith("torch.Tensor.") else name


def _backward_call(func: Any) -> str:
    if func is None:
        return "the backward pass"
    shown = display_call(func)
    return f"{shown}()" if shown == "Tensor.backward" else shown


def not_publishable(prim: str) -> NotPublishableError:
    """The refusal of public-only ``prim`` on a private argument, naming the user's call."""
    func = CALLS.func
    grad_fn = torch._C._current_autograd_node()
    reason = f"needs prim {prim!r}, which has no privacy rule"
    if grad_fn is not None:  # recorded by autograd, inside a backward pass
        call = _backward_call(func)
        what = (
            f"{call} on private data cannot be published: the gradient through "
            f"{grad_fn.name()} {reason}"
        )
    else:
        call = display_call(func) if func is not None else "this op"
        what = f"{call} on private data cannot be published: it {reason}"
    advice = CALL_ADVICE.get(call) or ADVICE.get(prim, _GENERIC)
    error = NotPublishableError(
        f"{what}, so the node would refuse any result computed from it. {advice} ({_DOCS}.)"
    )
    error.call, error.prim = call, prim
    return error


def not_selectable() -> NotPublishableError:
    """The refusal of an op on a quantile of private values (released only on its own)."""
    call = display_call(CALLS.func) if CALLS.func is not None else "this op"
    error = NotPublishableError(
        f"{call} on a quantile (median) of private data cannot be published: such a quantile "
        "is released on its own, by the exponential mechanism. Publish it by itself "
        "(torch.median(x).publish(epsilon=...)) and compute with the published value."
    )
    error.call, error.prim = call, "quantile"
    return error

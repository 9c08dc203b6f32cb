"""Translate torch op calls (as OpInfo samples make them) into engine prims.

This is the test-side stand-in for the SDK's decomposition: a table from an
OpInfo name to a recipe that records prims on a :class:`GraphBuilder`. A
recipe raises :class:`Unsupported` for call forms the vocabulary does not
cover (the conformance summary counts those as skips, with the reason).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import torch

from dpnode.core.engine import GraphBuilder, Ref

TORCH_TO_NAME = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
NAME_TO_TORCH = {v: k for k, v in TORCH_TO_NAME.items()}


class Unsupported(Exception):
    """A call form outside the prim vocabulary."""


def to_numpy(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A torch tensor as the NumPy array the engine stores it as."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    if t.dtype not in TORCH_TO_NAME:
        raise Unsupported(f"dtype {t.dtype}")
    return t.contiguous().numpy().copy()


def to_torch(a: np.ndarray[Any, Any]) -> torch.Tensor:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True, order="C"))


class Recorder(GraphBuilder):
    """A builder that also remembers the torch tensor behind each input."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: dict[int, torch.Tensor] = {}
        self.feed: dict[str, np.ndarray[Any, Any]] = {}

    def tensor_input(self, t: torch.Tensor) -> Ref:
        name = f"t{len(self.feed)}"
        arr = to_numpy(t)
        ref = self.input(name, TORCH_TO_NAME[t.dtype], tuple(t.shape))
        self.tensors[ref.index] = t
        self.feed[name] = arr
        return ref

    def convert(self, obj: Any) -> Any:
        """Tensors (also inside lists/tuples) become graph inputs."""
        if isinstance(obj, torch.Tensor):
            return self.tensor_input(obj)
        if isinstance(obj, (list, tuple)):
            return type(obj)(self.convert(o) for o in obj)
        return obj

    def t(self, r: Ref) -> torch.Tensor:
        return self.tensors[r.index]


Recipe = Callable[..., Any]
RECIPES: dict[str, Recipe] = {}


def _no_kwargs(kwargs: dict[str, Any], allowed: tuple[str, ...] = ()) -> None:
    extra = set(kwargs) - set(allowed)
    if extra:
        raise Unsupported(f"kwargs {sorted(extra)}")


def unary(prim_name: str) -> Recipe:
    def r(b: Recorder, x: Ref, **kw: Any) -> Ref:
        _no_kwargs(kw)
        return b.op(prim_name, x)

    return r


def binary(prim_name: str) -> Recipe:
    def r(b: Recorder, x: Any, y: Any, **kw: Any) -> Ref:
        _no_kwargs(kw)
        return b.op(prim_name, x, y)

    return r


for _n in [
    "exp",
    "log",
    "log1p",
    "expm1",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "asinh",
    "acosh",
    "atanh",
    "erf",
    "erfc",
    "erfinv",
    "exp2",
    "log2",
    "log10",
    "reciprocal",
    "neg",
    "abs",
    "sign",
    "floor",
    "ceil",
    "trunc",
    "bitwise_not",
    "isnan",
    "isinf",
    "isfinite",
    "signbit",
    "logical_not",
]:
    RECIPES[_n] = unary(_n)
RECIPES["round"] = unary("round")
for _n in [
    "mul",
    "floor_divide",
    "pow",
    "remainder",
    "fmod",
    "maximum",
    "minimum",
    "atan2",
    "hypot",
    "copysign",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "logical_xor",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "bitwise_left_shift",
    "bitwise_right_shift",
]:
    RECIPES[_n] = binary(_n)
RECIPES["true_divide"] = binary("div")
RECIPES["div.no_rounding_mode"] = binary("div")


def _div_mode(b: Recorder, x: Any, y: Any, rounding_mode: str | None = None) -> Ref:
    return b.op(
        {None: "div", "floor": "floor_divide", "trunc": "trunc_divide"}[rounding_mode], x, y
    )


RECIPES["div.floor_rounding"] = _div_mode
RECIPES["div.trunc_rounding"] = _div_mode


def _add_sub(name: str) -> Recipe:
    def r(b: Recorder, x: Any, y: Any, alpha: Any = None) -> Ref:
        if alpha is not None:
            y = b.op("mul", y, alpha)
        return b.op(name, x, y)

    return r


RECIPES["add"] = _add_sub("add")
RECIPES["sub"] = _add_sub("sub")


def _round_decimals(b: Recorder, x: Ref, decimals: int = 0) -> Ref:
    if decimals == 0:
        return b.op("round", x)
    if decimals > 0:
        return b.op("div", b.op("round", b.op("mul", x, 10.0**decimals)), 10.0**decimals)
    return b.op("mul", b.op("round", b.op("div", x, 10.0**-decimals)), 10.0**-decimals)


for _v in ("round.decimals_0", "round.decimals_3", "round.decimals_neg_3"):
    RECIPES[_v] = _round_decimals


def _sigmoid(b: Recorder, x: Ref) -> Ref:
    if not b.t(x).dtype.is_floating_point:
        x = b.op("convert_element_type", x, dtype="float32")
    return b.op("reciprocal", b.op("add", b.op("exp", b.op("neg", x)), 1))


RECIPES["sigmoid"] = _sigmoid
RECIPES["where"] = lambda b, x, cond, other: b.op("where", cond, x, other)


def _clamp(b: Recorder, x: Ref, min: Any = None, max: Any = None) -> Ref:
    return b.op("clamp", x, min, max)


RECIPES["clamp"] = _clamp

for _n, _d in {
    "float": "float32",
    "double": "float64",
    "int": "int32",
    "long": "int64",
    "bool": "bool",
    "half": "float16",
    "bfloat16": "bfloat16",
    "byte": "uint8",
    "char": "int8",
    "short": "int16",
}.items():
    RECIPES[_n] = lambda b, x, memory_format=None, _d=_d: b.op("convert_element_type", x, dtype=_d)


def _dims(dim: Any) -> Any:
    if dim is None:
        return None
    return [dim] if isinstance(dim, int) else list(dim)


def _reduce(name: str) -> Recipe:
    def r(b: Recorder, x: Ref, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Ref:
        dims = _dims(dim)
        if dims == []:
            dims = None
        if dtype is not None and name in ("sum", "prod"):
            return b.op(name, x, dims=dims, keepdim=keepdim, dtype=TORCH_TO_NAME[dtype])
        if dtype is not None:
            x = b.op("convert_element_type", x, dtype=TORCH_TO_NAME[dtype])
        return b.op(name, x, dims=dims, keepdim=keepdim)

    return r


for _n in ("sum", "prod", "amax", "amin", "any", "all", "mean"):
    RECIPES[_n] = _reduce(_n)


def _argx(name: str) -> Recipe:
    def r(b: Recorder, x: Ref, dim: Any = None, keepdim: bool = False) -> Ref:
        return b.op(name, x, dim=dim, keepdim=keepdim)

    return r


RECIPES["argmax"] = _argx("argmax")
RECIPES["argmin"] = _argx("argmin")


def _cumsum(b: Recorder, x: Ref, dim: int, dtype: Any = None) -> Ref:
    return b.op("cumsum", x, dim=dim, dtype=None if dtype is None else TORCH_TO_NAME[dtype])


RECIPES["cumsum"] = _cumsum
RECIPES["reshape"] = lambda b, x, shape: b.op("reshape", x, shape=list(shape))
RECIPES["expand"] = lambda b, x, shape: b.op("expand", x, shape=list(shape))
RECIPES["permute"] = lambda b, x, dims: b.op("permute", x, dims=list(dims))
RECIPES["squeeze"] = lambda b, x, dim=None: b.op("squeeze", x, dims=_dims(dim))
RECIPES["squeeze.multiple"] = lambda b, x, dim: b.op("squeeze", x, dims=_dims(dim))
RECIPES["unsqueeze"] = lambda b, x, dim: b.op("unsqueeze", x, dim=dim)
RECIPES["flip"] = lambda b, x, dims: b.op("flip", x, dims=list(dims))


def _cat(b: Recorder, xs: Any, dim: int = 0) -> Ref:
    return b.op("cat", *xs, dim=dim)


RECIPES["cat"] = _cat


def _pad(b: Recorder, x: Ref, pad: Any, mode: str = "constant", value: float | None = None) -> Ref:
    if mode != "constant":
        raise Unsupported(f"pad mode {mode}")
    return b.op("pad", x, pad=list(pad), value=0.0 if value is None else float(value))


RECIPES["nn.functional.pad.constant"] = _pad
RECIPES["gather"] = lambda b, x, dim, index, sparse_grad=False: b.op("gather", x, index, dim=dim)
RECIPES["index_select"] = lambda b, x, dim, index: b.op("index_select", x, index, dim=dim)


def _scatter(b: Recorder, x: Ref, dim: int, index: Ref, src: Any, reduce: Any = None) -> Ref:
    if reduce is None:
        return b.op("scatter", x, index, src, dim=dim)
    # scatter(reduce=) is scatter_reduce with self included; a scalar src repeats
    if not isinstance(src, Ref):
        t = b.t(x)
        src = b.constant(torch.full(b.t(index).shape, src, dtype=t.dtype).numpy())
    kind = {"add": "sum", "multiply": "prod"}[reduce]
    return b.op("scatter_reduce", x, index, src, dim=dim, reduce=kind)


RECIPES["scatter"] = _scatter
RECIPES["scatter_add"] = lambda b, x, dim, index, src: b.op("scatter_add", x, index, src, dim=dim)
RECIPES["index_put"] = lambda b, x, indices, values, accumulate=False: b.op(
    "index_put", x, values, *indices, accumulate=accumulate
)


def _narrow(b: Recorder, x: Ref, dim: int, start: Any, length: int) -> Ref:
    if isinstance(start, Ref):
        raise Unsupported("narrow with a tensor start")
    size = b.t(x).shape[dim]
    if start < 0:
        start += size
    return b.op("slice", x, dim=dim, start=start, end=start + length, step=1)


RECIPES["narrow"] = _narrow
for _n in ("matmul", "mm", "bmm", "mv", "dot", "bmm.triton_optimized"):
    RECIPES[_n] = lambda b, x, y: b.op("matmul", x, y)


def _tup(v: Any, n: int) -> list[int]:
    return list(v) if isinstance(v, (list, tuple)) else [v] * n


def _conv(nsp: int) -> Recipe:
    def r(
        b: Recorder,
        x: Ref,
        w: Ref,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> Ref:
        if isinstance(padding, str):
            if padding != "valid":
                raise Unsupported(f"padding={padding!r}")
            padding = 0
        return b.op(
            "convolution",
            x,
            w,
            bias,
            stride=_tup(stride, nsp),
            padding=_tup(padding, nsp),
            dilation=_tup(dilation, nsp),
            groups=groups,
        )

    return r


def _conv_t(nsp: int) -> Recipe:
    def r(
        b: Recorder,
        x: Ref,
        w: Ref,
        bias: Any = None,
        stride: Any = 1,
        padding: Any = 0,
        output_padding: Any = 0,
        groups: int = 1,
        dilation: Any = 1,
    ) -> Ref:
        return b.op(
            "convolution",
            x,
            w,
            bias,
            stride=_tup(stride, nsp),
            padding=_tup(padding, nsp),
            dilation=_tup(dilation, nsp),
            groups=groups,
            transposed=True,
            output_padding=_tup(output_padding, nsp),
        )

    return r


RECIPES["nn.functional.conv1d"] = _conv(1)
RECIPES["nn.functional.conv2d"] = _conv(2)
RECIPES["nn.functional.conv_transpose1d"] = _conv_t(1)
RECIPES["nn.functional.conv_transpose2d"] = _conv_t(2)


def _sort(
    b: Recorder, x: Ref, dim: int = -1, descending: bool = False, stable: bool = False
) -> tuple[Ref, Ref]:
    idx = b.op("argsort", x, dim=dim, descending=descending)
    return b.op("gather", x, idx, dim=dim), idx


RECIPES["sort"] = _sort
RECIPES["argsort"] = lambda b, x, dim=-1, descending=False, stable=False: b.op(
    "argsort", x, dim=dim, descending=descending
)


def _topk(
    b: Recorder, x: Ref, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
) -> tuple[Ref, Ref]:
    idx = b.op("topk", x, k=k, dim=dim, largest=largest)
    return b.op("gather", x, idx, dim=dim), idx


RECIPES["topk"] = _topk


def _full_like(b: Recorder, x: Ref, fill: Any, dtype: Any = None, device: Any = None) -> Ref:
    t = b.t(x)
    d = TORCH_TO_NAME[dtype or t.dtype]
    return b.op("full", shape=list(t.shape), value=float(fill), dtype=d)


RECIPES["full_like"] = _full_like

#: ops whose integer-valued indices may legitimately differ from torch on ties
TIE_AMBIGUOUS = {"sort", "argsort", "topk"}
RECIPES["unfold"] = lambda b, x, dim, size, step: b.op("unfold", x, dim=dim, size=size, step=step)

# -- special functions, scans, scatter reductions, searchsorted ----------------------------

for _name, _prim in {
    "lgamma": "lgamma",
    "digamma": "digamma",
    "i0": "bessel_i0",
    "special.i0e": "bessel_i0e",
    "special.i1": "bessel_i1",
    "special.i1e": "bessel_i1e",
    "special.erfcx": "erfcx",
    "special.ndtri": "ndtri",
    "special.log_ndtr": "log_ndtr",
    "special.bessel_j0": "bessel_j0",
    "special.bessel_j1": "bessel_j1",
    "special.bessel_y0": "bessel_y0",
    "special.bessel_y1": "bessel_y1",
    "special.modified_bessel_i0": "bessel_i0",
    "special.modified_bessel_i1": "bessel_i1",
    "special.modified_bessel_k0": "modified_bessel_k0",
    "special.modified_bessel_k1": "modified_bessel_k1",
    "special.scaled_modified_bessel_k0": "scaled_modified_bessel_k0",
    "special.scaled_modified_bessel_k1": "scaled_modified_bessel_k1",
    "special.spherical_bessel_j0": "spherical_bessel_j0",
    "special.airy_ai": "airy_ai",
}.items():
    RECIPES[_name] = unary(_prim)
for _name, _prim in {
    "special.zeta": "zeta",
    "igamma": "igamma",
    "igammac": "igammac",
    "gcd": "gcd",
    "nextafter": "nextafter",
    **{
        f"special.{p}": p
        for p in (
            *(f"chebyshev_polynomial_{k}" for k in "tuvw"),
            *(f"shifted_chebyshev_polynomial_{k}" for k in "tuvw"),
            "hermite_polynomial_h",
            "hermite_polynomial_he",
            "laguerre_polynomial_l",
            "legendre_polynomial_p",
        )
    },
}.items():
    RECIPES[_name] = binary(_prim)


def _polygamma(n: int) -> Recipe:
    def r(b: Recorder, x: Ref, *args: Any, **kw: Any) -> Ref:
        # OpInfo's polygamma samples pass n as an argument after the input
        k = args[0] if args else kw.get("n", n)
        return b.op("polygamma", x, n=int(k))

    return r


for _k in range(5):
    RECIPES[f"polygamma.polygamma_n_{_k}"] = _polygamma(_k)
RECIPES["special.polygamma.special_polygamma_n_0"] = _polygamma(0)


def _scatter_reduce(
    b: Recorder, x: Ref, dim: int, index: Ref, src: Ref, reduce: str, include_self: bool = True
) -> Ref:
    return b.op("scatter_reduce", x, index, src, dim=dim, reduce=reduce, include_self=include_self)


for _r in ("sum", "prod", "mean", "amax", "amin"):
    RECIPES[f"scatter_reduce.{_r}"] = _scatter_reduce


def _cum_extreme(prim_name: str) -> Recipe:
    def r(b: Recorder, x: Ref, dim: int) -> tuple[Ref, Ref]:
        if b.t(x).ndim == 0:
            raise Unsupported("0-d input (the SDK returns the input itself)")
        idx = b.op(prim_name, x, dim=dim)
        return b.op("gather", x, idx, dim=dim), idx

    return r


RECIPES["cummax"] = _cum_extreme("cumargmax")
RECIPES["cummin"] = _cum_extreme("cumargmin")
RECIPES["logcumsumexp"] = lambda b, x, dim: b.op("logcumsumexp", x, dim=dim)


def _searchsorted(
    b: Recorder,
    seq: Ref,
    values: Any,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Any = None,
) -> Ref:
    if side is not None:
        right = side == "right"
    if sorter is not None:
        seq = b.op("gather", seq, sorter, dim=-1)
    return b.op("searchsorted", seq, values, right=right, out_int32=out_int32)


RECIPES["searchsorted"] = _searchsorted

"""Random sampling drawn on the node: Gaussian noise, random integers, multinomial, rrelu.

Every draw is a ``rand`` prim evaluated with the node's own generator (nothing the
client sends seeds it); distributions are transforms of those uniforms. Values
differ from torch's for the same seed by design; shapes and dtypes are torch's.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from sdk._remote.dispatch import SPECIAL
from sdk._remote.graph import Node, prim
from sdk._remote.rules import dtype_name, implements

__all__: list[str] = []

aten = torch.ops.aten


@implements(aten.randn_like.default, aten.randn.default)
def _randn(out: torch.Tensor, *args: Any, **kwargs: Any) -> Node:
    return _gaussian(tuple(out.shape), dtype_name(out.dtype))


def _gaussian(shape: tuple[int, ...], name: str) -> Node:
    # Box-Muller from two uniforms drawn on the node (1 - u keeps the log finite)
    u1 = prim("sub", 1.0, prim("rand", shape=shape, dtype=name))
    u2 = prim("rand", shape=shape, dtype=name)
    radius = prim("sqrt", prim("mul", prim("log", u1), -2.0))
    return prim("mul", radius, prim("cos", prim("mul", u2, 2 * math.pi)))


def _normal_inplace(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from sdk._remote.dispatch import private_error
    from sdk._remote.tensor import RemoteTensor

    self, *rest = args
    mean = kwargs.get("mean", rest[0] if rest else 0.0)
    std = kwargs.get("std", rest[1] if len(rest) > 1 else 1.0)
    if not isinstance(self, RemoteTensor):
        raise private_error("normal_ on a local tensor inside a remote computation", "")
    z = _gaussian(tuple(self.shape), dtype_name(self.dtype))
    self._write(prim("add", prim("mul", z, float(std)), float(mean)))
    return self


SPECIAL[aten.normal_.default] = _normal_inplace


def _randint_like(out: torch.Tensor, x: Node, *args: Any, **kw: Any) -> Node:
    bounds = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    low, high = (0, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
    # float64 uniforms: u * (high - low) stays below high - low after rounding
    u = prim("rand", shape=tuple(out.shape), dtype="float64")
    r = prim("add", prim("floor", prim("mul", u, float(high - low))), float(low))
    return prim("convert_element_type", r, dtype=dtype_name(out.dtype))


for _ov in ("default", "low_dtype", "generator", "low_generator_dtype"):
    implements(getattr(aten.randint_like, _ov))(_randint_like)


@implements(aten.multinomial.default)
def _multinomial(
    out: torch.Tensor, probs: Node, num_samples: int, replacement: bool = False, **kw: Any
) -> Node:
    # drawn on the node: with replacement by inverting the CDF, without by the
    # Gumbel-top-k trick (keys log p - log(-log u), the k largest)
    shape = tuple(probs.shape or ())
    name = dtype_name(probs.dtype) if probs.dtype is not None else "float32"
    if not replacement:
        u = prim("rand", shape=shape, dtype=name)
        gumbel = prim("neg", prim("log", prim("neg", prim("log", prim("sub", 1.0, u)))))
        keys = prim("add", prim("log", probs), gumbel)
        return prim("topk", keys, k=num_samples, dim=-1, largest=True)
    cdf = prim("cumsum", probs, dim=-1)
    total = prim("slice", cdf, dim=-1, start=shape[-1] - 1, end=shape[-1], step=1)
    u = prim("mul", prim("rand", shape=(*shape[:-1], num_samples), dtype=name), total)
    below = prim("le", prim("unsqueeze", cdf, dim=-2), prim("unsqueeze", u, dim=-1))
    count = prim("sum", below, dims=(-1,), dtype="int64")
    return prim("clamp", count, None, shape[-1] - 1)


def _rrelu_with_noise(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """rrelu: random negative slopes in [lower, upper] drawn on the node while training,
    written into ``noise`` (as torch does, for the backward pass); the mean slope otherwise."""
    from sdk._remote.dispatch import _wrap, node_of
    from sdk._remote.tensor import RemoteTensor

    names = ("self", "noise", "lower", "upper", "training", "generator")
    bound = dict(zip(names, args, strict=False)) | kwargs
    x, noise = bound["self"], bound["noise"]
    lower, upper = float(bound.get("lower", 0.125)), float(bound.get("upper", 1.0 / 3.0))
    if not isinstance(x, RemoteTensor):
        return aten.rrelu_with_noise.default(*args, **kwargs)
    xn = node_of(x)
    name = dtype_name(x.dtype)
    shape = tuple(x.shape)
    if bound.get("training", False):
        u = prim("rand", shape=shape, dtype=name)
        slope = prim("add", prim("mul", u, upper - lower), lower)
        factor = prim("where", prim("ge", xn, 0), 1.0, slope)
        if isinstance(noise, RemoteTensor) and tuple(noise.shape) == shape:
            noise._write(prim("convert_element_type", factor, dtype=dtype_name(noise.dtype)))
        result = prim("mul", xn, factor)
    else:
        result = prim("where", prim("ge", xn, 0), xn, prim("mul", xn, (lower + upper) / 2))
    meta = torch.empty_strided(shape, x.stride(), dtype=x.dtype, device="meta")
    return _wrap(meta, result, x._source)


SPECIAL[aten.rrelu_with_noise.default] = _rrelu_with_noise

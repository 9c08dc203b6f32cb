"""Special functions: ``torch.special`` and friends, each one prim.

torch decomposes some of them (``lgamma``, ``zeta``...) through ``torch._refs``
into ``prims.*`` ops, but those refs leave 0-dim operands unbroadcast, which the
prims' meta functions then refuse; mapping the ATen op straight to the engine's
prim is shorter, and the engine applies torch's promotion itself.
"""

from __future__ import annotations

import torch

from sdk._remote.graph import Node, prim
from sdk._remote.rules import implements

__all__: list[str] = []

aten = torch.ops.aten

for _name in (
    "bessel_y0",
    "bessel_y1",
    "modified_bessel_k0",
    "modified_bessel_k1",
    "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1",
    "airy_ai",
):
    implements(getattr(aten, f"special_{_name}").default)(lambda out, x, _p=_name: prim(_p, x))
for _name, _op in {
    "lgamma": aten.lgamma,
    "digamma": aten.digamma,
    "erfcx": aten.special_erfcx,
    "ndtri": aten.special_ndtri,
    "log_ndtr": aten.special_log_ndtr,
    "bessel_i0": aten.i0,
    "bessel_i0e": aten.special_i0e,
    "bessel_i1": aten.special_i1,
    "bessel_i1e": aten.special_i1e,
    "bessel_j0": aten.special_bessel_j0,
    "bessel_j1": aten.special_bessel_j1,
    "spherical_bessel_j0": aten.special_spherical_bessel_j0,
}.items():
    implements(_op.default)(lambda out, x, _p=_name: prim(_p, x))
for _name, _op in {
    "zeta": aten.special_zeta,
    "igamma": aten.igamma,
    "igammac": aten.igammac,
    "gcd": aten.gcd,
    "nextafter": aten.nextafter,
}.items():
    for _ov in ("default", "Tensor", "self_scalar", "other_scalar"):
        if hasattr(_op, _ov):
            implements(getattr(_op, _ov))(lambda out, a, b, _p=_name: prim(_p, a, b))
implements(aten.special_modified_bessel_i0.default)(lambda out, x: prim("bessel_i0", x))
implements(aten.special_modified_bessel_i1.default)(lambda out, x: prim("bessel_i1", x))

for _name in (
    *(f"chebyshev_polynomial_{k}" for k in "tuvw"),
    *(f"shifted_chebyshev_polynomial_{k}" for k in "tuvw"),
    "hermite_polynomial_h",
    "hermite_polynomial_he",
    "laguerre_polynomial_l",
    "legendre_polynomial_p",
):
    _packet = getattr(aten, f"special_{_name}")
    for _ov in ("default", "x_scalar", "n_scalar"):
        implements(getattr(_packet, _ov))(lambda out, x, n, _p=_name: prim(_p, x, n))


@implements(aten.polygamma.default, aten.special_polygamma.default)
def _polygamma(out: torch.Tensor, n: int, x: Node) -> Node:
    return prim("polygamma", x, n=int(n))


@implements(aten.frexp.Tensor)
def _frexp(out: object, x: Node) -> tuple[Node, Node]:
    return prim("frexp_mantissa", x), prim("frexp_exponent", x)

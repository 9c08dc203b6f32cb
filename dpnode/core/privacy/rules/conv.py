"""The rule of convolution with a public weight: a linear map of the private input.

``convolution(x, w, b)`` (forward or transposed, any stride, padding, dilation and groups)
is, for a public ``w``, a linear map ``x -> A x + b`` whose matrix ``A`` holds entries of
``w`` (and zeros): the same kernel applied to ``|w|`` computes ``|A| v``. So, with ``mid`` and
``rad`` the centre and radius of each element's interval,

    centre = A mid + b,   radius = |A| rad,   L_out = |A| L,   G_out = |A| G,

exactly as ``matmul``'s ``_linear`` does for ``X @ W``. Zero padding is public zeros: it adds
nothing. Each output element keeps its batch row's owner when every element of that row has
one owner (the usual case: one subject per image); otherwise an output may mix subjects and
gets ``L = G = |A| max(L, G)``. The maps run in float64 on the fitted arrays: an input whose
bounds are the same for every row is convolved once, as a batch of one.

A private weight or bias has no rule (it would be a product of private values).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from node.engine.prims.linalg import conv_geometry, conv_map
from node.privacy.arrays import fit, varying_axes
from node.privacy.rules.base import Ctx, finish, rule
from node.privacy.state import MIXED, PUBLIC, Array, State

__all__ = ["convolution", "magnitude_terms"]


def _public_interval(c: Ctx, i: int, what: str) -> tuple[Array, Array] | None:
    """A public argument as ``(mid, radius)``: its value (radius 0), or the middle and half
    width of its bounds when it is public but only bounded (a weight boxed by the tracking
    cache, ``node.privacy.cache``)."""
    s = c.args[i] if i < len(c.args) else None
    if s is None:
        return None
    if s.is_public and s.value is not None:
        v = np.asarray(s.value, dtype=np.float64)
        return v, np.zeros(())
    if s.is_public:
        lo = np.broadcast_to(np.asarray(s.lo, dtype=np.float64), s.shape)
        hi = np.broadcast_to(np.asarray(s.hi, dtype=np.float64), s.shape)
        if np.isfinite(lo).all() and np.isfinite(hi).all():
            return (lo + hi) / 2, (hi - lo) / 2
    raise c.fail(f"the {what} must be public and bounded (a private {what} has no rule)")


def _magnitude(v: tuple[Array, Array]) -> Array:
    """The largest ``|value|`` in ``mid +- radius``."""
    return np.abs(v[0]) + v[1]


def _batched(a: Array, x: State, geo: dict[str, Any]) -> Array:
    """``a`` fitted to ``x`` as a float64 batch: every dim full but the batch dim (1 or n)."""
    f = fit(a, x.shape)
    if not geo["batched"]:
        return np.ascontiguousarray(np.broadcast_to(f, x.shape)[None], dtype=np.float64)
    return np.ascontiguousarray(np.broadcast_to(f, (f.shape[0], *x.shape[1:])), dtype=np.float64)


def _unbatched(r: Array, geo: dict[str, Any]) -> Array:
    return r if geo["batched"] else r[0]


def magnitude_terms(c: Ctx, x_mag: Array, x: State) -> Array:
    """``|A| |x|`` plus ``|b|``: the sum of the magnitudes of each output's terms."""
    geo = conv_geometry(c.call)
    w = _public_interval(c, 1, "weight")
    assert w is not None
    r = conv_map(_batched(x_mag, x, geo), _magnitude(w), geo)
    b = _public_interval(c, 2, "bias")
    if b is not None:
        r = r + np.broadcast_to(_magnitude(b), b[0].shape).reshape((-1,) + (1,) * geo["nsp"])
    return _unbatched(r, geo)


@rule("convolution")
def convolution(c: Ctx) -> State:
    """Convolution of a private input with a public weight (and bias): a linear map."""
    x = c.arg(0)
    w = _public_interval(c, 1, "weight")
    if w is None:  # pragma: no cover - the engine requires a weight
        raise c.fail("needs a weight")
    b = _public_interval(c, 2, "bias")
    geo = conv_geometry(c.call)
    wmid, wrad = w
    wabs = _magnitude(w)
    with np.errstate(all="ignore"):
        lo, hi = _batched(x.lo, x, geo), _batched(x.hi, x, geo)
        mid, rad = (lo + hi) / 2, (hi - lo) / 2
        centre = conv_map(mid, wmid, geo)
        # interval products: |A| rad for the input's width, and |x| wrad for the weight's
        radius = conv_map(rad, np.abs(wmid), geo)
        if np.any(wrad > 0):
            wr = np.broadcast_to(wrad, wmid.shape)
            radius = radius + conv_map(np.abs(mid) + rad, np.ascontiguousarray(wr), geo)
        if b is not None:
            shape = (-1,) + (1,) * geo["nsp"]
            centre = centre + np.broadcast_to(b[0], b[0].shape).reshape(shape)
            radius = radius + np.broadcast_to(b[1], b[0].shape).reshape(shape)
        rows = geo["batched"] and not any(varying_axes(x.owner, x.shape, exact=True)[1:])
        if rows or not any(varying_axes(x.owner, x.shape, exact=True)):
            owner = fit(x.owner, x.shape)
            owner = owner[(slice(None),) + (slice(0, 1),) * (owner.ndim - 1)]
            L = conv_map(_batched(x.L, x, geo), wabs, geo)
            G = conv_map(_batched(x.G, x, geo), wabs, geo)
        else:  # subjects mix within a row: any of them moves an output by |A| max(L, G)
            public = np.all(np.asarray(x.owner) == PUBLIC)
            owner = np.asarray(PUBLIC if public else MIXED, dtype=np.int64)
            L = G = conv_map(_batched(np.maximum(x.L, x.G), x, geo), wabs, geo)
    out = [_unbatched(a, geo) for a in (centre - radius, centre + radius)]
    return finish(c.meta, out[0], out[1], owner, _unbatched(L, geo), _unbatched(G, geo))

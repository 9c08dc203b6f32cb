"""Resource quotas a graph must fit before the node allocates anything."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Quotas", "WireLimits"]


@dataclass(frozen=True)
class Quotas:
    """Limits checked on the inferred graph, before evaluation.

    Attributes:
        max_nodes: nodes in one graph (inputs and constants included).
        max_elements_per_tensor: elements of any one value.
        max_total_bytes: peak bytes of intermediates alive at once, as the
            evaluator will free them (graph inputs not counted: they exist).
        max_flops: estimated floating-point (or element) operations in total.
        max_dims: dimensions of any one value.
    """

    max_nodes: int = 100_000
    max_elements_per_tensor: int = 1 << 31
    max_total_bytes: int = 8 << 30
    max_flops: int = 10**13
    max_dims: int = 16


@dataclass(frozen=True)
class WireLimits:
    """Limits checked while decoding a wire frame, before parsing deeper."""

    max_frame_bytes: int = 1 << 30
    max_header_bytes: int = 16 << 20
    max_nodes: int = 100_000
    max_args: int = 1024
    max_constant_bytes: int = 512 << 20
    max_string: int = 256

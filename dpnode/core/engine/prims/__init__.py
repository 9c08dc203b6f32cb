"""The prim vocabulary: importing this package registers every prim."""

from dpnode.core.engine.prims import (  # noqa: F401
    distinct,
    dpsgd,
    elementwise,
    indexing,
    linalg,
    matrix,
    misc,
    reductions,
    shape,
    special,
)
from dpnode.core.engine.prims.registry import REGISTRY, AttrSpec, Call, PrimDef, Scalar, TensorMeta

#: Version of the prim vocabulary; every graph carries it and a mismatch is refused.
PRIM_VERSION = "1"

__all__ = ["PRIM_VERSION", "REGISTRY", "AttrSpec", "Call", "PrimDef", "Scalar", "TensorMeta"]

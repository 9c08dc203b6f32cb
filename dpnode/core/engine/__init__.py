"""dpnode's compute engine: prim graphs evaluated with NumPy under torch's dtype rules.

A pure library (no I/O). The public face:

- :class:`Graph`, :class:`GraphBuilder`: graphs of prims in topological order.
- :func:`encode` / :func:`decode`: the wire frame; :func:`structure_hash`.
- :func:`infer`: output shapes and dtypes without data; :func:`plan` for all nodes.
- :func:`evaluate` / :func:`run`: values (and trackers riding along).
- :class:`Quotas`, :class:`WireLimits`: resource limits checked before allocation.
- :data:`PRIM_VERSION`, :data:`REGISTRY`: the versioned prim vocabulary.
"""

from node.engine.dtypes import DTYPES, DType, dtype
from node.engine.evaluator import Evaluation, Plan, Tracker, evaluate, infer, plan, run
from node.engine.graph import Graph, GraphBuilder, Node, Ref
from node.engine.prims import PRIM_VERSION, REGISTRY, Call, PrimDef, Scalar, TensorMeta
from node.engine.promotion import Kind, Operand, promote_types, result_type
from node.engine.quotas import Quotas, WireLimits
from node.engine.wire import content_hash, decode, encode, structure_hash

__all__ = [
    "DTYPES",
    "PRIM_VERSION",
    "REGISTRY",
    "Call",
    "DType",
    "Evaluation",
    "Graph",
    "GraphBuilder",
    "Kind",
    "Node",
    "Operand",
    "Plan",
    "PrimDef",
    "Quotas",
    "Ref",
    "Scalar",
    "TensorMeta",
    "Tracker",
    "WireLimits",
    "content_hash",
    "decode",
    "dtype",
    "encode",
    "evaluate",
    "infer",
    "plan",
    "promote_types",
    "result_type",
    "run",
    "structure_hash",
]

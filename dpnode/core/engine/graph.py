"""Validated graph objects and a builder.

A graph is a list of nodes in topological order: arguments may only refer to
*earlier* nodes, so cycles cannot be expressed and evaluation is a single
forward loop (no recursion, whatever the depth). Node 0..n-1 are values;
``outputs`` lists the indices the caller gets back.

Two node kinds are not prims: ``input`` (a named placeholder with a declared
dtype and shape, bound at evaluation) and ``constant`` (a public tensor that
travels with the graph as raw bytes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

from dpnode.core.engine.dtypes import dtype, from_numpy
from dpnode.core.engine.identity import ByIdentity
from dpnode.core.engine.prims import PRIM_VERSION, REGISTRY
from dpnode.core.engine.prims.registry import AttrSpec, AttrValue, Scalar
from dpnode.core.errors import GraphError

__all__ = ["Arg", "Graph", "GraphBuilder", "Node", "Ref", "Scalar", "validate_structure"]

SPECIAL_OPS = ("input", "constant")


@dataclass(frozen=True)
class Ref:
    """A reference to the value of an earlier node."""

    index: int


Arg: TypeAlias = Ref | Scalar | None


@dataclass(frozen=True, eq=False)
class Node:
    """One node: a prim applied to arguments, an input, or a constant.

    ``value`` holds a constant's data (read-only); it is None otherwise.
    """

    op: str
    args: tuple[Arg, ...] = ()
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    value: npt.NDArray[Any] | None = None


@dataclass(frozen=True, eq=False)
class Graph:
    """A graph in topological order; build with :class:`GraphBuilder` or decode from the wire."""

    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]
    version: str = PRIM_VERSION

    def input_names(self) -> list[str]:
        """Names of the input placeholders, in node order."""
        return [str(n.attrs["name"]) for n in self.nodes if n.op == "input"]


def _check_attr(where: str, name: str, spec: AttrSpec, v: AttrValue) -> AttrValue:
    """Type-check one attribute value against its spec."""
    if v is None:
        if spec.optional:
            return spec.default
        raise GraphError(f"{where}: attribute {name!r} is required")
    kind = spec.kind
    ok: bool
    if kind == "bool":
        ok = isinstance(v, bool)
    elif kind == "int":
        ok = isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63
    elif kind == "float":
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if ok:
            v = float(v)  # type: ignore[arg-type]
            if not spec.nonfinite and not math.isfinite(v):
                raise GraphError(f"{where}: attribute {name!r} must be finite, got {v}")
            if math.isnan(v):
                raise GraphError(f"{where}: attribute {name!r} is NaN, which is never allowed here")
    elif kind in ("ints", "shape"):
        ok = isinstance(v, tuple) and all(
            isinstance(e, int) and not isinstance(e, bool) and -(2**62) < e < 2**62 for e in v
        )
        if ok and kind == "shape" and len(v) > 64:  # type: ignore[arg-type]
            raise GraphError(f"{where}: attribute {name!r} has too many dims")
        if ok and kind == "ints" and len(v) > 1024:  # type: ignore[arg-type]
            raise GraphError(f"{where}: attribute {name!r} is too long")
    elif kind in ("dtype", "str"):
        ok = isinstance(v, str) and len(v) <= 256
        if ok and kind == "dtype":
            dtype(v)  # type: ignore[arg-type]
    else:  # pragma: no cover - specs are ours
        raise AssertionError(kind)
    if not ok:
        raise GraphError(f"{where}: attribute {name!r} must be {kind}, got {v!r:.60}")
    return v


def _check_shape(where: str, shape: Any) -> tuple[int, ...]:
    if not isinstance(shape, tuple) or not all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**62 for s in shape
    ):
        raise GraphError(f"{where}: shape must be a list of non-negative ints, got {shape!r:.80}")
    if len(shape) > 64:
        raise GraphError(f"{where}: shape has {len(shape)} dims")
    return shape


#: graphs :func:`validate_structure` returned: a graph is immutable, so one decoded,
#: planned and hashed is validated once, not three times
_VALID: ByIdentity[bool] = ByIdentity()


def check_constant(where: str, value: np.ndarray[Any, Any]) -> None:
    """Refuse a constant's value that no graph may carry: a NaN."""
    # via float32: ml_dtypes' bfloat16 is not a NumPy float kind
    if from_numpy(value.dtype).is_float and np.isnan(value.astype(np.float32, copy=False)).any():
        raise GraphError(
            f"{where}: constant contains NaN, which dpnode refuses in public constants"
        )


def with_values(graph: Graph, nodes: Sequence[Node]) -> Graph:
    """``graph`` with ``nodes`` in place of its own, which differ from them only in the values
    of constants, of the same shapes and dtypes (each checked by the caller with
    :func:`check_constant`): as valid as ``graph``, without validating the structure again."""
    out = Graph(tuple(nodes), graph.outputs, graph.version)
    if _VALID.get(graph):
        _VALID.put(out, True)
    return out


def validate_structure(graph: Graph) -> Graph:
    """Check everything that needs no shape inference, returning a normalised graph.

    Known prims and versions, argument counts and kinds, references to earlier
    nodes only, attribute schemas, input/constant declarations, outputs. A graph this
    function returned is returned as it is.

    Raises:
        GraphError: naming the node, the prim and the offending argument.
    """
    if _VALID.get(graph):
        return graph
    if graph.version != PRIM_VERSION:
        raise GraphError(
            f"graph uses prim vocabulary version {graph.version!r}; "
            f"this node speaks {PRIM_VERSION!r}"
        )
    nodes: list[Node] = []
    names: set[str] = set()
    for i, n in enumerate(graph.nodes):
        where = f"node {i} ({n.op!r:.40})"
        if n.op == "input":
            a = dict(n.attrs)
            if set(a) != {"name", "dtype", "shape"} or n.args:
                raise GraphError(f"{where}: an input has exactly the attributes name, dtype, shape")
            name = a["name"]
            if not isinstance(name, str) or not name or len(name) > 256:
                raise GraphError(f"{where}: input name must be a non-empty string")
            if name in names:
                raise GraphError(f"{where}: input name {name!r} is declared twice")
            names.add(name)
            dtype(a["dtype"])  # type: ignore[arg-type]
            _check_shape(where, a["shape"])
            nodes.append(n)
            continue
        if n.op == "constant":
            if n.value is None or n.args:
                raise GraphError(f"{where}: a constant needs a value and no arguments")
            check_constant(where, n.value)
            nodes.append(n)
            continue
        p = REGISTRY.get(n.op)
        if p is None:
            raise GraphError(
                f"{where}: unknown prim; the vocabulary (version {PRIM_VERSION}) "
                "is in docs/prims.md"
            )
        nargs = len(n.args)
        if nargs < p.min_args or (p.max_args is not None and nargs > p.max_args):
            want = (
                f"{p.min_args}"
                if p.min_args == p.max_args
                else f"{p.min_args}..{p.max_args or 'n'}"
            )
            raise GraphError(f"{where}: takes {want} arguments, got {nargs}")
        for j, arg in enumerate(n.args):
            if isinstance(arg, Ref):
                if not isinstance(arg.index, int) or not 0 <= arg.index < i:
                    kind = (
                        "a cycle or forward reference"
                        if isinstance(arg.index, int) and arg.index >= i
                        else "a dangling reference"
                    )
                    raise GraphError(
                        f"{where}, argument {j}: refers to node {arg.index!r}: {kind}; "
                        "arguments must refer to earlier nodes"
                    )
            elif isinstance(arg, Scalar):
                if p.scalar_args != "all" and j not in p.scalar_args:
                    raise GraphError(
                        f"{where}, argument {j}: must be a tensor, got a Python scalar"
                    )
                _check_scalar(f"{where}, argument {j}", arg.value)
            elif arg is None:
                if j not in p.optional_args:
                    raise GraphError(f"{where}, argument {j}: is required")
            else:
                raise GraphError(f"{where}, argument {j}: not a reference or scalar")
        unknown = set(n.attrs) - set(p.attrs)
        if unknown:
            raise GraphError(f"{where}: unknown attributes {sorted(unknown)}")
        attrs = {k: _check_attr(where, k, spec, n.attrs.get(k)) for k, spec in p.attrs.items()}
        nodes.append(Node(n.op, n.args, attrs))
    if not graph.outputs:
        raise GraphError("graph has no outputs")
    for o in graph.outputs:
        if not isinstance(o, int) or not 0 <= o < len(nodes):
            raise GraphError(f"output refers to node {o!r}, which does not exist")
    valid = Graph(tuple(nodes), tuple(graph.outputs), graph.version)
    _VALID.put(valid, True)
    return valid


def _check_scalar(where: str, v: Any) -> None:
    if isinstance(v, bool):
        return
    if isinstance(v, int):
        if not -(2**63) <= v < 2**63:
            raise GraphError(f"{where}: integer scalar {v} does not fit int64")
        return
    if isinstance(v, float):
        if math.isnan(v):
            raise GraphError(f"{where}: NaN scalar refused")
        return
    raise GraphError(f"{where}: scalar must be bool, int or float, got {type(v).__name__}")


class GraphBuilder:
    """Build a graph node by node (for tests, benches and the SDK's decomposer).

    >>> b = GraphBuilder()
    >>> x = b.input("x", "float32", (3,))
    >>> y = b.op("mul", x, 2.0)
    >>> g = b.build([y])
    >>> [n.op for n in g.nodes]
    ['input', 'mul']
    """

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def _add(self, node: Node) -> Ref:
        self.nodes.append(node)
        return Ref(len(self.nodes) - 1)

    def input(self, name: str, dtype_name: str, shape: Sequence[int]) -> Ref:
        """A named placeholder of declared dtype and shape."""
        return self._add(
            Node("input", (), {"name": name, "dtype": dtype_name, "shape": tuple(shape)})
        )

    def constant(self, value: npt.ArrayLike, dtype_name: str | None = None) -> Ref:
        """A public constant tensor (copied, made read-only)."""
        arr = np.array(value, dtype=None if dtype_name is None else dtype(dtype_name).np)
        arr.flags.writeable = False
        return self._add(Node("constant", (), {}, arr))

    def op(self, name: str, *args: Ref | bool | int | float | None, **attrs: Any) -> Ref:
        """Apply prim ``name``; Python scalars become inline scalar arguments."""
        conv: list[Arg] = []
        for a in args:
            conv.append(a if isinstance(a, Ref) or a is None else Scalar(a))
        norm = {k: (tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in attrs.items()}
        return self._add(Node(name, tuple(conv), norm))

    def build(self, outputs: Sequence[Ref]) -> Graph:
        """The graph with ``outputs`` (not yet validated: infer/evaluate do that)."""
        return Graph(tuple(self.nodes), tuple(o.index for o in outputs))

"""The lazy graph behind remote tensors: nodes recorded client-side, built into engine graphs.

Recording must be cheap (it runs once per ATen op), so a recorded node is a
small slotted object pointing at its arguments; nothing is validated or
numbered until a graph is *built* for some outputs. Building walks the nodes
reachable from the outputs once, in post order, and feeds the engine's own
:class:`~dpnode.core.engine.GraphBuilder`, so that the client and the node agree on the
graph by construction. Encoding uses the engine's wire format; the structure
hash (the header without constant values) lets a training loop recognise that
this step's graph has the same structure as the last one.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import torch

from dpnode.core.engine import Graph, GraphBuilder, Ref
from dpnode.core.engine import wire as _wire
from dpnode.sdk._remote.privacy import (
    CALLS,
    PUBLIC_ONLY,
    display_call,
    is_private_input,
    not_publishable,
    not_selectable,
)

__all__ = [
    "NP_OF",
    "TORCH_NAMES",
    "Encoded",
    "Node",
    "build",
    "constant",
    "encode_graph",
    "input_node",
    "origins",
    "prim",
    "recorded_by",
]

#: torch dtype -> the engine's dtype name (the vocabulary's dtype table)
TORCH_NAMES: dict[torch.dtype, str] = {
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
#: engine dtype name -> torch dtype
TORCH_OF: dict[str, torch.dtype] = {v: k for k, v in TORCH_NAMES.items()}
NP_OF: dict[torch.dtype, Any] = {
    torch.bool: np.bool_,
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.float32: np.float32,
    torch.float64: np.float64,
}

Arg = Any  # Node | bool | int | float | None


class Node:
    """One recorded value: a prim applied to arguments, an input, or a constant.

    ``shape`` and ``dtype`` are set when the value is known to the client (every
    tensor a user holds, and the arguments a rule sees); intermediates made
    inside a rule may leave them unset.

    ``private``: the value is a dataset's or computed from one (see ``privacy.py``).
    Recording a prim without a privacy rule on a private argument raises
    :class:`~sdk.NotPublishableError` here, whichever rule or view records it.
    """

    __slots__ = ("args", "attrs", "call", "dtype", "op", "origin", "private", "shape", "value")

    private: bool

    def __init__(
        self,
        op: str,
        args: tuple[Arg, ...] = (),
        attrs: dict[str, Any] | None = None,
        value: npt.NDArray[Any] | None = None,
        shape: tuple[int, ...] | None = None,
        dtype: torch.dtype | None = None,
        origin: Any = None,
    ) -> None:
        private = False
        for a in args:
            if type(a) is Node and a.private:
                private = True
                break
        if private and op in PUBLIC_ONLY:
            raise not_publishable(op)
        if private and any(_selected(a) for a in args):
            raise not_selectable()
        self.private = private
        self.op = op
        self.args = args
        self.attrs = attrs if attrs is not None else {}
        self.value = value
        self.shape = shape
        self.dtype = dtype
        #: for inputs: the client of the node that holds the data (not sent)
        self.origin = origin
        #: the outermost torch function that was running when this was recorded (not sent):
        #: a refusal by the node names it beside the prim
        self.call = CALLS.func

    def __repr__(self) -> str:
        return f"<Node {self.op} {self.shape} {self.dtype}>"


def _selected(a: Arg) -> bool:
    """Whether ``a`` is a quantile of private values (released only on its own)."""
    return type(a) is Node and a.private and a.op == "quantile"


def prim(op: str, *args: Arg, **attrs: Any) -> Node:
    """Record prim ``op`` on ``args`` (nodes, Python scalars or None)."""
    for a in args:
        if type(a) is float and a != a:
            # the wire refuses NaN scalars; inf - inf is NaN, as a 0-dim float32 that
            # promotes exactly like the Python float it stands for
            args = tuple(nan_node() if type(b) is float and b != b else b for b in args)
            break
    return Node(op, args, attrs)


def nan_node(shape: tuple[int, ...] = (), dtype: str = "float32") -> Node:
    """A NaN-filled value (NaN itself cannot travel as a scalar or a fill value)."""
    inf = Node("full", (), {"shape": shape, "value": math.inf, "dtype": dtype})
    return Node("sub", (inf, inf), {})


def input_node(
    name: str,
    shape: Sequence[int],
    dtype: torch.dtype,
    origin: Any = None,
    private: bool | None = None,
) -> Node:
    """A named placeholder (e.g. ``"dataset:3/age"``) bound to values where the graph runs.

    ``origin``: the client of the node holding the data, so that a publish goes there.
    ``private``: whether its values are private; by default, from the name as the node
    decides it (a dataset's columns are, its ``@subject`` grouping and model weights not).
    """
    shape = tuple(shape)
    attrs = {"name": name, "dtype": TORCH_NAMES[dtype], "shape": shape}
    node = Node("input", (), attrs, None, shape, dtype, origin)
    node.private = is_private_input(name) if private is None else private
    return node


def constant(t: torch.Tensor) -> Node:
    """A public constant: a copy of a local tensor's values, travelling with the graph."""
    t = t.detach()
    if t.dtype not in NP_OF:
        raise TypeError(f"local tensors of dtype {t.dtype} cannot be sent to the node")
    if t.dtype.is_floating_point and bool(t.isnan().any()):
        # the wire refuses NaN in constants: send the NaN positions as a bool mask instead
        name = TORCH_NAMES[t.dtype]
        filled = constant(torch.nan_to_num(t, nan=0.0, posinf=math.inf, neginf=-math.inf))
        nan = nan_node((), name)
        node = Node("where", (constant(t.isnan()), nan, filled), {})
        node.shape, node.dtype = tuple(t.shape), t.dtype
        return node
    t = t.cpu().contiguous()
    # torch has no NumPy view of bfloat16: via float32, which holds every bfloat16 exactly
    arr = (
        t.float().numpy().astype(NP_OF[t.dtype]) if t.dtype == torch.bfloat16 else t.numpy().copy()
    )
    arr.flags.writeable = False
    return Node("constant", (), {}, arr, tuple(t.shape), t.dtype)


def origins(outputs: Iterable[Node]) -> list[Any]:
    """The distinct clients the inputs reachable from ``outputs`` came from (in order)."""
    seen: set[int] = set()
    found: list[Any] = []
    stack = list(outputs)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.origin is not None and all(node.origin is not f for f in found):
            found.append(node.origin)
        stack.extend(a for a in node.args if type(a) is Node)
    return found


def count_ops(outputs: Iterable[Node]) -> int:
    """Number of prim nodes reachable from ``outputs`` (inputs and constants excluded)."""
    seen: set[int] = set()
    stack = list(outputs)
    n = 0
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op not in ("input", "constant"):
            n += 1
        stack.extend(a for a in node.args if type(a) is Node)
    return n


def build(outputs: Sequence[Node], order: dict[int, Node] | None = None) -> Graph:
    """The engine graph computing ``outputs`` (each node once, inputs deduplicated by name).

    ``order``, when given, receives the recorded node behind each graph node's index."""
    b = GraphBuilder()
    refs: dict[int, Ref] = {}
    inputs: dict[str, Ref] = {}
    # iterative post-order: graphs of a long training loop are deep
    stack: list[tuple[Node, bool]] = [(o, False) for o in reversed(outputs)]
    while stack:
        node, ready = stack.pop()
        key = id(node)
        if key in refs:
            continue
        if not ready:
            stack.append((node, True))
            stack.extend(
                (a, False) for a in reversed(node.args) if type(a) is Node and id(a) not in refs
            )
            continue
        if node.op == "input":
            name = node.attrs["name"]
            ref = inputs.get(name)
            if ref is None:
                ref = inputs[name] = b.input(name, node.attrs["dtype"], node.attrs["shape"])
        elif node.op == "constant":
            assert node.value is not None
            ref = b._add(_const(node.value))
        else:
            args = [refs[id(a)] if type(a) is Node else a for a in node.args]
            ref = b.op(node.op, *args, **node.attrs)
        refs[key] = ref
        if order is not None:
            order.setdefault(ref.index, node)
    return b.build([refs[id(o)] for o in outputs])


_NODE_REFUSED = re.compile(r"node ([0-9]{1,9}) \(([a-z_0-9]+)\)")


def recorded_by(outputs: Sequence[Node], message: str) -> str | None:
    """The torch call that recorded the node a refusal's ``message`` names (``node 12 (div)``),
    as messages show calls (``torch.div``, ``Tensor.float``), if it is known.

    >>> x = prim("neg", constant(torch.ones(2)))
    >>> recorded_by([x], "node 1 (neg): refused") is None  # recorded outside any torch call
    True
    """
    found = _NODE_REFUSED.search(message)
    if found is None:
        return None
    order: dict[int, Node] = {}
    build(outputs, order)
    node = order.get(int(found.group(1)))
    if node is None or node.op != found.group(2) or node.call is None:
        return None
    return display_call(node.call)


def _const(value: npt.NDArray[Any]) -> Any:
    # the value is already a private read-only copy: skip GraphBuilder.constant's second copy
    from dpnode.core.engine import Node as EngineNode

    return EngineNode("constant", (), {}, value)


@dataclass(frozen=True)
class Encoded:
    """One graph in the wire format, with the hash of its structure (constants excluded)."""

    frame: bytes
    structure_hash: str
    constant_bytes: int


def encode_graph(graph: Graph) -> Encoded:
    """Encode ``graph`` once, computing its structure hash from the same header.

    Raises:
        GraphError: the graph breaks the wire format's rules (the SDK's error for the
            node's own check, which runs here before anything is sent).
    """
    from dpnode.core.errors import DPNodeError as CoreError
    from dpnode.sdk._exceptions import BY_CODE, GraphError

    try:
        header, buf = _wire._header_and_buffer(graph)
    except CoreError as exc:
        raise BY_CODE.get(exc.code, GraphError)(str(exc)) from exc
    canon = json.dumps(
        header, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )
    digest = hashlib.sha256(canon.encode()).hexdigest()
    h = canon.encode()
    h += b" " * ((-(len(h) + len(_wire.MAGIC) + 8)) % 16)
    frame = _wire.MAGIC + len(h).to_bytes(8, "little") + h + buf
    return Encoded(frame, digest, len(buf))

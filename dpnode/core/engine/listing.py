"""A graph as readable pseudo-torch, for the people who approve it.

An admin deciding on a publish reads what it computes: each input named by its dataset and
column (with its declared bounds), each prim written as the torch call or operator it
stands for, each value's dtype and shape, and what is released. The listing is made from
the graph and its plan alone (public by construction: structure, shapes, public constants),
never from private values, and it is bounded: a graph of thousands of prims lists its first
:data:`MAX_LINES` lines, then how many it left out, and no line is longer than
:data:`MAX_LINE`, so that a stored listing stays small whatever was sent.

>>> from dpnode.core.engine import GraphBuilder, plan
>>> b = GraphBuilder()
>>> bmi = b.input("dataset:1/bmi", "float64", (442,))
>>> p = plan(b.build([b.op("mean", bmi, dims=[0])]))
>>> print("\\n".join(listing(p, {"dataset:1/bmi": 'diabetes["bmi"]  bounds [18, 42]'})))
x0 = diabetes["bmi"]   # float64 (442,) bounds [18, 42]
x1 = x0.mean(dims=[0])   # float64 ()
release x1
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from dpnode.core.engine.evaluator import Plan
from dpnode.core.engine.graph import Arg, Node, Ref
from dpnode.core.engine.prims import REGISTRY
from dpnode.core.engine.prims.registry import Scalar, TensorMeta

__all__ = ["MAX_LINE", "MAX_LINES", "listing"]

#: Lines of prims listed at most (the release line and a count of the rest come after).
MAX_LINES = 200
#: Characters in one line at most (a longer one ends in an ellipsis).
MAX_LINE = 240
#: Elements of a public constant written out; a larger one is named by its dtype and shape.
_SHOWN_ELEMENTS = 6

#: Prims that torch writes as an operator: binary ones ``a + b``, unary ones ``-a``.
_BINARY = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "floor_divide": "//",
    "remainder": "%",
    "pow": "**",
    "matmul": "@",
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "bitwise_and": "&",
    "bitwise_or": "|",
    "bitwise_xor": "^",
    "bitwise_left_shift": "<<",
    "bitwise_right_shift": ">>",
}
_UNARY = {"neg": "-", "bitwise_not": "~"}
#: Prims with another name in torch (as a method of their first argument).
_TORCH_NAMES = {"convert_element_type": "to", "index": "__getitem__", "slice": "narrow"}


def _name(i: int) -> str:
    return f"x{i}"


def _meta(meta: TensorMeta) -> str:
    shape = "(" + ", ".join(str(s) for s in meta.shape) + ("," if len(meta.shape) == 1 else "")
    return f"{meta.dtype.name} {shape})"


def _value(value: Any) -> str:
    """A public value (a scalar, an attribute) as Python writes it, lists for tuples.

    >>> _value((0, 1)), _value(0.5), _value(True), _value("float32")
    ('[0, 1]', '0.5', 'True', 'float32')
    """
    if isinstance(value, tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _arg(arg: Arg) -> str:
    if isinstance(arg, Ref):
        return _name(arg.index)
    if isinstance(arg, Scalar):
        return _value(arg.value)
    return "None"


def _constant(node: Node, meta: TensorMeta) -> str:
    value = node.value
    if value is not None and value.size <= _SHOWN_ELEMENTS:
        shown = np.asarray(value).tolist()
        return f"tensor({shown}, dtype={meta.dtype.name})"
    return f"constant({meta.dtype.name}, shape={_value(tuple(meta.shape))})"


def _call(node: Node) -> str:
    """One prim as torch writes it."""
    args = [_arg(a) for a in node.args]
    specs = REGISTRY[node.op].attrs
    attrs = [  # as torch's defaults, left out
        f"{k}={_value(v)}"
        for k, v in node.attrs.items()
        if v is not None and not (k in specs and specs[k].optional and v == specs[k].default)
    ]
    if node.op in _BINARY and len(args) == 2 and not attrs:
        return f"{args[0]} {_BINARY[node.op]} {args[1]}"
    if node.op in _UNARY and len(args) == 1 and not attrs:
        return f"{_UNARY[node.op]}{args[0]}"
    name = _TORCH_NAMES.get(node.op, node.op)
    if node.args and isinstance(node.args[0], Ref):  # a method of its first argument
        return f"{args[0]}.{name}({', '.join(args[1:] + attrs)})"
    return f"torch.{name}({', '.join(args + attrs)})"


def _line(text: str) -> str:
    return text if len(text) <= MAX_LINE else text[: MAX_LINE - 1] + "…"


def listing(
    plan: Plan,
    inputs: Mapping[str, str],
    *,
    release: str = "",
    max_lines: int = MAX_LINES,
) -> list[str]:
    """``plan``'s graph as lines of pseudo-torch, one per node, then what is released.

    Args:
        plan: a planned graph (its nodes' shapes and dtypes are written after each line).
        inputs: for each input name (``"dataset:3/bmi"``), how to call it, optionally
            followed by two spaces and a note (``'diabetes["bmi"]  bounds [18, 42]'``); an
            input not named here is written with its name on the wire.
        release: a note on the release line (sensitivity, mechanism, noise scale).
        max_lines: nodes listed at most; the rest are counted on one line.

    Returns:
        The lines, each at most :data:`MAX_LINE` characters: at most ``max_lines + 2``.
    """
    graph = plan.graph
    lines: list[str] = []
    for i, (node, meta) in enumerate(zip(graph.nodes, plan.metas, strict=True)):
        if i >= max_lines:
            left = len(graph.nodes) - max_lines
            lines.append(f"# ... {left} more {'line' if left == 1 else 'lines'} not shown")
            break
        note = ""
        if node.op == "input":
            wire = str(node.attrs["name"])
            text, _, note = inputs.get(wire, repr(wire)).partition("  ")
        elif node.op == "constant":
            text = _constant(node, meta)
        else:
            text = _call(node)
        comment = f"{_meta(meta)} {note}".rstrip()
        lines.append(_line(f"{_name(i)} = {text}   # {comment}"))
    released = ", ".join(_name(o) for o in graph.outputs)
    lines.append(_line(f"release {released}" + (f"  # {release}" if release else "")))
    return lines

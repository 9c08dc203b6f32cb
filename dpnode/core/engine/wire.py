"""The wire format of graphs: one self-contained binary frame.

    frame  = b"DPG\\x01" | u64 little-endian header length | header | buffer
    header = canonical JSON (sorted keys, no whitespace, ASCII), padded with
             spaces to a multiple of 16 bytes so the buffer stays aligned
    buffer = the constants' raw little-endian bytes, each at a 16-aligned offset

The header is ``{"version", "nodes", "outputs"}``; a node is
``{"op", "args"?, "attrs"?, "constant"?}``. An argument is a node index
(an earlier node), ``null``, or ``{"scalar": v, "type": "bool"|"int"|"float"}``
(non-finite floats as the strings "inf"/"-inf"). A constant is described by
``{"dtype", "shape", "offset", "nbytes"}`` into the buffer. Nothing in a frame
is ever executed, unpickled or imported; every field is type- and
range-checked, and the structure is validated against the prim schemas.

:func:`structure_hash` hashes the header only: two frames that differ in
constant *values* (a training loop's weights) share it, so a node can cache
plans by it; :func:`content_hash` covers the whole frame.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpnode.core.engine.dtypes import dtype, from_numpy
from dpnode.core.engine.graph import (
    Arg,
    Graph,
    Node,
    Ref,
    check_constant,
    validate_structure,
    with_values,
)
from dpnode.core.engine.identity import ByIdentity
from dpnode.core.engine.prims import PRIM_VERSION, REGISTRY
from dpnode.core.engine.prims.registry import AttrValue, Scalar
from dpnode.core.engine.quotas import WireLimits
from dpnode.core.engine.subnormals import flush
from dpnode.core.errors import GraphError, PayloadTooLargeError

__all__ = [
    "Layout",
    "content_hash",
    "decode",
    "decode_layout",
    "encode",
    "header_of",
    "hollow_constants",
    "rebind",
    "structure_hash",
]

MAGIC = b"DPG\x01"
_PREFIX = len(MAGIC) + 8
_ALIGN = 16

if sys.byteorder != "little":  # pragma: no cover - every platform we ship on
    raise ImportError("dpnode's wire format assumes a little-endian host")


def _canon(obj: Any) -> bytes:
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def _enc_float(v: float) -> float | str:
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if math.isnan(v):
        return "nan"
    return v


def _enc_arg(a: Arg) -> Any:
    if isinstance(a, Ref):
        return a.index
    if a is None:
        return None
    v = a.value
    kind = "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float"
    return {"scalar": _enc_float(v) if kind == "float" else v, "type": kind}


def _enc_attr(v: AttrValue) -> Any:
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, float):
        return _enc_float(v)
    return v


def _header_and_buffer(graph: Graph) -> tuple[dict[str, Any], bytes]:
    # validation fills attribute defaults, so equal graphs encode equally
    graph = validate_structure(graph)
    nodes: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    offset = 0
    for n in graph.nodes:
        d: dict[str, Any] = {"op": n.op}
        if n.args:
            d["args"] = [_enc_arg(a) for a in n.args]
        attrs = {k: _enc_attr(v) for k, v in n.attrs.items() if v is not None}
        if attrs:
            d["attrs"] = attrs
        if n.op == "constant":
            assert n.value is not None
            raw = np.ascontiguousarray(n.value).tobytes()
            pad = (-offset) % _ALIGN
            chunks.append(b"\0" * pad)
            offset += pad
            d["constant"] = {
                "dtype": from_numpy(n.value.dtype).name,
                "shape": list(n.value.shape),
                "offset": offset,
                "nbytes": len(raw),
            }
            chunks.append(raw)
            offset += len(raw)
        nodes.append(d)
    header = {"version": graph.version, "nodes": nodes, "outputs": list(graph.outputs)}
    return header, b"".join(chunks)


def header_of(graph: Graph) -> dict[str, Any]:
    """The JSON-able header of ``graph`` (constants described, not included)."""
    return _header_and_buffer(graph)[0]


def encode(graph: Graph) -> bytes:
    """Encode ``graph`` as one canonical frame (equal graphs give equal bytes)."""
    header, buf = _header_and_buffer(graph)
    h = _canon(header)
    h += b" " * ((-(len(h) + _PREFIX)) % _ALIGN)
    return MAGIC + struct.pack("<Q", len(h)) + h + buf


#: structure hashes of live graphs: a publish hashes its graph more than once
_HASHES: ByIdentity[str] = ByIdentity()


def structure_hash(graph: Graph) -> str:
    """sha256 of the header: the graph's structure without constant values."""
    known = _HASHES.get(graph)
    if known is None:
        known = hashlib.sha256(_canon(header_of(graph))).hexdigest()
        _HASHES.put(graph, known)
    return known


def _same_structure(template: Graph, nodes: list[Node]) -> Graph:
    """``template`` with other constants' values (checked): as valid, with the same hash."""
    out = with_values(template, nodes)
    known = _HASHES.get(template)
    if known is not None:
        _HASHES.put(out, known)
    return out


def content_hash(frame: bytes) -> str:
    """sha256 of a whole frame."""
    return hashlib.sha256(frame).hexdigest()


# -- decoding ----------------------------------------------------------------


def _fail(msg: str) -> GraphError:
    return GraphError(f"malformed graph frame: {msg}")


def _refuse_constant(name: str) -> Any:
    raise _fail(f"JSON constant {name} is not allowed")


def _int(v: Any, where: str, lo: int = -(2**63), hi: int = 2**63 - 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise _fail(f"{where} must be an integer in [{lo}, {hi}], got {v!r:.40}")
    return v


def _dec_float(v: Any, where: str) -> float:
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise _fail(f"{where} must be a number, got {v!r:.40}")


def _dec_arg(a: Any, where: str) -> Arg:
    if a is None:
        return None
    if isinstance(a, int) and not isinstance(a, bool):
        return Ref(a)
    if isinstance(a, dict) and set(a) == {"scalar", "type"}:
        t, v = a["type"], a["scalar"]
        if t == "bool" and isinstance(v, bool):
            return Scalar(v)
        if t == "int":
            return Scalar(_int(v, where))
        if t == "float":
            return Scalar(_dec_float(v, where))
    raise _fail(f"{where}: an argument is a node index, null or a typed scalar, got {a!r:.60}")


def _dec_attrs(op: str, raw: Any, where: str) -> dict[str, AttrValue]:
    if not isinstance(raw, dict):
        raise _fail(f"{where}: attrs must be an object")
    specs = REGISTRY[op].attrs if op in REGISTRY else {}
    out: dict[str, AttrValue] = {}
    for k, v in raw.items():
        kind = specs[k].kind if k in specs else None
        if (op == "input" and k == "shape") or kind in ("ints", "shape"):
            if not isinstance(v, list):
                raise _fail(f"{where}: attribute {k!r} must be a list of integers")
            out[k] = tuple(_int(e, f"{where} attribute {k!r}") for e in v)
        elif kind == "float":
            out[k] = _dec_float(v, f"{where} attribute {k!r}")
        elif isinstance(v, (bool, int, str)) or v is None or isinstance(v, float):
            out[k] = v
        else:
            raise _fail(f"{where}: attribute {k!r} has an unsupported value {v!r:.40}")
    return out


def _dec_constant(
    raw: Any, buf: memoryview, where: str, budget: list[int]
) -> tuple[np.ndarray[Any, Any], int]:
    if not isinstance(raw, dict) or set(raw) != {"dtype", "shape", "offset", "nbytes"}:
        raise _fail(f"{where}: a constant is described by dtype, shape, offset and nbytes")
    d = dtype(raw["dtype"])
    shape_raw = raw["shape"]
    if not isinstance(shape_raw, list) or len(shape_raw) > 64:
        raise _fail(f"{where}: constant shape must be a list of at most 64 dims")
    shape = tuple(_int(s, f"{where} shape", 0, 2**62) for s in shape_raw)
    offset = _int(raw["offset"], f"{where} offset", 0, len(buf))
    nbytes = _int(raw["nbytes"], f"{where} nbytes", 0, len(buf))
    _check_in_buffer(where, offset, nbytes, buf)
    if math.prod(shape) * d.itemsize != nbytes:
        raise _fail(f"{where}: {nbytes} bytes do not hold a {d.name} tensor of shape {list(shape)}")
    budget[0] -= nbytes
    if budget[0] < 0:
        raise PayloadTooLargeError("graph constants exceed the size limit")
    return _constant_at(where, buf, offset, d.np, shape), offset


def _check_in_buffer(where: str, offset: int, nbytes: int, buf: memoryview) -> None:
    if offset + nbytes > len(buf):
        raise _fail(
            f"{where}: constant bytes [{offset}, {offset + nbytes}) lie outside "
            f"the {len(buf)}-byte buffer"
        )


def _constant_at(
    where: str, buf: memoryview, offset: int, np_dtype: Any, shape: tuple[int, ...]
) -> np.ndarray[Any, Any]:
    """The read-only view of a constant's bytes (in the buffer), a bool's checked 0 or 1, and
    subnormal floats flushed to zero (a read-only copy then): the engine's arithmetic never
    meets one (:mod:`dpnode.core.engine.subnormals`)."""
    arr = np.frombuffer(buf, dtype=np_dtype, count=math.prod(shape), offset=offset).reshape(shape)
    if arr.dtype == np.bool_ and arr.view(np.uint8).max(initial=0) > 1:
        raise _fail(f"{where}: bool constant holds bytes other than 0 and 1")
    flushed = flush(arr)
    if flushed is not arr:
        flushed.flags.writeable = False
    return flushed  # type: ignore[no-any-return]


def _check_frame_size(frame: bytes, lim: WireLimits) -> None:
    if len(frame) > lim.max_frame_bytes:
        raise PayloadTooLargeError(
            f"graph frame of {len(frame):,} bytes exceeds {lim.max_frame_bytes:,}"
        )


@dataclass(frozen=True)
class Layout:
    """Where a frame's constants lie in its buffer: (node index, byte offset) of each. Frames
    with the same header have the same layout (the header says it)."""

    constants: tuple[tuple[int, int], ...]


def decode(frame: bytes, limits: WireLimits | None = None) -> Graph:
    """Parse and validate one frame into a :class:`Graph` (constants are read-only views)."""
    return decode_layout(frame, limits)[0]


def rebind(graph: Graph, layout: Layout, frame: bytes, limits: WireLimits | None = None) -> Graph:
    """``graph``, decoded from a frame with the same header as ``frame`` (the caller knows
    it: a structure cache keyed by the header's hash), with ``frame``'s constants: what
    :func:`decode` would return for ``frame``, without parsing and validating the header
    again. Each constant is checked as :func:`decode` checks it (it lies in the buffer, a
    bool holds 0 or 1, a float holds no NaN).

    Raises:
        PayloadTooLargeError: the frame is over ``limits``.
        GraphError: a constant lies outside the buffer or holds a refused value.
    """
    _check_frame_size(frame, limits or WireLimits())
    (hlen,) = struct.unpack("<Q", bytes(frame[4:_PREFIX]))
    buf = memoryview(bytes(frame[_PREFIX + hlen :]))
    nodes = list(graph.nodes)
    for i, offset in layout.constants:
        where, old = f"node {i}", nodes[i]
        assert old.value is not None
        _check_in_buffer(where, offset, old.value.nbytes, buf)
        arr = _constant_at(where, buf, offset, old.value.dtype, old.value.shape)
        check_constant(f"{where} ('constant')", arr)
        nodes[i] = Node(old.op, old.args, old.attrs, arr)
    return _same_structure(graph, nodes)


def hollow_constants(graph: Graph) -> Graph:
    """``graph`` with each constant's value replaced by a zero-stride view of its shape and
    dtype: the template :func:`rebind` fills, holding no constant's bytes."""
    structure_hash(graph)  # once, for every graph rebuilt from the template
    nodes = [
        n
        if n.value is None
        else Node(
            n.op, n.args, n.attrs, np.broadcast_to(np.zeros((), n.value.dtype), n.value.shape)
        )
        for n in graph.nodes
    ]
    return _same_structure(graph, nodes)


def decode_layout(frame: bytes, limits: WireLimits | None = None) -> tuple[Graph, Layout]:
    """Parse and validate one frame into a :class:`Graph`, and the :class:`Layout` that
    :func:`rebind` reads the constants of later frames with the same header by.

    Raises:
        PayloadTooLargeError: frame, header or constants over ``limits``.
        GraphError: anything malformed, with the reason.
    """
    lim = limits or WireLimits()
    if not isinstance(frame, (bytes, bytearray, memoryview)):
        raise _fail("expected bytes")
    _check_frame_size(frame, lim)
    if len(frame) < _PREFIX or bytes(frame[:4]) != MAGIC:
        raise _fail(
            "missing the DPG\\x01 magic; not a dpnode graph frame (or another format version)"
        )
    (hlen,) = struct.unpack("<Q", bytes(frame[4:_PREFIX]))
    if hlen > lim.max_header_bytes:
        raise PayloadTooLargeError(
            f"graph header of {hlen:,} bytes exceeds {lim.max_header_bytes:,}"
        )
    if _PREFIX + hlen > len(frame):
        raise _fail(f"header length {hlen} runs past the end of the {len(frame)}-byte frame")
    try:
        header = json.loads(
            bytes(frame[_PREFIX : _PREFIX + hlen]).decode("ascii"), parse_constant=_refuse_constant
        )
    except GraphError:
        raise
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise _fail(f"header is not valid JSON: {str(e)[:80]}") from None
    buf = memoryview(bytes(frame[_PREFIX + hlen :]))
    if not isinstance(header, dict) or set(header) != {"version", "nodes", "outputs"}:
        raise _fail("header must be an object with exactly version, nodes and outputs")
    version = header["version"]
    if version != PRIM_VERSION:
        raise GraphError(
            f"graph uses prim vocabulary version {version!r:.20}; this node speaks {PRIM_VERSION!r}"
        )
    raw_nodes, raw_outputs = header["nodes"], header["outputs"]
    if not isinstance(raw_nodes, list) or not isinstance(raw_outputs, list):
        raise _fail("nodes and outputs must be lists")
    if len(raw_nodes) > lim.max_nodes:
        raise PayloadTooLargeError(
            f"graph has {len(raw_nodes):,} nodes; the limit is {lim.max_nodes:,}"
        )
    budget = [lim.max_constant_bytes]
    nodes: list[Node] = []
    layout: list[tuple[int, int]] = []
    for i, rn in enumerate(raw_nodes):
        where = f"node {i}"
        if not isinstance(rn, dict) or not set(rn) <= {"op", "args", "attrs", "constant"}:
            raise _fail(f"{where}: a node is an object with op, args, attrs, constant")
        op = rn.get("op")
        if not isinstance(op, str) or len(op) > lim.max_string:
            raise _fail(f"{where}: op must be a short string")
        if op not in REGISTRY and op not in ("input", "constant"):
            raise GraphError(
                f"{where} ({op!r:.40}): unknown prim; the vocabulary "
                f"(version {PRIM_VERSION}) is in docs/prims.md"
            )
        args_raw = rn.get("args", [])
        if not isinstance(args_raw, list) or len(args_raw) > lim.max_args:
            raise _fail(f"{where}: args must be a list of at most {lim.max_args}")
        args = tuple(_dec_arg(a, f"{where} argument {j}") for j, a in enumerate(args_raw))
        attrs = _dec_attrs(op, rn.get("attrs", {}), where)
        value = None
        if op == "constant":
            value, offset = _dec_constant(rn.get("constant"), buf, where, budget)
            layout.append((i, offset))
        elif "constant" in rn:
            raise _fail(f"{where}: only constant nodes carry constant data")
        nodes.append(Node(op, args, attrs, value))
    outputs = tuple(_int(o, "output", 0, len(nodes) - 1 if nodes else 0) for o in raw_outputs)
    return validate_structure(Graph(tuple(nodes), outputs, version)), Layout(tuple(layout))

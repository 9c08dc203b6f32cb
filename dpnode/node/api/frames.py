"""Tensor frames on the wire: safetensors bytes plus a JSON manifest in its metadata.

safetensors carries each array as raw bytes with an explicit dtype and shape and
cannot express code, so decoding never runs anything a client sent. The manifest
(what the arrays are, the declared contract) rides in the ``dpnode`` metadata key.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
from safetensors import SafetensorError
from safetensors.numpy import load, save

from dpnode.core.errors import InvalidRequestError, UploadRejectedError

MEDIA_TYPE = "application/vnd.dpnode.tensors"
MANIFEST_KEY = "dpnode"
#: safetensors dtypes NumPy can load (BF16 and the F8 types have no NumPy dtype).
READABLE_DTYPES = frozenset(
    {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64", "C64"}
)


def _header(data: bytes) -> dict[str, Any]:
    if len(data) < 8:
        raise InvalidRequestError("the body is not a tensor frame: it is shorter than 8 bytes")
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8:
        raise InvalidRequestError("the tensor frame's header runs past the end of the body")
    if b"\\u0000" in data[8 : 8 + length]:  # a NUL in a name or the manifest (see api.nul)
        raise InvalidRequestError("the tensor frame's header may not contain the NUL character")
    try:
        header = json.loads(data[8 : 8 + length])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"the tensor frame's header is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequestError("the tensor frame's header is nested too deeply") from None
    if not isinstance(header, dict):
        raise InvalidRequestError("the tensor frame's header must be a JSON object")
    return header


def decode(data: bytes, *, max_elements: int) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """Split a frame into its manifest and arrays, checking sizes before loading.

    Raises:
        InvalidRequestError: the bytes are not a well-formed frame.
        UploadRejectedError: a tensor is larger than ``max_elements``.
    """
    header = _header(data)
    metadata = header.get("__metadata__") or {}
    try:
        manifest = json.loads(metadata.get(MANIFEST_KEY, "{}"))
    except (AttributeError, TypeError, json.JSONDecodeError) as exc:
        raise InvalidRequestError(f"the frame's manifest is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequestError("the frame's manifest is nested too deeply") from None
    if not isinstance(manifest, dict):
        raise InvalidRequestError("the frame's manifest must be a JSON object")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape = info.get("shape") if isinstance(info, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise InvalidRequestError(f"tensor {name!r} has a malformed shape in the frame")
        dtype = info.get("dtype")
        if not isinstance(dtype, str) or dtype not in READABLE_DTYPES:
            raise InvalidRequestError(
                f"tensor {name!r} has dtype {dtype!r}, which the node cannot read; send one of: "
                + ", ".join(sorted(READABLE_DTYPES))
            )
        if math.prod(shape) > max_elements:  # exact: Python integers
            raise UploadRejectedError(
                f"tensor {name!r} of shape {shape} is over the limit of {max_elements} elements"
            )
    try:
        arrays = load(data)
    except (SafetensorError, ValueError, TypeError) as exc:
        raise InvalidRequestError(f"malformed tensor frame: {exc}") from None
    return manifest, arrays


def encode(arrays: Mapping[str, npt.NDArray[Any]], manifest: Mapping[str, Any]) -> bytes:
    """Pack arrays and a manifest into one frame."""
    # np.ascontiguousarray makes 0-d arrays 1-d; reshape keeps scalar weights scalar.
    contiguous = {k: np.ascontiguousarray(v).reshape(np.shape(v)) for k, v in arrays.items()}
    return save(contiguous, metadata={MANIFEST_KEY: json.dumps(manifest)})


def split(arrays: Mapping[str, npt.NDArray[Any]], prefix: str) -> dict[str, npt.NDArray[Any]]:
    """The arrays named ``prefix/...``, without the prefix.

    >>> sorted(split({"data/a": 1, "mock/a": 2, "data/b": 3}, "data"))
    ['a', 'b']
    """
    start = prefix + "/"
    return {k[len(start) :]: v for k, v in arrays.items() if k.startswith(start)}

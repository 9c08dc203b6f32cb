"""Build and read tensor frames the way a client does: safetensors bytes plus a JSON manifest.

Written independently of ``dpnode.node.api.frames`` on purpose, so the tests check the wire
format itself rather than the node's own encoder agreeing with its own decoder.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from safetensors.numpy import load, save

Column = npt.NDArray[Any] | Sequence[str | None]


def contiguous(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """C-ordered, keeping 0-d arrays 0-d (``np.ascontiguousarray`` makes them 1-d)."""
    return np.ascontiguousarray(array).reshape(array.shape)


def _split(columns: Mapping[str, Column], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Arrays under ``prefix/<name>``; lists (string columns) go to the manifest instead."""
    arrays, strings = {}, {}
    for name, values in columns.items():
        if isinstance(values, np.ndarray):
            arrays[f"{prefix}/{name}"] = contiguous(values)
        else:
            strings[name] = list(values)
    return arrays, strings


def dataset_frame(
    name: str,
    data: Mapping[str, Column],
    *,
    bounds: Mapping[str, tuple[float, float]] | None = None,
    mock: Mapping[str, Column] | None = None,
    **manifest: Any,
) -> bytes:
    """An upload frame for ``POST /api/v1/datasets``.

    ``data`` and ``mock`` map column names to arrays, or to lists of strings for string
    columns. Other keyword arguments go into the manifest as given (``categories``,
    ``clamp``, ``fill``, ``subject_id``, ``tags``, ``description``, ``columns``, ...).
    """
    arrays, strings = _split(data, "data")
    body: dict[str, Any] = {"name": name, "columns": list(data), "bounds": dict(bounds or {})}
    if strings:
        body["strings"] = strings
    if mock is not None:
        mock_arrays, mock_strings = _split(mock, "mock")
        arrays |= mock_arrays
        if mock_strings:
            body["mock_strings"] = mock_strings
    body.update(manifest)
    return save(arrays, metadata={"dpnode": json.dumps(body)})


def model_frame(
    name: str,
    weights: Mapping[str, npt.NDArray[Any]],
    *,
    architecture: bytes | None = None,
    **manifest: Any,
) -> bytes:
    """An upload frame for ``POST /api/v1/models``."""
    arrays = {f"weight/{k}": contiguous(v) for k, v in weights.items()}
    if architecture is not None:
        arrays["architecture"] = np.frombuffer(architecture, dtype=np.uint8)
    body: dict[str, Any] = {"name": name, "tensors": list(weights)} | manifest
    return save(arrays, metadata={"dpnode": json.dumps(body)})


def raw_frame(header: Any, payload: bytes = b"") -> bytes:
    """A frame with an arbitrary JSON header, for malformed-frame tests."""
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + payload


def read_frame(body: bytes) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """The manifest and arrays of a frame the node sent back."""
    (length,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8 : 8 + length])
    manifest = json.loads(header.get("__metadata__", {}).get("dpnode", "{}"))
    return manifest, load(body)

"""Array bytes behind a small interface; the database keeps only metadata and hashes.

The default store is content-addressed files (``<dir>/ab/abcdef...``): writing is
atomic (temporary file, then rename), the same bytes are stored once, and every
read is verified against its SHA-256, so a corrupted or swapped file is detected
rather than computed on. Arrays travel as raw C-order bytes with their dtype and
shape kept beside them — never pickled.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["BlobStore", "CorruptBlobError", "FileBlobStore", "array_from_bytes", "array_to_bytes"]


class CorruptBlobError(RuntimeError):
    """A stored blob is missing or no longer matches its hash (an operator problem)."""


class BlobStore(Protocol):
    def put(self, data: bytes) -> str: ...
    def get(self, digest: str) -> bytes: ...
    def delete(self, digest: str) -> None: ...


class FileBlobStore:
    """Content-addressed files under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, digest: str) -> Path:
        if len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
            raise ValueError(f"not a SHA-256 digest: {digest!r}")
        return self.root / digest[:2] / digest

    def put(self, data: bytes) -> str:
        """Store ``data`` and return its SHA-256 hex digest."""
        digest = hashlib.sha256(data).hexdigest()
        path = self._path(digest)
        if path.exists():
            return digest
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest

    def get(self, digest: str) -> bytes:
        """Return the bytes stored under ``digest``, verified against it."""
        path = self._path(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CorruptBlobError(f"blob {digest} is missing from {self.root}") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise CorruptBlobError(f"blob {digest} does not match its hash: the file was altered")
        return data

    def delete(self, digest: str) -> None:
        self._path(digest).unlink(missing_ok=True)


def array_to_bytes(array: npt.NDArray[Any]) -> bytes:
    """Raw C-order bytes of ``array`` (little-endian, as every supported platform)."""
    return np.ascontiguousarray(array).tobytes()


def array_from_bytes(data: bytes, dtype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    """Rebuild a read-only array from raw bytes with an explicit dtype and shape."""
    array = np.frombuffer(data, dtype=np.dtype(dtype))
    return array.reshape(shape)

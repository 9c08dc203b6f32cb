"""Graph structures a user has already sent, so a training loop resends only constants.

A training step records the same graph every iteration; only its constants (the
current weights) change. A publish body is therefore one of:

    frame     = b"DPG\\x01" | u64 header length | header | buffer     (engine wire frame)
    reference = b"DPR\\x01" | sha256 of the header (32 raw bytes)   | buffer

The node remembers, per user, the header of every frame it decoded successfully,
keyed by the sha256 of the header's bytes. A reference is expanded to the same
bytes a full frame would have carried. With the header the node keeps what it made
of it: the validated, planned graph without its constants' values, and where they
lie in the buffer. A frame whose header it has (sent whole or by reference) is
rebuilt from that template and its own constants, each checked as a whole frame's
are, instead of being parsed, validated and planned again: the header was all of
that the first time, and a plan depends on the header alone (constants' shapes and
dtypes are in it). It trusts nothing it did not see whole. Entries are per user
(one user cannot probe another's structures), least-recently-used first out,
bounded in bytes by ``DPNODE_STRUCTURE_CACHE_BYTES``, and in memory only: after a
restart or an eviction the node answers ``unknown_structure`` and the SDK resends
the whole frame once.

>>> cache = StructureCache(max_bytes=1 << 20)
>>> frame = MAGIC + (16).to_bytes(8, "little") + b'{"nodes":[]}    ' + b"constants"
>>> cache.expand(7, frame) == frame      # a whole frame passes through...
True
>>> cache.remember(7, cache.find(7, frame))  # ...and is remembered once it decoded
>>> ref = reference(header_digest(frame), b"new constants")
>>> cache.expand(7, ref)[-13:]
b'new constants'
>>> cache.expand(8, ref)  # doctest: +ELLIPSIS
Traceback (most recent call last):
    ...
dpnode.core.errors.UnknownStructureError: this node has no graph structure ... send the whole frame
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from dataclasses import dataclass

from dpnode.core.errors import GraphError, UnknownStructureError

__all__ = ["MAGIC", "REF_MAGIC", "Found", "StructureCache", "header_digest", "reference", "split"]

MAGIC = b"DPG\x01"
REF_MAGIC = b"DPR\x01"
_PREFIX = len(MAGIC) + 8
_DIGEST = 32


def _split(frame: bytes) -> tuple[bytes, int] | None:
    """(the frame's prefix up to and including its header, the header length) or None."""
    if len(frame) < _PREFIX or frame[:4] != MAGIC:
        return None
    (hlen,) = struct.unpack("<Q", frame[4:_PREFIX])
    if _PREFIX + hlen > len(frame):
        return None
    return frame[: _PREFIX + hlen], hlen


def split(frame: bytes) -> tuple[bytes, bytes]:
    """(everything up to the end of the header, the constants buffer) of a frame."""
    parts = _split(frame)
    if parts is None:
        raise GraphError("malformed graph frame: no header")
    return parts[0], frame[len(parts[0]) :]


def header_digest(frame: bytes) -> bytes | None:
    """sha256 of a frame's header bytes, alignment padding excluded (32 raw bytes).

    This equals the graph's structure hash when the header is canonical, as the SDK's
    encoder writes it. None for bytes that are not a frame (the node's decoder says why).
    """
    parts = _split(frame)
    if parts is None:
        return None
    return hashlib.sha256(parts[0][_PREFIX:].rstrip(b" ")).digest()


def reference(digest: bytes, buffer: bytes) -> bytes:
    """The body that stands for a frame whose header the node already has."""
    if len(digest) != _DIGEST:
        raise ValueError("a structure digest is 32 bytes")
    return REF_MAGIC + digest + buffer


@dataclass(frozen=True)
class Found:
    """What a publish body stands for (:meth:`StructureCache.find`)."""

    #: the full frame
    frame: bytes
    #: the sha256 of its header (:func:`header_digest`); None: not a frame
    digest: bytes | None
    #: what the node kept with the header for this user, or None
    template: object


class StructureCache:
    """Per-user LRU map from header digest to header bytes, bounded in total bytes.

    An entry may also keep what the node made of the header when it decoded it whole (a
    template: the validated, planned graph without its constants' values, and where they
    lie), so that a frame with the same header is rebuilt from it and its own constants
    (:func:`dpnode.core.engine.wire.rebind`) instead of being parsed and planned again.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, bytes], tuple[bytes, object]] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def expand(self, user_id: int, body: bytes) -> bytes:
        """The full frame a body stands for (a full frame is returned as it is).

        Raises:
            UnknownStructureError: a reference to a header this user has not sent
                (or that was evicted): resend the whole frame.
        """
        return body if body[:4] != REF_MAGIC else self.find(user_id, body).frame

    def find(self, user_id: int, body: bytes) -> Found:
        """The full frame a body stands for, its header's digest, and the template kept with
        the header for ``user_id`` (None if none): a reference's digest is the one it
        carries, a full frame's is hashed once here.

        Raises:
            UnknownStructureError: as :meth:`expand`.
        """
        if body[:4] != REF_MAGIC:
            digest = header_digest(body)
            entry = None if digest is None else self._get(user_id, digest)
            return Found(body, digest, None if entry is None else entry[1])
        if len(body) < 4 + _DIGEST:
            raise GraphError("malformed graph reference: shorter than its 32-byte digest")
        digest = bytes(body[4 : 4 + _DIGEST])
        entry = self._get(user_id, digest)
        if entry is None:
            raise UnknownStructureError(
                f"this node has no graph structure {digest.hex()[:16]}... from you (it was "
                "never sent, evicted, or the node restarted): send the whole frame"
            )
        return Found(entry[0] + body[4 + _DIGEST :], digest, entry[1])

    def _get(self, user_id: int, digest: bytes) -> tuple[bytes, object] | None:
        with self._lock:
            entry = self._entries.get((user_id, digest))
            if entry is not None:
                self._entries.move_to_end((user_id, digest))
        return entry

    def remember(self, user_id: int, found: Found, template: object = None) -> None:
        """Keep a decoded frame's header (``found`` by :meth:`find`) for ``user_id``, with its
        ``template`` if given. The bound counts the header's bytes."""
        parts, digest = _split(found.frame), found.digest
        if parts is None or digest is None or len(parts[0]) > self.max_bytes:
            return
        prefix = parts[0]
        key = (user_id, digest)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                if template is not None:
                    self._entries[key] = (prefix, template)
                return
            self._entries[key] = (prefix, template)
            self._size += len(prefix)
            while self._size > self.max_bytes:
                _, (old, _) = self._entries.popitem(last=False)
                self._size -= len(old)

"""Array bytes behind a small interface; the database keeps only metadata and hashes.

The default store is content-addressed files (``<dir>/ab/abcdef...``): writing is
atomic (temporary file, then rename), the same bytes are stored once, and every
read from disk is verified against its SHA-256, so a corrupted or swapped file is
detected rather than computed on. Arrays travel as raw C-order bytes with their dtype
and shape kept beside them — never pickled.

Verified blobs are kept in a bounded in-memory cache (:class:`BlobCache`, least
recently used first out), so a column published from again and again is read and
hashed once, not on every publish (8 MB of SHA-256 is ~15% of a publish otherwise).
The trade-off: a blob is verified when it enters the cache; a file altered on disk
while its verified copy is cached changes nothing that is computed (the copy is what
is used) and is detected on the next read from disk, after eviction or a restart.
Cached bytes are immutable (``bytes``), and arrays made from them are read-only, so
nothing can change cached data.

A column too big to hold twice (hundreds of megabytes) is not read into ``bytes`` at all:
:meth:`FileBlobStore.open_array` maps its file read-only and the engine reads it block by
block (``dpnode.core.engine.blocks``), so the node holds the column once, in the page cache that
the mapping shares. Hashing 800 MB takes several times as long as the mean computed on
it, so a mapped file is verified once per *file identity* and process
(:class:`VerifiedFiles`): the first mapping of a blob hashes the mapped bytes themselves;
later ones only compare the file's ``(device, inode, size, mtime, ctime)`` with those of
the file verified. The store never changes a file in place (a blob is written to a
temporary file and renamed), so a blob written again comes with a new inode; any other
write to the file updates its ``ctime``, which no system call sets back, so an altered or
swapped file is hashed again before anything is computed on it. File times tick
coarsely (milliseconds), so a file changed in the last :data:`RECENT_NS` is not
remembered: a second change within one tick could leave its times as they were. What
this does not catch, and a full hash on every read (``get``) would: bytes changed under a
mapping while a computation runs (as a file altered while its copy is cached, but seen at
once, since the mapping shares the page cache), a wall clock set back by more than
:data:`RECENT_NS`, and a disk that corrupts data with no write through the file system.
Writes stream: :meth:`FileBlobStore.put_stream` takes chunks (an iterator, or a file
through :func:`file_chunks`), hashes them as they are written to a temporary file in the
store's directory, and renames that file to its digest at the end, so a blob of any size
is stored with one chunk in memory and a reader never sees a partial blob. The two halves
can be apart: :meth:`FileBlobStore.stage` writes and hashes (the long part), and
:meth:`FileBlobStore.keep` claims the digest and renames (a moment), so that a caller can
stage a whole table before it begins the transaction its rows commit in (SQLite's write
lock is then held for the renames, not for the writing).
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import re
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "BlobCache",
    "BlobStore",
    "Claim",
    "CorruptBlobError",
    "FileBlobStore",
    "SizedLru",
    "Staged",
    "VerifiedFiles",
    "array_chunks",
    "array_from_bytes",
    "array_to_bytes",
    "file_chunks",
]

#: Chunk size of streamed reads and writes (large enough to amortise the calls).
CHUNK_BYTES = 8 * 1024 * 1024


class CorruptBlobError(RuntimeError):
    """A stored blob is missing or no longer matches its hash (an operator problem)."""


#: Called by a write with the blob's digest, once every byte is hashed and before the store
#: looks for a copy it already has (``dpnode.node.services.blobs`` holds the blob there).
Claim = Callable[[str], None]


@dataclass(frozen=True)
class Staged:
    """A blob written and hashed beside the store but not in it yet: :meth:`BlobStore.keep`
    puts it there, :meth:`BlobStore.discard` drops it."""

    digest: str
    #: The temporary file that holds its bytes, synced.
    path: Path


K = TypeVar("K")
V = TypeVar("V")


class BlobStore(Protocol):
    def put(self, data: bytes, *, claim: Claim | None = None) -> str: ...
    def put_stream(
        self, chunks: Iterable[bytes | memoryview], *, claim: Claim | None = None
    ) -> str: ...
    def stage(self, chunks: Iterable[bytes | memoryview]) -> Staged: ...
    def keep(self, staged: Staged, *, claim: Claim | None = None) -> str: ...
    def discard(self, staged: Staged) -> None: ...
    def get(self, digest: str) -> bytes: ...
    def delete(self, digest: str) -> None: ...
    def open_array(self, digest: str, dtype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]: ...


class SizedLru(Generic[K, V]):
    """At most ``max_size`` worth of values (each weighing ``weight(value)``), least recently
    used out; a value heavier than the whole budget is never kept. For immutable values: a key
    kept already keeps its value. Safe to share between threads (one lock guards the index).
    """

    def __init__(self, max_size: int, weight: Callable[[V], int]) -> None:
        self.max_size = max_size
        self.size = 0
        self._weight = weight
        self._kept: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._kept.get(key)
            if value is not None:
                self._kept.move_to_end(key)
            return value

    def add(self, key: K, value: V) -> None:
        weight = self._weight(value)
        if weight > self.max_size:
            return
        with self._lock:
            if key in self._kept:
                self._kept.move_to_end(key)
                return
            self._kept[key] = value
            self.size += weight
            while self.size > self.max_size:
                _, old = self._kept.popitem(last=False)
                self.size -= self._weight(old)

    def discard(self, key: K) -> None:
        with self._lock:
            value = self._kept.pop(key, None)
            if value is not None:
                self.size -= self._weight(value)

    def keys(self) -> list[K]:
        with self._lock:
            return list(self._kept)


class BlobCache(SizedLru[str, bytes]):
    """Verified blobs in memory, at most ``max_bytes`` of them, least recently used out.

    The bytes are immutable, named by their hash. A blob larger than the whole budget is never
    cached; ``max_bytes`` 0 disables the cache.

    >>> cache = BlobCache(10)
    >>> cache.add("a", b"12345"); cache.add("b", b"67890"); cache.get("a")
    b'12345'
    >>> cache.add("c", b"xyz"); sorted(cache.digests()), cache.size
    (['a', 'c'], 8)
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(max_bytes, len)

    def digests(self) -> list[str]:
        return self.keys()


#: (device, inode, size, mtime ns, ctime ns) of an open file
FileIdentity = tuple[int, int, int, int, int]


def _identity(st: os.stat_result) -> FileIdentity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class VerifiedFiles:
    """The identity of each blob file whose bytes this process hashed and found right.

    >>> seen = VerifiedFiles()
    >>> seen.remember("a", (1, 2, 3, 4, 5)); seen.known("a", (1, 2, 3, 4, 5))
    True
    >>> seen.known("a", (1, 2, 3, 4, 6)), seen.known("b", (1, 2, 3, 4, 5))
    (False, False)
    """

    def __init__(self) -> None:
        self._files: dict[str, FileIdentity] = {}
        self._lock = threading.Lock()

    def known(self, digest: str, identity: FileIdentity) -> bool:
        with self._lock:
            return self._files.get(digest) == identity

    def remember(self, digest: str, identity: FileIdentity) -> None:
        with self._lock:
            self._files[digest] = identity

    def forget(self, digest: str) -> None:
        with self._lock:
            self._files.pop(digest, None)


#: a file changed less than this long ago is verified again on its next mapping: file times
#: come from a clock that ticks every few milliseconds, so a second change within one tick
#: would leave them as they were
RECENT_NS = 2_000_000_000

#: blobs of at least this many bytes are mapped by open_array; smaller ones are read into
#: the cache (a publish of a small column then makes no system call for it)
MAP_BYTES = 16 << 20
#: How a blob is named: its SHA-256, in lowercase hex.
_DIGEST = re.compile(r"[0-9a-f]{64}")

#: bytes hashed per update while verifying a mapping (hashlib releases the GIL meanwhile)
_HASH_CHUNK = 16 << 20


def _check_digest(digest: str) -> None:
    if _DIGEST.fullmatch(digest) is None:
        raise ValueError(f"not a SHA-256 digest: {digest!r}")


class FileBlobStore:
    """Content-addressed files under ``root``, with a cache of ``cache_bytes`` of verified blobs."""

    def __init__(self, root: Path, cache_bytes: int = 0) -> None:
        self.root = root
        self.cache = BlobCache(cache_bytes)
        self.verified = VerifiedFiles()

    def _path(self, digest: str) -> Path:
        _check_digest(digest)
        return self.root / digest[:2] / digest

    def put(self, data: bytes, *, claim: Claim | None = None) -> str:
        """Store ``data`` and return its SHA-256 hex digest (``claim`` as in :meth:`put_stream`)."""
        return self.put_stream((data,), claim=claim)

    def put_stream(
        self, chunks: Iterable[bytes | memoryview], *, claim: Claim | None = None
    ) -> str:
        """Store the concatenation of ``chunks`` and return its SHA-256 hex digest.

        :meth:`stage`, then :meth:`keep`: a failure (or an exception from ``chunks`` or
        ``claim``) leaves nothing behind.
        """
        return self.keep(self.stage(chunks), claim=claim)

    def stage(self, chunks: Iterable[bytes | memoryview]) -> Staged:
        """Write the concatenation of ``chunks`` beside the blobs, hashed as it comes (one
        chunk in memory at a time) and synced; an exception from ``chunks`` leaves nothing."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp-")
        try:
            sha = hashlib.sha256()
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    sha.update(chunk)
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return Staged(sha.hexdigest(), Path(tmp))

    def keep(self, staged: Staged, *, claim: Claim | None = None) -> str:
        """Put a staged blob in the store under its digest; the digest.

        ``claim`` is called with the digest before the store looks for a file it already
        has under that name, which it then keeps rather than the staged copy. The staged
        file is gone afterwards, whatever happens (an exception from ``claim`` included).
        """
        try:
            if claim is not None:
                claim(staged.digest)
            path = self._path(staged.digest)
            if path.exists():
                staged.path.unlink()
                return staged.digest
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged.path, path)
        except BaseException:
            self.discard(staged)
            raise
        return staged.digest

    def discard(self, staged: Staged) -> None:
        """Drop a staged blob that will not be kept."""
        staged.path.unlink(missing_ok=True)

    def get(self, digest: str) -> bytes:
        """Return the bytes stored under ``digest``, verified against it (once, if cached)."""
        _check_digest(digest)  # a malformed digest is refused, cached or not
        cached = self.cache.get(digest)
        if cached is not None:
            return cached
        try:
            data = self._path(digest).read_bytes()
        except FileNotFoundError:
            raise CorruptBlobError(f"blob {digest} is missing from {self.root}") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise CorruptBlobError(f"blob {digest} does not match its hash: the file was altered")
        self.cache.add(digest, data)
        return data

    def open_array(self, digest: str, dtype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        """The array stored under ``digest``, read-only; from its file's mapping when large.

        A blob under :data:`MAP_BYTES` is read as by :meth:`get` (verified, and cached).
        A larger one is mapped and its bytes hashed, unless this process already verified
        this very file (see the module docstring): the array's pages are then read only as
        a computation touches them, and never copied into ``bytes``.

        Raises:
            CorruptBlobError: the file is missing, of the wrong size for ``dtype`` and
                ``shape``, or does not match its hash.
        """
        kind = np.dtype(dtype)
        size = kind.itemsize * math.prod(shape)
        if size < MAP_BYTES:  # small: read, verified and kept in the cache, as by get
            data = self.get(digest)
            if len(data) != size:
                raise CorruptBlobError(
                    f"blob {digest} holds {len(data)} bytes, not the {size} of its "
                    f"{kind.name} array of shape {list(shape)}"
                )
            return array_from_bytes(data, dtype, shape)
        path = self._path(digest)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise CorruptBlobError(f"blob {digest} is missing from {self.root}") from None
        try:
            st = os.fstat(fd)  # of the file mapped, whatever the path names meanwhile
            if st.st_size != size:
                raise CorruptBlobError(
                    f"blob {digest} holds {st.st_size} bytes, not the {size} of its "
                    f"{kind.name} array of shape {list(shape)}"
                )
            view: bytes | mmap.mmap = (
                b"" if size == 0 else mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            )
        finally:
            os.close(fd)
        identity = _identity(st)
        if not self.verified.known(digest, identity):
            hasher = hashlib.sha256()
            pages = memoryview(view)
            for start in range(0, size, _HASH_CHUNK):
                hasher.update(pages[start : start + _HASH_CHUNK])
            pages.release()
            if hasher.hexdigest() != digest:
                raise CorruptBlobError(
                    f"blob {digest} does not match its hash: the file was altered"
                )
            # A file changed within the clock tick of its last change would keep its ctime:
            # one changed lately is hashed again next time (git's "racily clean" entries).
            if time.time_ns() - max(st.st_ctime_ns, st.st_mtime_ns) > RECENT_NS:
                self.verified.remember(digest, identity)
        return np.frombuffer(view, dtype=kind).reshape(shape)

    def delete(self, digest: str) -> None:
        path = self._path(digest)
        self.cache.discard(digest)
        self.verified.forget(digest)
        path.unlink(missing_ok=True)


def array_to_bytes(array: npt.NDArray[Any]) -> bytes:
    """Raw C-order bytes of ``array`` (little-endian, as every supported platform)."""
    return np.ascontiguousarray(array).tobytes()


def array_from_bytes(data: bytes, dtype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    """Rebuild a read-only array from raw bytes with an explicit dtype and shape.

    The array is a view of ``data`` (no copy). Over ``bytes`` it can never be made
    writeable, so an array of a cached blob cannot change the cache.
    """
    array = np.frombuffer(data, dtype=np.dtype(dtype))
    return array.reshape(shape)


def file_chunks(file: IO[bytes], size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """The bytes of an open binary file, ``size`` at a time (for :meth:`put_stream`).

    >>> import io
    >>> list(file_chunks(io.BytesIO(b"abcde"), 2))
    [b'ab', b'cd', b'e']
    """
    while chunk := file.read(size):
        yield chunk


def array_chunks(array: npt.NDArray[Any], size: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """The raw C-order bytes of ``array`` in pieces of about ``size`` bytes, without a copy
    of the whole (a non-contiguous array is made contiguous a block of rows at a time).

    >>> b"".join(array_chunks(np.arange(5, dtype=np.int8), 2))
    b'\\x00\\x01\\x02\\x03\\x04'
    """
    if array.size == 0:
        return
    rows = array.reshape(array.shape[0] if array.ndim else 1, -1)
    per_row = max(1, rows.shape[1] * array.dtype.itemsize)
    step = max(1, size // per_row)
    for start in range(0, rows.shape[0], step):
        block = np.ascontiguousarray(rows[start : start + step])
        yield memoryview(block.data).cast("B")

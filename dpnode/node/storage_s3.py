"""Blobs in an S3-compatible object store, with a verified local cache.

Objects are named by their SHA-256 (``<prefix><digest>``), so the store stays content-
addressed: the same bytes are uploaded once, and a read is verified against its name
whatever the remote store did with the bytes. A write streams through the local cache
first (:meth:`FileBlobStore.put_stream`: hashed as it is written, renamed to its digest),
because the object's name is known only once every byte is hashed; the file is then sent
as a multipart upload, a part at a time. A read is served from the local cache when the
file is there (verified as any local read), and otherwise downloaded into it, verified,
and kept: a column is fetched from the object store once per node. The cache directory
grows with what the node reads; it holds copies only, and may be emptied while the node
is stopped.

The trade-off: every blob is on local disk at least while it is written, so a node needs
disk for the largest blob it takes in; in exchange reads are local after the first, and
the read side (memory maps of stored columns) works the same as with a plain file store.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy.typing as npt

from dpnode.node.storage import Claim, CorruptBlobError, FileBlobStore, Staged

__all__ = ["S3BlobStore"]

#: Size of one part of a multipart upload (S3's minimum is 5 MiB).
PART_BYTES = 16 * 1024 * 1024


class S3BlobStore:
    """Content-addressed objects in ``bucket`` (an S3-compatible store reached through
    ``client``, a ``minio.Minio``), cached and verified under ``cache_dir``."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        cache_dir: Path,
        *,
        prefix: str = "",
        cache_bytes: int = 0,
        part_bytes: int = PART_BYTES,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.part_bytes = part_bytes
        self.local = FileBlobStore(cache_dir, cache_bytes)
        self.cache = self.local.cache

    @classmethod
    def connect(
        cls,
        endpoint: str,
        bucket: str,
        cache_dir: Path,
        *,
        access_key: str,
        secret_key: str,
        region: str | None = None,
        secure: bool = True,
        prefix: str = "",
        cache_bytes: int = 0,
    ) -> S3BlobStore:
        """A store on ``endpoint`` (host:port), creating ``bucket`` if it does not exist."""
        from minio import Minio

        client = Minio(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            region=region,
            secure=secure,
        )
        if not client.bucket_exists(bucket):
            client.make_bucket(bucket)
        return cls(client, bucket, cache_dir, prefix=prefix, cache_bytes=cache_bytes)

    def _key(self, digest: str) -> str:
        self.local._path(digest)  # refuses anything but a SHA-256 digest
        return self.prefix + digest

    def _exists(self, key: str) -> bool:
        from minio.error import S3Error

        try:
            self.client.stat_object(self.bucket, key)
        except S3Error as exc:
            if exc.code in ("NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound"):
                return False
            raise
        return True

    def put(self, data: bytes, *, claim: Claim | None = None) -> str:
        """Store ``data`` and return its SHA-256 hex digest (``claim`` as in :meth:`put_stream`)."""
        return self.put_stream((data,), claim=claim)

    def put_stream(
        self, chunks: Iterable[bytes | memoryview], *, claim: Claim | None = None
    ) -> str:
        """Store the concatenation of ``chunks``: hashed into the local cache a chunk at a
        time, then sent as a multipart upload of ``part_bytes`` parts (unless present).
        ``claim`` is called with the digest before the bucket is asked for the object."""
        return self.keep(self.stage(chunks), claim=claim)

    def stage(self, chunks: Iterable[bytes | memoryview]) -> Staged:
        """Write and hash ``chunks`` beside the local cache (:meth:`FileBlobStore.stage`)."""
        return self.local.stage(chunks)

    def keep(self, staged: Staged, *, claim: Claim | None = None) -> str:
        """Put a staged blob in the local cache (``claim`` as in :meth:`FileBlobStore.keep`),
        then in the bucket unless it is there."""
        digest = self.local.keep(staged, claim=claim)
        key = self._key(digest)
        if not self._exists(key):
            self.client.fput_object(
                self.bucket, key, str(self.local._path(digest)), part_size=self.part_bytes
            )
        return digest

    def discard(self, staged: Staged) -> None:
        """Drop a staged blob that will not be kept."""
        self.local.discard(staged)

    def get(self, digest: str) -> bytes:
        """The bytes stored under ``digest``, verified against it (downloaded once)."""
        self.local_path(digest)
        return self.local.get(digest)

    def open_array(self, digest: str, dtype: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        """The array stored under ``digest``, read-only: the local copy (downloaded once),
        then as :meth:`FileBlobStore.open_array` (mapped, and hashed once, when large)."""
        self.local_path(digest)
        return self.local.open_array(digest, dtype, shape)

    def local_path(self, digest: str) -> Path:
        """A local, verified copy of the blob, downloaded into the cache if need be.

        Raises:
            CorruptBlobError: the object is missing, or its bytes do not match its name.
        """
        from minio.error import S3Error

        path = self.local._path(digest)
        if path.exists():
            return path
        key = self._key(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                try:
                    response = self.client.get_object(self.bucket, key)
                except S3Error as exc:
                    raise CorruptBlobError(
                        f"blob {digest} is missing from bucket {self.bucket!r} ({exc.code})"
                    ) from None
                sha = hashlib.sha256()
                try:
                    for chunk in response.stream(1024 * 1024):
                        sha.update(chunk)
                        f.write(chunk)
                finally:
                    response.close()
                    response.release_conn()
            if sha.hexdigest() != digest:
                raise CorruptBlobError(
                    f"blob {digest} in bucket {self.bucket!r} does not match its hash: the "
                    "object was altered"
                )
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return path

    def delete(self, digest: str) -> None:
        self.local.delete(digest)
        self.client.remove_object(self.bucket, self._key(digest))

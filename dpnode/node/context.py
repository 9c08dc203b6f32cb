"""Everything a running node holds: settings, database, blob store, password hasher,
login throttle."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from argon2 import PasswordHasher
from pydantic import SecretStr
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from dpnode.core.engine.subnormals import single_threaded_blas
from dpnode.core.privacy.cache import TrackingCache
from dpnode.core.structures import StructureCache
from dpnode.node.cluster import Cluster
from dpnode.node.db.session import (
    make_engine,
    make_sessionmaker,
    read_engine,
    relaxed_engine,
    serial_engine,
)
from dpnode.node.services.datasets import KnownDatasets
from dpnode.node.services.leases import LeaseKeeper
from dpnode.node.services.release_plans import SelectionPlans
from dpnode.node.services.security import password_hasher
from dpnode.node.services.spending_mark import SpendingMark
from dpnode.node.services.synthesis_jobs import JobRunner
from dpnode.node.services.throttle import LoginThrottle, RequestLimit
from dpnode.node.services.uploads import UploadLimits, UploadSessions
from dpnode.node.settings import PLACEHOLDER_SECRET, Settings
from dpnode.node.storage import BlobStore, FileBlobStore


@dataclass
class NodeContext:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    #: Sessions whose transactions are serialised (budget checks and ledger rows).
    serial_sessions: sessionmaker[Session]
    #: Sessions that only read (see dpnode.node.db.session.read_engine).
    read_sessions: sessionmaker[Session]
    #: Sessions whose commits may be lost to a power failure, for writes a later request can
    #: do without (see dpnode.node.db.session.relaxed_engine).
    relaxed_sessions: sessionmaker[Session]
    store: BlobStore
    hasher: PasswordHasher
    #: Graph headers each user already sent (see dpnode.core.structures).
    structures: StructureCache = field(default_factory=lambda: StructureCache(0))
    #: Reports of graph structures tracked with their changing constants boxed
    #: (see dpnode.core.privacy.cache): a training loop's steps are tracked once every few steps.
    tracking: TrackingCache = field(default_factory=TrackingCache)
    #: The metadata of the datasets this process has computed on, checked by each charge
    #: (see dpnode.node.services.datasets.KnownDatasets): a publish on them reads none.
    known_datasets: KnownDatasets = field(default_factory=KnownDatasets)
    #: The plans of quantile releases, by the exact request (see
    #: dpnode.node.services.release_plans): the same median published again is not re-planned.
    selections: SelectionPlans = field(default_factory=SelectionPlans)
    #: Recent login attempts and failures, kept in this process (see dpnode.node.services.throttle).
    logins: LoginThrottle = field(init=False)
    #: Recent requests to a network's public routes, per client address (same module).
    network_searches: RequestLimit = field(init=False)
    #: Chunked uploads in progress, kept as files (see dpnode.node.services.uploads).
    uploads: UploadSessions = field(init=False)
    #: This process's charged, unanswered publishes (see dpnode.node.services.leases).
    leases: LeaseKeeper = field(init=False)
    #: Spending kept outside the database, and this process's reservation in it (see
    #: dpnode.node.services.spending_mark).
    mark: SpendingMark = field(init=False)
    #: This process's running synthesis jobs (see dpnode.node.services.synthesis_jobs).
    synthesis_jobs: JobRunner = field(init=False)
    #: The Dask cluster large publishes are evaluated on (``DPNODE_DASK_SCHEDULER``), or None
    #: (see dpnode.node.cluster).
    cluster: Cluster | None = field(init=False)

    def __post_init__(self) -> None:
        self.logins = LoginThrottle.from_settings(self.settings)
        self.network_searches = RequestLimit.network_searches(self.settings)
        s = self.settings
        limits = UploadLimits(
            max_elements=s.max_upload_elements,
            max_columns=s.max_columns,
            max_session_bytes=s.max_upload_session_bytes,
            max_sessions=s.max_upload_sessions,
            ttl_seconds=s.upload_session_ttl_seconds,
        )
        self.uploads = UploadSessions(s.upload_dir, limits)
        self.uploads.sweep()  # sessions abandoned while the node was down
        self.leases = LeaseKeeper(
            self.relaxed_sessions, s.publish_lease_seconds, s.publish_key_ttl_seconds
        )
        self.mark = SpendingMark.from_settings(s)
        self.synthesis_jobs = JobRunner(self.sessions, s.publish_lease_seconds)
        # connected on first use: a node whose scheduler is down still starts and serves
        self.cluster = Cluster(s) if s.dask_scheduler else None

    @classmethod
    def from_settings(cls, settings: Settings) -> NodeContext:
        single_threaded_blas()  # the engine's products flush as it does (its module says why)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        if settings.token_secret.get_secret_value() == PLACEHOLDER_SECRET:
            # Development without a configured secret: never sign with a well-known string.
            secret = SecretStr(_local_secret(settings.data_dir / "token-secret"))
            settings = settings.model_copy(update={"token_secret": secret})
        pool = pool_options(settings)
        engine = make_engine(settings.resolved_database_url, **pool)
        return cls(
            settings=settings,
            engine=engine,
            sessions=make_sessionmaker(engine),
            serial_sessions=make_sessionmaker(serial_engine(engine)),
            read_sessions=make_sessionmaker(read_engine(engine)),
            relaxed_sessions=make_sessionmaker(relaxed_engine(engine, **pool)),
            store=make_store(settings),
            hasher=password_hasher(settings),
            structures=StructureCache(settings.structure_cache_bytes),
        )

    def close(self) -> None:
        self.synthesis_jobs.close()  # before the pools it writes through are disposed
        self.leases.close()
        self.mark.close()  # returns its reservation
        if self.cluster is not None:
            self.cluster.close()
        relaxed = self.relaxed_sessions.kw["bind"]
        if relaxed.pool is not self.engine.pool:  # a pool of its own (relaxed_engine)
            relaxed.dispose()
        self.engine.dispose()


def pool_options(settings: Settings) -> dict[str, Any]:
    """The connection pool of one worker process.

    A request holds at most one connection at a time, so that with a connection for each
    request the back-pressure admits (``max_requests_in_flight``), no request waits for one:
    SQLite's connections are a file handle each, so it gets that many. A PostgreSQL
    connection is a server process: ``database_pool_size`` stay open, as many again are
    opened under load; beyond those a request waits up to ``database_pool_timeout_seconds``
    (then ``503 database_busy``, see dpnode.node.app).
    """
    timeout = settings.database_pool_timeout_seconds
    url = settings.resolved_database_url
    if url.startswith("sqlite") and ":memory:" in url:  # one connection per thread, no queue
        return {}
    if url.startswith("sqlite"):
        size = settings.max_requests_in_flight + 4  # and the odd background task
        return {"pool_size": size, "max_overflow": size, "pool_timeout": timeout}
    size = settings.database_pool_size
    return {"pool_size": size, "max_overflow": size, "pool_timeout": timeout}


def make_store(settings: Settings) -> BlobStore:
    """The blob store the settings choose (``DPNODE_BLOB_STORE``)."""
    if settings.blob_store == "s3":
        from dpnode.node.storage_s3 import S3BlobStore

        return S3BlobStore.connect(
            settings.s3_endpoint,
            settings.s3_bucket,
            settings.blob_dir,
            access_key=settings.s3_access_key,
            secret_key=settings.s3_secret_key.get_secret_value(),
            region=settings.s3_region,
            secure=settings.s3_secure,
            prefix=settings.s3_prefix,
            cache_bytes=settings.blob_cache_bytes,
        )
    return FileBlobStore(settings.blob_dir, cache_bytes=settings.blob_cache_bytes)


def _local_secret(path: Path) -> str:
    """A random secret kept (owner-readable only) in the data directory across restarts."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    secret = secrets.token_urlsafe(48)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process of this node made it first
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(secret)
    return secret

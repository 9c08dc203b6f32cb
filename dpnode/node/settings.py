"""The node's configuration: one settings object, read from ``DPNODE_*`` variables."""

from __future__ import annotations

import importlib.util
import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

#: The secret a development node starts with; refused in production.
PLACEHOLDER_SECRET = "change-me"


class Settings(BaseSettings):
    """Every knob of a node. Environment variables use the ``DPNODE_`` prefix."""

    model_config = SettingsConfigDict(env_prefix="DPNODE_", extra="ignore")

    environment: Literal["development", "production"] = "development"
    data_dir: Path = Path("dpnode-data")
    #: SQLAlchemy URL; empty means a SQLite file ``dpnode.sqlite3`` in ``data_dir``.
    database_url: str = ""

    token_secret: SecretStr = SecretStr(PLACEHOLDER_SECRET)
    token_lifetime_seconds: int = Field(default=8 * 3600, gt=0)

    #: Largest request body the node reads (dataset and model uploads).
    max_upload_bytes: int = Field(default=512 * 1024 * 1024, gt=0)
    #: Largest number of elements in one uploaded column or weight tensor.
    max_upload_elements: int = Field(default=100_000_000, gt=0)
    #: Largest number of columns in one dataset.
    max_columns: int = Field(default=10_000, gt=0)
    #: Chunked uploads (dpnode.node.services.uploads): the largest chunk one request carries, the
    #: largest table one session takes (bytes on disk until finalized), the sessions one
    #: user may have open, and how long an untouched session is kept before removal.
    max_upload_chunk_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    max_upload_session_bytes: int = Field(default=64 * 1024**3, gt=0)
    max_upload_sessions: int = Field(default=4, gt=0)
    upload_session_ttl_seconds: int = Field(default=24 * 3600, gt=0)

    #: Compute quotas of one graph, checked before anything is read or allocated.
    max_graph_nodes: int = Field(default=100_000, gt=0)
    max_graph_memory_bytes: int = Field(default=4 * 1024**3, gt=0)
    max_graph_flops: int = Field(default=10**12, gt=0)
    #: Memory for graph structures users already sent (a loop then resends only constants).
    structure_cache_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    #: How long a publish's answer is kept for a retry with the same idempotency key.
    publish_key_ttl_seconds: int = Field(default=24 * 3600, gt=0)
    #: How long a charged publish stays ``running`` without a sign of life from the node
    #: process computing it, which renews it every third of this while it runs; unanswered
    #: past it (the process was killed, or its answer could not be stored), it is ``lost``.
    publish_lease_seconds: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    #: Pads the time of every charged publish's answer (its time shows what the evaluation on
    #: private values took): answered no earlier than this many seconds after the request
    #: arrived, or the first doubling of it the evaluation fits in, so the time shows only
    #: which doubling (dpnode.node.services.publish.answer_delay); 0 (the default): answered
    #: as soon as it is ready.
    publish_time_quantum_seconds: float = Field(default=0.0, ge=0, le=600, allow_inf_nan=False)
    #: Memory for verified dataset and weight blobs (read and hashed once, LRU); 0: off.
    blob_cache_bytes: int = Field(default=512 * 1024 * 1024, ge=0)
    #: Where blobs live: ``file`` (content-addressed files in ``data_dir/blobs``) or ``s3``
    #: (an S3-compatible bucket, cached and verified in ``data_dir/blobs``; dpnode.node.storage_s3).
    blob_store: Literal["file", "s3"] = "file"
    #: The S3-compatible endpoint (``host:port``), bucket, key prefix, region and credentials.
    s3_endpoint: str = ""
    s3_bucket: str = "dpnode"
    s3_prefix: str = ""
    s3_region: str | None = None
    s3_access_key: str = ""
    s3_secret_key: SecretStr = SecretStr("")
    #: HTTPS to the endpoint (turn off only for a store on loopback or a private network).
    s3_secure: bool = True

    #: A Dask scheduler (``tcp://host:8786``, or ``tls://`` with Dask's TLS settings) whose
    #: workers evaluate large publishes that only sum over their rows (dpnode.node.cluster);
    #: empty (the default): every publish is evaluated in the node's process.
    dask_scheduler: str = ""
    #: Stored bytes of a publish's row inputs from which it goes to the cluster; below, it is
    #: evaluated in the node (no round trips for small publishes).
    dask_min_bytes: int = Field(default=256 * 1024 * 1024, ge=0)
    #: The blob folder as the workers see it (the file store: a folder they share with the
    #: node); empty: the node's own (``data_dir/blobs``), at the same path on every machine.
    dask_blob_dir: str = ""
    #: How long to wait for the scheduler when connecting or checking it (answered
    #: ``503 evaluation_unavailable`` past it), and for a whole evaluation on the cluster.
    dask_connect_timeout_seconds: float = Field(default=10.0, gt=0, allow_inf_nan=False)
    dask_timeout_seconds: float = Field(default=3600.0, gt=0, allow_inf_nan=False)
    #: Seconds a client is asked to wait by that 503 (``Retry-After``).
    dask_retry_after_seconds: int = Field(default=30, gt=0)

    #: Back-pressure, per worker process: requests handled at once; one more is answered
    #: ``503 overloaded`` with ``Retry-After`` at once, before any work (health checks excepted).
    max_requests_in_flight: int = Field(default=64, gt=0)
    #: The ``Retry-After`` (seconds) of that 503.
    overload_retry_after_seconds: int = Field(default=1, gt=0)
    #: Seconds a connection may stay idle between requests before the node closes it: longer
    #: than clients keep one for reuse (httpx, the SDK's client: 5 s). With both at 5 s, a
    #: client could send a request on a connection the node was closing that instant, and
    #: see the connection reset (about one request in a thousand at 256 clients).
    keep_alive_seconds: int = Field(default=30, gt=0, le=3600)
    #: PostgreSQL connections each worker process keeps open (as many again are opened under
    #: load, then closed); SQLite gets a connection per request in flight, as they cost a file
    #: handle. A request that waits longer than ``database_pool_timeout_seconds`` for one is
    #: answered ``503 database_busy``, having done nothing.
    database_pool_size: int = Field(default=10, gt=0)
    database_pool_timeout_seconds: float = Field(default=10.0, gt=0, allow_inf_nan=False)

    #: A user's budget (epsilon, delta) where the policy in force sets none for them or their role.
    default_epsilon_budget: float = Field(default=10.0, ge=0, le=700, allow_inf_nan=False)
    default_delta_budget: float = Field(default=1e-6, ge=0, lt=1, allow_inf_nan=False)

    #: The budget mark (dpnode.node.services.spending_mark): privacy spending kept outside the
    #: database, so that restoring an older backup cannot refund it; empty: ``budget-mark.json``
    #: in ``data_dir``. Keep it out of database backups, on the node's own disk.
    budget_mark_file: Path | None = None
    #: How much each worker process reserves in the mark at a time, per user and dataset:
    #: the mark is written (one fsync) when a charge does not fit the reservation left. What
    #: a killed process had reserved and not used counts as spent (docs/privacy.md).
    budget_mark_reserve_epsilon: float = Field(default=0.5, gt=0, le=1000, allow_inf_nan=False)
    budget_mark_reserve_rho: float = Field(default=0.001, gt=0, le=1000, allow_inf_nan=False)
    budget_mark_reserve_delta: float = Field(default=1e-10, gt=0, lt=1, allow_inf_nan=False)
    #: Whether a charge's ledger commit waits for the disk (an fsync). ``covered`` (default):
    #: on SQLite, not when the budget mark already covers the charge (it always does on the
    #: node: the mark's reservation is fsynced before the commit), because a commit a power
    #: loss takes back stays counted by the mark until ``dpnode budget carry-forward``
    #: charges it again (docs/privacy.md, "A charge's commit and a power loss").
    #: ``always``: every charge's commit is fsynced. PostgreSQL commits synchronously either way.
    ledger_fsync: Literal["always", "covered"] = "covered"

    #: Argon2id cost: memory in KiB and passes (RFC 9106's low-memory profile by default).
    argon2_memory_kib: int = Field(default=64 * 1024, ge=8 * 1024)
    argon2_time_cost: int = Field(default=3, ge=1)

    #: Login throttle (dpnode.node.services.throttle), per worker process: failed logins per
    #: account (by email, known or not) within a sliding window, checked before the hash.
    login_max_failures: int = Field(default=10, gt=0)
    login_failure_window_seconds: int = Field(default=15 * 60, gt=0)
    #: Login attempts (failed or not) per client address within a sliding window.
    login_max_attempts_per_address: int = Field(default=60, gt=0)
    login_address_window_seconds: int = Field(default=60, gt=0)
    #: Reverse proxies (addresses or networks) whose ``X-Forwarded-For`` names the client;
    #: empty (the default): the header is ignored and the peer's address counts.
    trusted_proxies: list[str] = Field(default_factory=list)

    #: ``node``: a data node; ``network``: a directory of member nodes and their public
    #: catalogs (``dpnode serve --network`` sets it; dpnode.node.network).
    role: Literal["node", "network"] = "node"
    #: This node's name in a network's directory (``dpnode network join --name`` sets it
    #: there; empty: the host name).
    node_name: str = Field(default="", max_length=100)
    #: Seconds between a member node's heartbeats to the networks it joined; each carries
    #: the digest of its public catalog, and the catalog follows when the network's differs.
    network_heartbeat_seconds: float = Field(default=30.0, gt=0, le=3600, allow_inf_nan=False)
    #: On a network: seconds without a heartbeat after which a member shows as unreachable
    #: and is left out of searches (three heartbeats by default).
    network_unreachable_after_seconds: float = Field(
        default=90.0, gt=0, le=86400, allow_inf_nan=False
    )
    #: On a network: how long a join token stays usable, and the largest catalog a member
    #: may push (bytes of JSON), its datasets and columns per dataset.
    network_token_lifetime_seconds: int = Field(default=7 * 24 * 3600, gt=0)
    network_max_catalog_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    network_max_datasets: int = Field(default=1000, gt=0)
    network_max_columns: int = Field(default=1000, gt=0)
    #: On a network: requests to its public routes (search, member list: no login) per
    #: client address within a sliding window, per worker process; beyond it, ``429`` with
    #: ``Retry-After``. Member traffic (heartbeats, catalogs) and admins are not counted.
    network_search_max_per_address: int = Field(default=300, gt=0)
    network_search_window_seconds: int = Field(default=60, gt=0)

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, proxies: list[str]) -> list[str]:
        for proxy in proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(
                    f"DPNODE_TRUSTED_PROXIES: {proxy!r} is not an IP address or network "
                    '(write a JSON list, e.g. ["10.0.0.0/8"])'
                ) from None
        return proxies

    @model_validator(mode="after")
    def _s3_needs_an_endpoint(self) -> Settings:
        if self.blob_store == "s3" and not self.s3_endpoint:
            raise ValueError("DPNODE_BLOB_STORE=s3 needs DPNODE_S3_ENDPOINT (host:port)")
        return self

    @model_validator(mode="after")
    def _extras_installed(self) -> Settings:
        """A setting that needs an optional dependency names the extra that installs it,
        when the node starts, rather than failing on the first request that uses it."""
        needs = [
            (self.blob_store == "s3", "minio", "DPNODE_BLOB_STORE=s3", "s3"),
            (bool(self.dask_scheduler), "distributed", "DPNODE_DASK_SCHEDULER", "dask"),
            (
                (self.database_url or "").startswith("postgresql"),
                "psycopg",
                "a postgresql DPNODE_DATABASE_URL",
                "postgres",
            ),
        ]
        for wanted, module, setting, extra in needs:
            if wanted and importlib.util.find_spec(module) is None:
                raise ValueError(
                    f"{setting} needs the {module!r} package, which is not installed: "
                    f"pip install 'dpnode[{extra}]'"
                )
        return self

    @model_validator(mode="after")
    def _refuse_placeholder_secrets(self) -> Settings:
        secret = self.token_secret.get_secret_value()
        if self.environment != "development" and (secret == PLACEHOLDER_SECRET or len(secret) < 32):
            raise ValueError(
                "DPNODE_TOKEN_SECRET must be set to a random string of at least 32 characters "
                "outside development (for example: python -c 'import secrets; "
                "print(secrets.token_urlsafe(48))')"
            )
        return self

    @property
    def resolved_database_url(self) -> str:
        """The database URL, defaulting to a SQLite file inside ``data_dir``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'dpnode.sqlite3').resolve()}"

    @property
    def budget_mark_path(self) -> Path:
        """Where the budget mark is kept."""
        return self.budget_mark_file or self.data_dir / "budget-mark.json"

    @property
    def upload_dir(self) -> Path:
        """Where chunked uploads are kept until finalized."""
        return self.data_dir / "uploads"

    @property
    def blob_dir(self) -> Path:
        """Where content-addressed array bytes are kept."""
        return self.data_dir / "blobs"


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()

"""Table models. API schemas live apart, in ``dpnode.node.api.schemas``."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Enum,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from dpnode.node.db.base import Base, Timestamped, UTCDateTime, utcnow

#: the largest id a table holds (ids are ``Integer`` columns: signed 32-bit on PostgreSQL):
#: a larger number names no row, and must not reach the database (PostgreSQL raises
#: NumericValueOutOfRange comparing it with an id, SQLite OverflowError beyond 64 bits)
MAX_ID = 2**31 - 1

#: ``__table_args__`` of every table whose rows have an id of their own: on SQLite the id is
#: AUTOINCREMENT, so a deleted row's id is never given to a new row. Without it SQLite gives
#: the largest id plus one, and an approval, a ledger filter or a client naming the newest
#: dataset, once deleted, named the next upload. PostgreSQL's sequences never reuse an id.
NEVER_REUSE_IDS: dict[str, Any] = {"sqlite_autoincrement": True}


class Role(enum.StrEnum):
    ADMIN = "admin"
    DATA_OWNER = "data_owner"
    DATA_SCIENTIST = "data_scientist"


class User(Timestamped, Base):
    __tablename__ = "users"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    password_hash: Mapped[str] = mapped_column(String(256))
    role: Mapped[Role] = mapped_column(
        Enum(Role, native_enum=False, length=32, values_callable=lambda e: [m.value for m in e])
    )
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)


class Dataset(Timestamped, Base):
    __tablename__ = "datasets"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    row_count: Mapped[int] = mapped_column(BigInteger)
    mock_row_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: Name of the column that grouped rows into subjects (the column itself is not kept).
    subject_column: Mapped[str | None] = mapped_column(String(200), nullable=True)
    #: Blob of int64 subject indices, one per row, when rows are grouped by subject.
    subjects_blob: Mapped[str | None] = mapped_column(String(64), nullable=True)
    subject_count: Mapped[int] = mapped_column(BigInteger)
    max_rows_per_subject: Mapped[int] = mapped_column(Integer, default=1)
    #: A synthetic dataset's provenance (source id and name, method, epsilon, delta, rows,
    #: ledger row); ``None`` for a dataset uploaded with real values.
    provenance: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    #: A mock the node synthesized (``dpnode.node.services.mock_synthesis``): method, epsilon,
    #: delta, rows, ledger row, when; ``None`` for a mock its owner uploaded, or none.
    mock_provenance: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    owner: Mapped[User] = relationship()
    columns: Mapped[list[DatasetColumn]] = relationship(
        order_by="DatasetColumn.position", cascade="all, delete-orphan", passive_deletes=True
    )
    tags: Mapped[list[DatasetTag]] = relationship(
        order_by="DatasetTag.tag", cascade="all, delete-orphan", passive_deletes=True
    )


class DatasetColumn(Base):
    __tablename__ = "dataset_columns"
    __table_args__ = (UniqueConstraint("dataset_id", "name"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    dtype: Mapped[str] = mapped_column(String(16))
    #: Shape of one row's value ([] for a scalar column, [8, 8] for an 8x8 image).
    row_shape: Mapped[list[int]] = mapped_column(JSON, default=list)
    lower: Mapped[float] = mapped_column(Float)
    upper: Mapped[float] = mapped_column(Float)
    #: Public category list of an encoded categorical column (values are indices into it).
    categories: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    blob: Mapped[str] = mapped_column(String(64))
    mock_blob: Mapped[str | None] = mapped_column(String(64), nullable=True)


class DatasetTag(Base):
    __tablename__ = "dataset_tags"

    dataset_id: Mapped[int] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class Model(Timestamped, Base):
    __tablename__ = "models"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    is_public: Mapped[bool] = mapped_column(Boolean, default=False)
    architecture_filename: Mapped[str | None] = mapped_column(String(200), nullable=True)
    architecture_blob: Mapped[str | None] = mapped_column(String(64), nullable=True)

    owner: Mapped[User] = relationship()
    tensors: Mapped[list[ModelTensor]] = relationship(
        order_by="ModelTensor.position", cascade="all, delete-orphan", passive_deletes=True
    )
    tags: Mapped[list[ModelTag]] = relationship(
        order_by="ModelTag.tag", cascade="all, delete-orphan", passive_deletes=True
    )


class ModelTensor(Base):
    __tablename__ = "model_tensors"
    __table_args__ = (UniqueConstraint("model_id", "name"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(300))
    dtype: Mapped[str] = mapped_column(String(16))
    shape: Mapped[list[int]] = mapped_column(JSON, default=list)
    blob: Mapped[str] = mapped_column(String(64))


class ModelTag(Base):
    __tablename__ = "model_tags"

    model_id: Mapped[int] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    tag: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class AuditEvent(Base):
    """One line of the append-only audit log (database triggers refuse UPDATE and DELETE)."""

    __tablename__ = "audit_events"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    actor_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True, index=True)
    #: The actor's email at the time, so the line reads on its own.
    actor_email: Mapped[str | None] = mapped_column(String(320), nullable=True)
    action: Mapped[str] = mapped_column(String(64), index=True)
    target_type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    target_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class LedgerEntry(Base):
    """One privacy charge: append-only (database triggers refuse UPDATE and DELETE).

    Amounts are whole numbers of small units (see ``dpnode.node.services.costs``), so that
    sums are exact: the budget check never depends on floating-point rounding.
    """

    __tablename__ = "ledger_entries"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    mechanism: Mapped[str] = mapped_column(String(32))
    epsilon_units: Mapped[int] = mapped_column(BigInteger, default=0)
    tv_units: Mapped[int] = mapped_column(BigInteger, default=0)
    rho_units: Mapped[int] = mapped_column(BigInteger, default=0)
    dataset_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    graph_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: The policy revision that allowed this charge (``None``: the built-in default policy).
    policy_revision: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: The planned training run this charge is a step of (``None``: a publish of its own).
    run_id: Mapped[int | None] = mapped_column(
        ForeignKey("training_runs.id"), nullable=True, index=True
    )
    #: Paid from the caps of the datasets it read alone, not from its user's budget (a data
    #: owner's synthetic mock): counted in those caps, left out of the user's sums and total.
    #: The database's default only (no Python one), so that code inserting rows without it,
    #: written before it existed, still inserts them.
    cap_only: Mapped[bool] = mapped_column(Boolean, server_default=false())


class TrainingRun(Base):
    """A training run as it was planned (``dpnode.node.services.runs``): the identity its
    steps' ledger rows carry (``LedgerEntry.run_id``), so that the ledger shows a run as one.

    Written once, when the run is planned, and never changed: how many steps ran is what
    the ledger holds under its id. ``plan_hash`` identifies the plan (steps, per-step amounts,
    values, datasets, description); ``approval_id`` names the admin's approval it runs
    under, if its total needed one.
    """

    __tablename__ = "training_runs"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    plan_hash: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    steps: Mapped[int] = mapped_column(Integer)
    step_epsilon_units: Mapped[int] = mapped_column(BigInteger)
    step_delta_units: Mapped[int] = mapped_column(BigInteger)
    step_values: Mapped[int] = mapped_column(BigInteger)
    dataset_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    #: no foreign key: approvals already name the ledger, and a key back would make the
    #: three tables a cycle, which no order of CREATE TABLE can satisfy
    approval_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: The policy revision in force when it was planned (``None``: the built-in default).
    policy_revision: Mapped[int | None] = mapped_column(Integer, nullable=True)


class LedgerTotal(Base):
    """Every ledger row of one user, summed: kept by a database trigger on each ledger INSERT.

    The trigger adds each row in the transaction that inserts it, and the ledger is
    append-only, so a user's total always equals the sum of their rows (a user without rows
    has none). A budget check reads it instead of summing the rows when it needs all of them
    (a policy without renewal): one row whatever the ledger's length.
    """

    __tablename__ = "ledger_totals"

    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), primary_key=True)
    epsilon_units: Mapped[int] = mapped_column(BigInteger)
    rho_units: Mapped[int] = mapped_column(BigInteger)
    tv_units: Mapped[int] = mapped_column(BigInteger)
    #: The newest ``at`` of the user's rows.
    newest_at: Mapped[datetime] = mapped_column(UTCDateTime())


class LedgerEntryDataset(Base):
    """Which datasets a ledger row read, one row per dataset, for dataset caps (append-only).

    ``dataset_id`` has no foreign key: a deleted dataset's charges still count against what
    its subjects were promised, and the ledger must outlive the dataset. ``dataset_name`` is
    the name at the time, which is what a policy's cap names: a dataset deleted and uploaded
    again under the same name does not start its cap afresh.
    """

    __tablename__ = "ledger_entry_datasets"

    ledger_id: Mapped[int] = mapped_column(ForeignKey("ledger_entries.id"), primary_key=True)
    dataset_id: Mapped[int] = mapped_column(Integer, primary_key=True, index=True)
    #: ``None`` only for charges made before names were recorded, of datasets since deleted.
    dataset_name: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)


class PolicyRevision(Base):
    """One revision of the node's budget policy (append-only; the newest is in force).

    ``document`` is the canonical form (``policies.Policy.to_dict``); ``source`` is the text
    the admin sent (TOML, or JSON), kept for reading, never evaluated.
    """

    __tablename__ = "policy_revisions"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    #: The author's email at the time, or the operator for the command line.
    created_by: Mapped[str] = mapped_column(String(320))
    reason: Mapped[str] = mapped_column(Text, default="")
    name: Mapped[str] = mapped_column(String(200), default="")
    content_hash: Mapped[str] = mapped_column(String(64))
    document: Mapped[dict[str, Any]] = mapped_column(JSON)
    source: Mapped[str] = mapped_column(Text, default="")


class BudgetGrant(Base):
    """Budget added to one user's allocation from ``at`` on (append-only).

    Made by an admin directly (``dpnode budget grant``) or by approving a budget request.
    """

    __tablename__ = "budget_grants"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    epsilon_units: Mapped[int] = mapped_column(BigInteger, default=0)
    delta_units: Mapped[int] = mapped_column(BigInteger, default=0)
    granted_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    granted_by: Mapped[str] = mapped_column(String(320))
    reason: Mapped[str] = mapped_column(Text, default="")
    request_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


class RequestStatus(enum.StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    DENIED = "denied"
    #: An approved or denied publish that has been re-submitted (approvals are single-use).
    USED = "used"


def _status_enum() -> Enum:
    return Enum(
        RequestStatus,
        native_enum=False,
        length=16,
        values_callable=lambda e: [m.value for m in e],
    )


class BudgetRequest(Timestamped, Base):
    """A user asking for more budget; an admin approves (with an amount) or denies it once."""

    __tablename__ = "budget_requests"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    epsilon_units: Mapped[int] = mapped_column(BigInteger, default=0)
    delta_units: Mapped[int] = mapped_column(BigInteger, default=0)
    reason: Mapped[str] = mapped_column(Text, default="")
    status: Mapped[RequestStatus] = mapped_column(_status_enum(), default=RequestStatus.PENDING)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    decided_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    decided_by: Mapped[str | None] = mapped_column(String(320), nullable=True)
    decision_reason: Mapped[str] = mapped_column(Text, default="")
    grant_id: Mapped[int | None] = mapped_column(ForeignKey("budget_grants.id"), nullable=True)

    user: Mapped[User] = relationship(foreign_keys=[user_id])


class PublishApproval(Timestamped, Base):
    """A publish over the policy's approval threshold, waiting for (or answered by) an admin.

    The node keeps no data or result: the user re-submits the same computation (same frame
    hash, epsilon and delta) once approved, and the approval is used up by that publish.

    A training run (``kind`` ``"run"``) is one request for all its steps: ``frame_hash`` is
    the hash of its plan, ``epsilon_units`` / ``delta_units`` its total, ``step_*`` what each
    step asks for; an approval lets ``steps`` such publishes through (``steps_used`` counts
    them) and is used up by the last.
    """

    __tablename__ = "publish_approvals"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    frame_hash: Mapped[str] = mapped_column(String(64), index=True)
    graph_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mechanism: Mapped[str] = mapped_column(String(32))
    epsilon_units: Mapped[int] = mapped_column(BigInteger, default=0)
    delta_units: Mapped[int] = mapped_column(BigInteger, default=0)
    dataset_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    rule: Mapped[str] = mapped_column(String(200))
    reason: Mapped[str] = mapped_column(Text, default="")
    policy_revision: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[RequestStatus] = mapped_column(_status_enum(), default=RequestStatus.PENDING)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    decided_by_id: Mapped[int | None] = mapped_column(ForeignKey("users.id"), nullable=True)
    decided_by: Mapped[str | None] = mapped_column(String(320), nullable=True)
    decision_reason: Mapped[str] = mapped_column(Text, default="")
    ledger_id: Mapped[int | None] = mapped_column(ForeignKey("ledger_entries.id"), nullable=True)
    kind: Mapped[str] = mapped_column(String(16), default="publish", server_default="publish")
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    steps_used: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    step_epsilon_units: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    step_delta_units: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: The most values one step may noise (its samplers' cost grows with them).
    step_values: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    #: A publish's computation as the admin reads it (``dpnode.node.services.approvals``):
    #: its listing, sensitivity, noise scale and output shapes; ``None`` before it was kept.
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    user: Mapped[User] = relationship(foreign_keys=[user_id])


class PublishKey(Base):
    """A publish's idempotency key: the request it names and, once answered, the answer.

    Written in the transaction that charges the publish (``dpnode.node.services.budget.charge``),
    so a key is charged at most once; the encoded response is stored once the release is
    answered and replayed to a retry with the same key (``dpnode.node.services.idempotency``).
    A refused publish writes no row. Rows are purged after ``publish_key_ttl_seconds``.
    """

    __tablename__ = "publish_keys"
    __table_args__ = (UniqueConstraint("user_id", "key"), NEVER_REUSE_IDS)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    key: Mapped[str] = mapped_column(String(128))
    #: SHA-256 of the request the key names: the full graph frame, epsilon, delta and run.
    request_hash: Mapped[str] = mapped_column(String(64))
    ledger_id: Mapped[int] = mapped_column(ForeignKey("ledger_entries.id"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, index=True)
    #: The encoded response (values and receipt); ``None`` while the publish runs.
    response: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    #: Until when the node process computing the publish vouches for it: it renews this
    #: while it runs (``dpnode.node.services.leases``); unanswered past it, the publish is
    #: lost. ``None`` on rows written before leases (running until purged).
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class NetworkJoinToken(Base):
    """A token a network's admin issues for one node to join (dpnode.node.network): only its
    digest is kept; used once, revocable, expiring."""

    __tablename__ = "network_join_tokens"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    note: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_by: Mapped[str] = mapped_column(String(320))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    #: The member that joined with it (its name, kept after the member leaves).
    used_by: Mapped[str | None] = mapped_column(String(100), nullable=True)


class NetworkMember(Base):
    """A node in a network's directory and its public catalog, as it last pushed it."""

    __tablename__ = "network_members"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    url: Mapped[str] = mapped_column(String(300))
    #: sha256 of the member's credential (the credential itself is only on the member).
    credential_digest: Mapped[str] = mapped_column(String(64), unique=True)
    joined_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    #: The public catalog (validated by dpnode.node.network.schemas.Catalog) and its digest.
    catalog: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    catalog_digest: Mapped[str] = mapped_column(String(64), default="")
    catalog_updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class NetworkMembership(Base):
    """A network this node joined: the credential it presents, and how its last heartbeat went."""

    __tablename__ = "network_memberships"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    network_url: Mapped[str] = mapped_column(String(300), unique=True)
    member_id: Mapped[int] = mapped_column(Integer)
    #: The name and address the network lists this node under.
    name: Mapped[str] = mapped_column(String(100))
    url: Mapped[str] = mapped_column(String(300))
    #: The member credential, sent with every heartbeat (the network keeps only its digest).
    credential: Mapped[str] = mapped_column(String(100))
    joined_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    #: ``ok`` or why the last heartbeat failed (the network unreachable, or this node removed).
    last_result: Mapped[str] = mapped_column(String(300), default="")
    last_ok_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class SynthesisJob(Base):
    """A charged synthesis running in the background (``dpnode.node.services.synthesis_jobs``):
    its state, its progress, and once answered the new dataset and the charge's receipt.

    ``running`` while the node process computing it renews :attr:`lease_until`; a job whose
    lease lapsed unanswered (the process stopped) is marked ``failed`` at the next start: the
    charge stands, as for a lost publish.
    """

    __tablename__ = "synthesis_jobs"
    __table_args__ = NEVER_REUSE_IDS

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    source_id: Mapped[int] = mapped_column(Integer)
    ledger_id: Mapped[int] = mapped_column(ForeignKey("ledger_entries.id"))
    method: Mapped[str] = mapped_column(String(16))
    #: ``running``, ``answered`` or ``failed``
    state: Mapped[str] = mapped_column(String(16), default="running", index=True)
    done: Mapped[int] = mapped_column(Integer, default=0)
    total: Mapped[int] = mapped_column(Integer, default=1)
    phase: Mapped[str] = mapped_column(String(16), default="measuring")
    #: the answer once ``answered``: the new dataset and the receipt
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    lease_until: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

"""API schemas (version 1). Table models live apart, in ``dpnode.node.db.models``."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    field_validator,
)

from dpnode.node.db.models import MAX_ID, Role


class Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", from_attributes=True)


class ErrorBody(BaseModel):
    """Every error the node answers (``dpnode.node.app``): a stable code and a message. A budget
    policy's refusal adds the rule, the policy and its revision (and, waiting for an admin,
    the ``approval_id``)."""

    model_config = ConfigDict(extra="allow", title="Error")

    error: str = Field(description="stable error code, e.g. 'forbidden'")
    detail: str = Field(description="what was wrong, for a person")
    rule: str | None = Field(default=None, description="the policy rule that refused")
    policy: str | None = Field(default=None, description="the policy in force")
    policy_revision: int | None = Field(default=None, description="its revision")


#: an id in a request body (a larger number than any id is refused before the database)
Id = Annotated[StrictInt, Field(ge=0, le=MAX_ID)]


class LoginRequest(Schema):
    email: str = Field(max_length=320)
    password: str = Field(max_length=1024)


class Token(Schema):
    access_token: str
    token_type: str = "bearer"
    expires_at: datetime


class UserCreate(Schema):
    email: str = Field(max_length=320)
    password: str = Field(max_length=1024)
    role: str = Field(description="admin, data_owner or data_scientist")


class UserUpdate(Schema):
    role: str | None = None
    is_active: StrictBool | None = None
    password: str | None = Field(default=None, max_length=1024)


class UserPublic(Schema):
    id: int
    email: str
    role: Role
    is_active: bool
    created_at: datetime


class ColumnPublic(Schema):
    name: str
    dtype: str
    shape: list[int] = Field(description="shape of one row's value; [] for scalars")
    bounds: tuple[float, float]
    categories: list[str] | None = None


class DatasetBudgetPublic(Schema):
    """A dataset's cap under the policy in force and what all users together spent of it
    (null cap: not capped on that side)."""

    dataset_id: int
    name: str
    capped: bool
    epsilon: float | None = Field(description="the cap on epsilon; null: none")
    delta: float | None = Field(description="the cap on delta; null: none")
    epsilon_used: float | None = Field(
        description="epsilon all users spent on it in the cap's window (zCDP converted); "
        "null: a zCDP charge no delta converts"
    )
    delta_used: float
    epsilon_remaining: float | None
    delta_remaining: float | None
    renews_at: datetime | None = Field(description="null: a lifetime cap")


class DatasetPublic(Schema):
    id: int
    name: str
    description: str
    tags: list[str]
    owner: str
    row_count: int
    columns: list[ColumnPublic]
    subject_id: str | None
    subject_count: int
    max_rows_per_subject: int
    has_mock: bool
    mock_row_count: int | None
    created_at: datetime
    updated_at: datetime
    synthetic: dict[str, Any] | None = Field(
        default=None,
        description="a synthetic dataset's provenance (source, method, epsilon, delta, rows, "
        "ledger row); null for uploaded data",
    )
    mock_synthetic: dict[str, Any] | None = Field(
        default=None,
        description="when the node synthesized the mock from the data (paid from the dataset's "
        "cap): method, epsilon, delta, rows, ledger row, when; null for a mock its owner "
        "uploaded, or none",
    )
    budget: DatasetBudgetPublic | None = Field(
        default=None,
        description="its cap and what all users spent of it: for its owner and admins only",
    )


class TableDeclarations(Schema):
    """How the columns of a table are declared: its public contract."""

    columns: list[str] = Field(description="column order")
    bounds: dict[str, tuple[StrictFloat, StrictFloat]] = Field(default_factory=dict)
    categories: dict[str, list[str]] = Field(default_factory=dict)
    clamp: StrictBool | list[str] = False
    fill: dict[str, StrictFloat] = Field(default_factory=dict)
    subject_id: str | None = None
    mock_columns: list[str] | None = None

    @field_validator("fill")
    @classmethod
    def _finite_fill(cls, fill: dict[str, float]) -> dict[str, float]:
        for column, value in fill.items():
            if not math.isfinite(value):
                raise ValueError(f"fill value for column {column!r} must be finite")
        return fill

    @field_validator("categories")
    @classmethod
    def _categories(cls, categories: dict[str, list[str]]) -> dict[str, list[str]]:
        for column, values in categories.items():
            if not values or len(set(values)) != len(values):
                raise ValueError(
                    f"categories of {column!r} must be a non-empty list of distinct values"
                )
        return categories


class TableManifest(TableDeclarations):
    """How the columns of an upload are declared (travels inside the upload frame)."""

    #: String-valued columns, which raw tensors cannot carry.
    strings: dict[str, list[str | None]] = Field(default_factory=dict)
    mock_strings: dict[str, list[str | None]] = Field(default_factory=dict)


class DatasetManifest(TableManifest):
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=10_000)
    tags: list[str] = Field(default_factory=list)


class TensorPublic(Schema):
    name: str
    dtype: str
    shape: list[int]


class ModelManifest(Schema):
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=10_000)
    tags: list[str] = Field(default_factory=list)
    public: StrictBool = False
    architecture_filename: str | None = Field(default=None, max_length=200)
    tensors: list[str] = Field(description="weight names, in order")


class ModelPublic(Schema):
    id: int
    name: str
    description: str
    tags: list[str]
    owner: str
    public: bool
    tensors: list[TensorPublic]
    architecture_filename: str | None
    created_at: datetime
    updated_at: datetime


class SearchResults(Schema):
    datasets: list[DatasetPublic]
    models: list[ModelPublic]


class AuditEventPublic(Schema):
    id: int
    at: datetime
    actor_id: int | None
    actor_email: str | None
    action: str
    target_type: str | None
    target_id: int | None
    detail: dict[str, Any]


class Health(Schema):
    status: str
    database: str


class Version(Schema):
    dpnode: str
    api: str
    prims: str = Field(description="version of the prim vocabulary graphs must carry")


class BudgetPublic(Schema):
    """A user's privacy budget: the allowance, and what the privacy filter counts as spent."""

    epsilon: float
    delta: float
    spent_epsilon: float = Field(description="epsilon used, with zCDP charges converted")
    spent_delta: float = Field(description="delta used by zCDP conversion and samplers")
    remaining_epsilon: float
    pure_epsilon: float = Field(description="sum of pure-epsilon (Laplace) charges")
    rho: float = Field(description="sum of zCDP (Gaussian) charges")
    sampler_tv: float = Field(
        description="delta charged for the samplers' deviation, summed (each release's own)"
    )
    remaining_delta: float = Field(
        default=0.0, description="delta left: the allocation less spent_delta"
    )
    epsilon_rule: str = Field(default="", description="where the epsilon allocation comes from")
    delta_rule: str = Field(default="", description="where the delta allocation comes from")
    granted_epsilon: float = Field(default=0.0, description="part of epsilon granted on request")
    granted_delta: float = Field(default=0.0, description="part of delta granted on request")
    period_start: datetime | None = Field(default=None, description="this renewal window's start")
    renews_at: datetime | None = Field(default=None, description="None: the budget never renews")
    policy: str = Field(default="", description="the name of the policy in force")
    policy_revision: int | None = Field(
        default=None, description="its revision; None: the built-in default"
    )


class LedgerEntryPublic(Schema):
    id: int
    at: datetime
    user_id: int
    mechanism: str
    epsilon: float
    rho: float
    sampler_tv: float = Field(description="delta charged for this release's samplers")
    dataset_ids: list[int]
    graph_hash: str | None
    detail: dict[str, Any]
    policy_revision: int | None = None
    user_email: str | None = None
    run_id: int | None = Field(
        default=None, description="the training run this charge is a step of (null: none)"
    )
    cap_only: bool = Field(
        default=False,
        description="paid from the caps of the datasets it read, not from the user's budget "
        "(a data owner's synthetic mock): its epsilon_used is 0",
    )
    epsilon_used: float | None = Field(
        default=None,
        description="how much this charge added to the user's epsilon used, as the budget "
        "counts it (zCDP converted at the allowance's delta): the rows of a renewal window "
        "add up to the budget's spent_epsilon; null: a rho with no delta to convert it at",
    )
    delta_used: float = Field(
        default=0.0, description="how much this charge added to the user's delta used"
    )


class LedgerRunPublic(Schema):
    """A training run as it was planned (``POST /publish/runs``)."""

    id: int
    created_at: datetime
    description: str
    steps: int = Field(description="the steps planned")
    step_epsilon: float
    step_delta: float
    approval_id: int | None = Field(description="the admin's approval it ran under, if any")


class LedgerLinePublic(Schema):
    """One line of the ledger: a charge of its own, or every step of one training run."""

    id: int = Field(description="the newest charge of the line (page with before_id=id)")
    at: datetime = Field(description="when its newest charge was made")
    first_at: datetime = Field(description="when its oldest charge was made")
    kind: str = Field(description='"run": a training run\'s steps; "charge": one publish')
    user_id: int
    user_email: str | None = None
    mechanism: str
    steps: int = Field(description="how many charges the line holds")
    epsilon_used: float | None = Field(
        description="what its charges added to the user's epsilon used, summed (null: a rho "
        "with no delta to convert it at)"
    )
    delta_used: float
    epsilon: float = Field(description="its charges' pure epsilon, summed")
    rho: float = Field(description="its charges' rho, summed")
    sampler_tv: float
    dataset_ids: list[int]
    policy_revision: int | None = None
    run: LedgerRunPublic | None = None
    entries: list[LedgerEntryPublic] = Field(description="its charges, newest first")


class OutputSensitivityPublic(Schema):
    shape: list[int]
    l1: float
    l2: float
    lower: float = Field(description="smallest value any element can take")
    upper: float = Field(description="largest value any element can take")
    rounding_l1: float = Field(
        description="the part of l1 that pays for the engine's floating-point rounding"
    )
    rounding_l2: float = Field(
        description="the part of l2 that pays for the engine's floating-point rounding"
    )


class SensitivityPublic(Schema):
    """What a publish of these outputs would cost, known before any budget is spent."""

    l1: float = Field(description="joint L1 sensitivity of all outputs")
    l2: float = Field(description="joint L2 sensitivity of all outputs")
    subjects: int
    outputs: list[OutputSensitivityPublic]
    noise_scale: float | None = Field(
        description="Laplace b (no delta) or Gaussian sigma, for the epsilon asked, if any"
    )


class PolicyApply(Schema):
    """A new policy: TOML text, or the same shape as a JSON document (exactly one)."""

    toml: str | None = Field(default=None, max_length=1_000_000)
    document: dict[str, Any] | None = None
    reason: str = Field(min_length=1, max_length=10_000, description="why, for the audit log")


class PolicyRevisionPublic(Schema):
    revision: int | None = Field(description="None: the built-in default, never applied")
    at: datetime | None
    created_by: str
    reason: str
    name: str
    content_hash: str
    document: dict[str, Any] = Field(description="canonical form, defaults written out")
    source: str = Field(description="the text as the admin sent it")
    changed: bool = True
    warnings: list[str] = Field(default_factory=list)


class AmountRequest(Schema):
    """An amount of privacy budget; delta defaults to 0."""

    epsilon: float = Field(ge=0, allow_inf_nan=False, strict=True)
    delta: float = Field(default=0.0, ge=0, lt=1, allow_inf_nan=False, strict=True)


class BudgetRequestCreate(AmountRequest):
    reason: str = Field(min_length=1, max_length=10_000)


class BudgetGrantCreate(AmountRequest):
    user: Id | str = Field(description="the user's id or email")
    reason: str = Field(min_length=1, max_length=10_000)


class BudgetRequestAnswer(Schema):
    """Approve (optionally with a different amount than asked) or deny."""

    epsilon: float | None = Field(default=None, ge=0, allow_inf_nan=False, strict=True)
    delta: float | None = Field(default=None, ge=0, lt=1, allow_inf_nan=False, strict=True)
    reason: str = Field(default="", max_length=10_000)


class BudgetGrantPublic(Schema):
    id: int
    at: datetime
    user_id: int
    epsilon: float
    delta: float
    granted_by: str
    reason: str
    request_id: int | None


class BudgetRequestPublic(Schema):
    id: int
    user_id: int
    user_email: str
    created_at: datetime
    epsilon: float
    delta: float
    reason: str
    status: str = Field(description="pending, approved or denied")
    decided_at: datetime | None
    decided_by: str | None
    decision_reason: str
    granted_epsilon: float | None
    granted_delta: float | None


class DatasetReadPublic(Schema):
    """A dataset a waiting publish reads: its name (null: deleted since) and, for admins and
    its owner, its cap."""

    dataset_id: int
    name: str | None
    budget: DatasetBudgetPublic | None


class PublishApprovalPublic(Schema):
    id: int
    user_id: int
    user_email: str
    created_at: datetime
    mechanism: str
    epsilon: float
    delta: float
    dataset_ids: list[int]
    graph_hash: str | None
    rule: str
    reason: str
    policy_revision: int | None
    status: str = Field(description="pending, approved, denied, or used (by a publish)")
    decided_at: datetime | None
    decided_by: str | None
    decision_reason: str
    ledger_id: int | None
    kind: str = Field(default="publish", description="publish, or run (a training run's steps)")
    description: str = ""
    steps: int | None = Field(default=None, description="a run's planned steps")
    steps_used: int = Field(default=0, description="a run's steps published under it so far")
    step_epsilon: float | None = Field(default=None, description="what each step asks for")
    step_delta: float | None = None
    computation: list[str] = Field(
        default_factory=list,
        description="what the publish computes, as pseudo-torch lines (inputs named "
        'dataset["column"] with their bounds; the last line: what is released, its '
        "sensitivity, mechanism and noise scale); empty for a run",
    )
    sensitivity: float | None = Field(
        default=None, description="the tracked sensitivity the noise is calibrated to"
    )
    noise_scale: float | None = Field(default=None, description="Laplace b or Gaussian sigma")
    outputs: list[list[int]] = Field(default_factory=list, description="released shapes")
    remaining_epsilon: float | None = Field(
        default=None, description="the requester's budget left now"
    )
    remaining_delta: float | None = None
    datasets: list[DatasetReadPublic] = Field(
        default_factory=list, description="the datasets read, with their caps (who may see them)"
    )


class RunPlanCreate(Schema):
    """A training run's public plan: ``steps`` Gaussian publishes at ``(epsilon, delta)``
    each, noising at most ``values`` values each, reading ``dataset_ids``."""

    steps: int = Field(ge=1, le=MAX_ID, strict=True)
    epsilon: float = Field(
        gt=0, allow_inf_nan=False, strict=True, description="each step's epsilon"
    )
    delta: float = Field(
        gt=0, lt=1, allow_inf_nan=False, strict=True, description="each step's delta"
    )
    values: int = Field(
        ge=1,
        le=MAX_ID,
        strict=True,
        description="the most values one step publishes (its parameters)",
    )
    dataset_ids: list[Id] = Field(default_factory=list, max_length=1000)
    description: str = Field(default="", max_length=500)


class RunPlanPublic(Schema):
    run_id: int = Field(description="the run, which each step's publish names (run=)")
    approval_id: int | None = Field(
        default=None, description="the admin's approval it runs under; null: none was needed"
    )
    steps: int
    steps_used: int
    epsilon: float = Field(description="the run's total epsilon, as the ledger counts it")
    delta: float = Field(description="the run's total delta, as the ledger counts it")
    step_epsilon: float
    step_delta: float
    remaining_epsilon: float = Field(description="what the budget keeps once every step ran")
    policy: str
    policy_revision: int | None


class ApprovalAnswer(Schema):
    reason: str = Field(default="", max_length=10_000)


class UploadTensor(Schema):
    name: str = Field(description="data/<column> or mock/<column>", max_length=210)
    dtype: str = Field(description="NumPy dtype name; strings travel as int64 category indices")
    shape: list[StrictInt] = Field(default_factory=list, description="the shape of one row")


class UploadCreate(TableDeclarations):
    """A chunked upload's declarations (a dataset manifest without inline strings) and layout."""

    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=10_000)
    tags: list[str] = Field(default_factory=list)
    rows: int = Field(gt=0, strict=True)
    mock_rows: int | None = Field(default=None, gt=0, strict=True)
    block_rows: int = Field(gt=0, strict=True, description="rows per block of the byte stream")
    tensors: list[UploadTensor]


class UploadPublic(Schema):
    id: str
    received: int = Field(description="bytes the node holds: the offset of the next chunk")
    size: int = Field(description="bytes of the whole stream")
    block_rows: int
    expires_at: datetime
    dataset_id: int | None = Field(default=None, description="set once finalized")


class PublishKeyPublic(Schema):
    """A publish named by its idempotency key: ``running`` once charged, then ``answered``
    (send the publish again with the same key to get the stored answer), or ``lost`` (the
    node process computing it stopped before its answer was stored)."""

    key: str
    state: str = Field(
        description="`running` (charged, being evaluated), `answered`, or `lost` (charged; "
        "the node process computing it stopped before storing its answer: not released "
        "again, the charge stands)"
    )
    ledger_id: int
    created_at: datetime


class SynthesisCreate(Schema):
    """A differentially private synthetic copy of a dataset, paid from the caller's budget."""

    epsilon: float = Field(description="the whole run's epsilon")
    delta: float = Field(description="the whole run's delta, > 0 (Gaussian measurements)")
    rows: int | None = Field(default=None, description="rows to sample; default the source's")
    method: str = Field(default="mst", description="`mst` or `aim`")
    bins: dict[str, int] | None = Field(
        default=None, description="bins per numeric column (default from the row count)"
    )
    columns: list[str] | None = Field(default=None, description="default: every column")
    name: str | None = Field(default=None, max_length=200, description="the new dataset's")
    seed: int | None = Field(
        default=None, description="seeds the sampling of rows (not the noise); not kept"
    )


class MockSynthesisCreate(Schema):
    """A dataset's mock made a differentially private synthetic table, paid from the
    dataset's cap (its owner or an admin)."""

    epsilon: float = Field(description="the whole run's epsilon, taken from the cap")
    delta: float = Field(description="the whole run's delta, > 0 (Gaussian measurements)")
    rows: int | None = Field(default=None, description="mock rows; default the dataset's")
    method: str = Field(default="mst", description="`mst` or `aim`")
    bins: dict[str, int] | None = Field(
        default=None, description="bins per numeric column (default from the row count)"
    )


class SynthesisPublic(Schema):
    dataset: DatasetPublic
    receipt: dict[str, Any]


class SynthesisProgress(Schema):
    done: int = Field(description="rounds or steps done")
    total: int = Field(description="rounds or steps planned (AIM may stop early)")
    phase: str = Field(description="measuring, selecting, estimating, sampling or storing")


class SynthesisJobPublic(Schema):
    """A synthesis job: ``running``, ``answered`` (with ``dataset`` and ``receipt``) or
    ``failed`` (with ``error``; the charge stands)."""

    job: int
    state: str
    method: str | None = None
    ledger_id: int | None = None
    progress: SynthesisProgress | None = None
    dataset: DatasetPublic | None = None
    receipt: dict[str, Any] | None = None
    error: str | None = None

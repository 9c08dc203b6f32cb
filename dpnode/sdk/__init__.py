"""dpnode's Python SDK: find datasets on a node, compute on them, publish noised results.

>>> from dpnode import sdk
>>> url = "http://127.0.0.1:8000"
>>> client = sdk.login(url, email="ds@example.org", password="...")  # doctest: +SKIP
>>> ds = sdk.search(tags=["health"])[0]  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import httpx

from dpnode.sdk import _attention, _bags, _network, _recurrent, query  # noqa: F401  (layers register on remote tensors; query: the builder)
from dpnode.sdk._budget import (
    BudgetGrant,
    BudgetRequest,
    BudgetStatus,
    PolicyRevision,
    PublishApproval,
    TrainingRunPlan,
)
from dpnode.sdk._caps import DatasetBudget, DatasetRead
from dpnode.sdk._client import Client
from dpnode.sdk._display import AuditLog, Columns, Grants, Records
from dpnode.sdk._exceptions import (
    ApprovalRequiredError,
    AuthenticationError,
    BudgetExceededError,
    BudgetMarkBehindError,
    BudgetMarkError,
    ChecksumMismatchError,
    ConflictError,
    DatabaseBusyError,
    DPNodeError,
    EvaluationError,
    EvaluationUnavailableError,
    GraphError,
    InvalidPolicyError,
    InvalidRequestError,
    NetworkError,
    NodeBusyError,
    NodeUnreachableError,
    NotFoundError,
    NotPublishableError,
    PayloadTooLargeError,
    PermissionDeniedError,
    PolicyRefusedError,
    PrivacyTrackingError,
    PrivateValueError,
    PublishInProgressError,
    PublishLostError,
    QuotaExceededError,
    RateLimitedError,
    ServerError,
    UnsupportedDTypeError,
    UnsupportedOperationError,
    UploadOffsetError,
    UploadRejectedError,
)
from dpnode.sdk._federated import Federated, federated
from dpnode.sdk._federated_receipts import (
    FederatedError,
    FederatedReceipt,
    FederatedResult,
    SiteRelease,
)
from dpnode.sdk._handles import (
    AuditEvent,
    ColumnInfo,
    DatasetHandle,
    ModelHandle,
    NodeRef,
    TensorInfo,
    User,
)
from dpnode.sdk._ledger import Ledger, LedgerEntry, LedgerLine, LedgerRun
from dpnode.sdk._network import DatasetListing, Network, NodeInfo, network
from dpnode.sdk._publish import (
    Receipt,
    Sensitivity,
    noise_scale,
    publish,
    publish_grads,
    sensitivity,
)
from dpnode.sdk._regression import (
    LinearRegression,
    LogisticRegression,
    linear_regression,
    logistic_regression,
)
from dpnode.sdk._remote import MockSession, RemoteTensor, mock
from dpnode.sdk._remote.distinct import count_distinct
from dpnode.sdk._scaling import BoundsScaler, bounds_scaler
from dpnode.sdk._steps import StepBudget, step_budget
from dpnode.sdk._synthesis import SynthesisJob
from dpnode.sdk._training import PrivateTraining, TrainingStep, private_training
from dpnode.sdk._transport import InProcessTransport

__all__ = [
    "ApprovalRequiredError",
    "AuditEvent",
    "AuditLog",
    "AuthenticationError",
    "BoundsScaler",
    "BudgetExceededError",
    "BudgetGrant",
    "BudgetMarkBehindError",
    "BudgetMarkError",
    "BudgetRequest",
    "BudgetStatus",
    "ChecksumMismatchError",
    "Client",
    "ColumnInfo",
    "Columns",
    "ConflictError",
    "DPNodeError",
    "DatabaseBusyError",
    "DatasetBudget",
    "DatasetHandle",
    "DatasetListing",
    "DatasetRead",
    "EvaluationError",
    "EvaluationUnavailableError",
    "Federated",
    "FederatedError",
    "FederatedReceipt",
    "FederatedResult",
    "Grants",
    "GraphError",
    "InProcessTransport",
    "InvalidPolicyError",
    "InvalidRequestError",
    "Ledger",
    "LedgerEntry",
    "LedgerLine",
    "LedgerRun",
    "LinearRegression",
    "LogisticRegression",
    "MockSession",
    "ModelHandle",
    "Network",
    "NetworkError",
    "NodeBusyError",
    "NodeInfo",
    "NodeRef",
    "NodeUnreachableError",
    "NotFoundError",
    "NotPublishableError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PolicyRefusedError",
    "PolicyRevision",
    "PrivacyTrackingError",
    "PrivateTraining",
    "PrivateValueError",
    "PublishApproval",
    "PublishInProgressError",
    "PublishLostError",
    "QuotaExceededError",
    "RateLimitedError",
    "Receipt",
    "Records",
    "RemoteTensor",
    "Sensitivity",
    "ServerError",
    "SiteRelease",
    "StepBudget",
    "SynthesisJob",
    "TensorInfo",
    "TrainingRunPlan",
    "TrainingStep",
    "UnsupportedDTypeError",
    "UnsupportedOperationError",
    "UploadOffsetError",
    "UploadRejectedError",
    "User",
    "bounds_scaler",
    "count_distinct",
    "current_client",
    "federated",
    "linear_regression",
    "login",
    "logistic_regression",
    "mock",
    "network",
    "noise_scale",
    "private_training",
    "publish",
    "publish_grads",
    "query",
    "search",
    "sensitivity",
    "sql",
    "step_budget",
]

_last_client: Client | None = None


def login(
    url: str,
    *,
    email: str,
    password: str,
    transport: httpx.BaseTransport | None = None,
    progress: bool | None = None,
) -> Client:
    """Log in to a node and return a client; module-level helpers use the last one.

    ``progress``: progress bars for long publishes and chunked uploads (default: in a
    terminal or a notebook); see :class:`Client` for the other options.

    Raises:
        AuthenticationError: wrong email or password, or a deactivated account.
        NodeUnreachableError: nothing answers at ``url``.
    """
    global _last_client
    client = Client(url, transport=transport, progress=progress).login(email, password)
    _last_client = client
    return client


def current_client() -> Client:
    """The client of the last ``sdk.login``."""
    if _last_client is None:
        raise DPNodeError("not logged in: call sdk.login(url, email=..., password=...) first")
    return _last_client


def search(
    tags: Iterable[str] = (),
    text: str | None = None,
    kind: Literal["any", "dataset", "model"] = "any",
    *,
    network: str | None = None,
) -> list[DatasetHandle | ModelHandle] | list[DatasetHandle | DatasetListing]:
    """``Client.search`` on the last login; with ``network=URL``, datasets across that
    network's reachable members (``Network.search``: handles on the nodes you logged in to
    through ``sdk.network(URL).login``, public listings on the others)."""
    if network is not None:
        if kind == "model":
            raise InvalidRequestError("a network lists datasets only: search it with kind='any'")
        return _network.network(network).search(tags=tags, text=text)
    return current_client().search(tags=tags, text=text, kind=kind)


def sql(
    statement: str, *, epsilon: float, delta: float | None = None, description: str = ""
) -> query.QueryResult:
    """``Client.sql`` on the last login."""
    return current_client().sql(statement, epsilon=epsilon, delta=delta, description=description)

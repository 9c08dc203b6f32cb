"""Exceptions the SDK raises; each node error code has its own class.

DPNodeError                      any error reported by (or about) the node
├── InvalidRequestError          invalid_request: the request was malformed
│   ├── UploadRejectedError      upload_rejected: data breaks its declared contract
│   ├── ChecksumMismatchError    checksum_mismatch: an upload chunk damaged on the way
│   ├── InvalidPolicyError       invalid_policy: a malformed budget policy (names the keys)
│   └── GraphError               invalid_graph: the node refused a computation
│       ├── PrivacyTrackingError   untrackable_graph: sensitivity cannot be bounded
│       │   └── NotPublishableError  not_publishable, raised locally as an op is recorded:
│       │                              a prim without a privacy rule applied to private data
│       └── UnsupportedDTypeError  unsupported_dtype
├── EvaluationError              evaluation_error: a computation failed on the node
├── QuotaExceededError           quota_exceeded: over a size or compute quota
├── PayloadTooLargeError         payload_too_large
├── AuthenticationError          unauthenticated: bad credentials or expired session
├── RateLimitedError             rate_limited: too many logins (or network searches) lately;
│                                  ``retry_after`` seconds
├── PermissionDeniedError        forbidden: your role may not do this
│   └── PolicyRefusedError       policy_refused: a budget policy rule refused the publish
│       ├── BudgetExceededError    budget_exceeded: over your budget or a dataset's cap
│       └── ApprovalRequiredError  approval_required: the publish waits for an admin
├── NotFoundError                not_found
│   └── UnknownStructureError    unknown_structure: resent whole, automatically
├── ConflictError                conflict: e.g. a name already taken
│   ├── PublishInProgressError   publish_in_progress: the same key's publish still runs
│   ├── PublishLostError         publish_lost: charged, its answer lost with the node's process
│   └── UploadOffsetError        upload_offset: a chunk sent at the wrong offset (``offset``)
├── ServerError                  the node failed (5xx); tell its operator
├── NodeBusyError                overloaded (503): too many requests at once; retried
│   └── DatabaseBusyError          database_busy (503): the database kept it waiting
├── EvaluationUnavailableError   evaluation_unavailable (503): the node's compute cluster
│                                  is out of reach; nothing was charged; retry later
├── BudgetMarkError              budget_mark_unavailable (503): the node cannot vouch for
│   │                              its spending records; publishes refused; tell its operator
│   └── BudgetMarkBehindError      budget_mark_behind (503): a restored database lacks
│                                    spending; publishes refused until an admin carries it
├── NodeUnreachableError         no answer from the node (network, wrong URL); for a
│                                  publish, ``idempotency_key`` retries it safely
├── PrivateValueError            raised locally: code asked for a remote tensor's values
└── UnsupportedOperationError    raised locally: an op outside the prim vocabulary
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "ApprovalRequiredError",
    "AuthenticationError",
    "BudgetExceededError",
    "BudgetMarkBehindError",
    "BudgetMarkError",
    "ChecksumMismatchError",
    "ConflictError",
    "DPNodeError",
    "DatabaseBusyError",
    "EvaluationError",
    "EvaluationUnavailableError",
    "GraphError",
    "InvalidPolicyError",
    "InvalidRequestError",
    "NetworkError",
    "NodeBusyError",
    "NodeUnreachableError",
    "NotFoundError",
    "NotPublishableError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PolicyRefusedError",
    "PrivacyTrackingError",
    "PrivateValueError",
    "PublishInProgressError",
    "PublishLostError",
    "QuotaExceededError",
    "RateLimitedError",
    "ServerError",
    "UnknownStructureError",
    "UnsupportedDTypeError",
    "UnsupportedOperationError",
    "UploadOffsetError",
    "UploadRejectedError",
]


class DPNodeError(Exception):
    """Base class: ``code`` is the node's stable error code, ``detail`` its message."""

    code: ClassVar[str] = "error"

    def __init__(self, detail: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        if code is not None and code != type(self).code:
            self.code = code  # type: ignore[misc]  # an unknown code, kept for the caller


class InvalidRequestError(DPNodeError):
    code = "invalid_request"


class UploadRejectedError(InvalidRequestError):
    code = "upload_rejected"


class ChecksumMismatchError(InvalidRequestError):
    """An upload chunk did not match its checksum on arrival; nothing of it was written."""

    code = "checksum_mismatch"


class InvalidPolicyError(InvalidRequestError):
    """A policy document the node refused; the message names every offending key."""

    code = "invalid_policy"


class GraphError(InvalidRequestError):
    code = "invalid_graph"


class PrivacyTrackingError(GraphError):
    """The node cannot bound how much one subject moves this computation: nothing ran."""

    code = "untrackable_graph"


class NotPublishableError(PrivacyTrackingError):
    """Raised locally as an op is recorded: it applies a prim that has no privacy rule to
    private data, so the node would refuse to publish anything computed from the result.

    Private data is a dataset's values and everything computed from them; public are local
    tensors, model weights and a dataset's subject grouping. Only these public facts and
    the prim's name decide, never a value. The message names the torch call you wrote
    (``torch.median``, or ``Tensor.backward()`` for a gradient) and suggests an alternative
    where one exists; ``docs/prims.md`` lists which prims have a privacy rule.

    Attributes:
        call: the torch call, as the message names it.
        prim: the public-only prim it needs.
    """

    code = "not_publishable"
    call: str | None = None
    prim: str | None = None


class UnsupportedDTypeError(GraphError):
    code = "unsupported_dtype"


class EvaluationError(DPNodeError):
    code = "evaluation_error"


class QuotaExceededError(DPNodeError):
    code = "quota_exceeded"


class PayloadTooLargeError(DPNodeError):
    code = "payload_too_large"


class AuthenticationError(DPNodeError):
    code = "unauthenticated"


class RateLimitedError(DPNodeError):
    """Too many login attempts lately, for this email or from this address (the node did not
    check the password), or too many searches of a network from this address. Wait
    ``retry_after`` seconds (the ``Retry-After``; ``None`` if none came) and try again; the
    message says how long too.
    """

    code = "rate_limited"
    retry_after: int | None = None


class PermissionDeniedError(DPNodeError):
    code = "forbidden"


class PolicyRefusedError(PermissionDeniedError):
    """A budget policy refused a publish; nothing was released or charged.

    Attributes:
        rule: the rule that refused, e.g. ``"publish.max_epsilon"``, ``"rate_limit.max_publishes"``,
            ``"datasets.diabetes.max_epsilon"``, ``"roles.data_scientist.epsilon"``.
        policy: the policy's name; ``policy_revision`` its revision (``None``: the built-in
            default).
        reason: the rule's sentence, without the policy and rule appended to ``detail``.
    """

    code = "policy_refused"
    rule: str | None = None
    policy: str | None = None
    policy_revision: int | None = None
    reason: str | None = None


class BudgetExceededError(PolicyRefusedError):
    """The publish does not fit your budget (``rule`` names the allocation) or a dataset's
    cap across all users (``datasets.NAME.*``). Ask for more with ``client.request_budget``."""

    code = "budget_exceeded"


class ApprovalRequiredError(PolicyRefusedError):
    """The publish asks for more than the policy lets run without an admin's approval.

    A request was queued (``approval_id``); once an admin approves it, publish the same
    computation again with the same epsilon (and delta): it runs once. See
    ``client.publish_approvals()`` for its state.
    """

    code = "approval_required"
    approval_id: int | None = None


class NotFoundError(DPNodeError):
    code = "not_found"


class UnknownStructureError(NotFoundError):
    """The node no longer holds a graph structure this client referenced (resent whole)."""

    code = "unknown_structure"


class ConflictError(DPNodeError):
    code = "conflict"


class PublishInProgressError(ConflictError):
    """A publish with this idempotency key was charged and is still running on the node:
    retry it with the same key (``idempotency_key``) to get its answer, charged once."""

    code = "publish_in_progress"
    idempotency_key: str | None = None


class PublishLostError(ConflictError):
    """A publish with this idempotency key was charged, and the node process computing it
    stopped before its answer was stored: the node does not release it again (it may have
    been sent), and the charge stands. Publish again with a new key."""

    code = "publish_lost"
    idempotency_key: str | None = None


class UploadOffsetError(ConflictError):
    """A chunk sent at another offset than where its upload stands: ``offset`` says where."""

    code = "upload_offset"
    offset: int | None = None


class ServerError(DPNodeError):
    code = "internal_error"


class NodeBusyError(DPNodeError):
    """The node was handling as many requests as it takes at once and did nothing with this
    one (``503 overloaded``). The client sends it again by itself, after ``retry_after``
    seconds (the node's ``Retry-After``), up to ``busy_retries`` times; this is raised when
    the node stayed busy through them all."""

    code = "overloaded"
    retry_after: int | None = None


class DatabaseBusyError(NodeBusyError):
    """The node's database kept the request waiting too long (``503 database_busy``); the
    request did not complete. Reads and publishes (under their idempotency key) are sent
    again by the client; other requests are left to you, since an earlier step of the
    request may have been saved."""

    code = "database_busy"


class EvaluationUnavailableError(DPNodeError):
    """The node evaluates this publish on its compute cluster, which it cannot reach or which
    has no worker (``503 evaluation_unavailable``, with a ``Retry-After``): nothing was
    charged or read, so sending it again after ``retry_after`` seconds is safe. Tell the
    node's operator if it lasts.

    >>> e = error_for(503, "evaluation_unavailable", "no worker", headers={"Retry-After": "30"})
    >>> type(e).__name__, e.retry_after
    ('EvaluationUnavailableError', 30)
    """

    code = "evaluation_unavailable"
    retry_after: int | None = None


class BudgetMarkError(DPNodeError):
    """The node cannot vouch that its database holds all privacy spending (its budget mark
    is missing or unreadable): publishes are refused and nothing was charged; reads and
    logins still work. Tell the node's operator (the detail names the fix)."""

    code = "budget_mark_unavailable"


class BudgetMarkBehindError(BudgetMarkError):
    """The node's database holds less privacy spending than its budget mark (an older backup
    was restored): publishes are refused, nothing was charged, until an admin runs
    ``dpnode budget carry-forward``."""

    code = "budget_mark_behind"


class NodeUnreachableError(DPNodeError):
    """No answer from the node. For a publish, ``idempotency_key`` names the request: it may
    or may not have run, and ``publish_frame(..., idempotency_key=...)`` with that key
    gets its answer if it did, charged once (for as long as the node keeps answers). For a
    chunked upload, ``upload_id`` names the session: ``upload_dataset(..., resume=upload_id)``
    with the same data sends only what the node does not hold yet."""

    code = "unreachable"

    def __init__(self, detail: str, *, idempotency_key: str | None = None) -> None:
        super().__init__(detail)
        self.idempotency_key = idempotency_key
        #: For a chunked upload: the session to go on with (``upload_dataset(resume=...)``).
        self.upload_id: str | None = None


class PrivateValueError(DPNodeError):
    """A remote tensor's values were needed locally (``item``, ``bool``, a boolean mask...).

    Values stay on the node; publish a result with ``tensor.publish(epsilon=...)``, or keep the
    computation remote (``torch.where(cond, a, b)`` instead of ``if cond:``).
    """

    code = "private_value"


class UnsupportedOperationError(DPNodeError, NotImplementedError):
    """An op on remote tensors that the prim vocabulary cannot express (see docs/prims.md)."""

    code = "unsupported_operation"


class NetworkError(DPNodeError):
    """The node could not reach a network of nodes it is a member of, or the network
    answered an error (``502 network_error``): the node's membership is as it was; its
    operator sees the cause in ``dpnode network status``."""

    code = "network_error"


BY_CODE: dict[str, type[DPNodeError]] = {
    cls.code: cls
    for cls in (
        InvalidRequestError,
        UploadRejectedError,
        ChecksumMismatchError,
        InvalidPolicyError,
        GraphError,
        PrivacyTrackingError,
        UnsupportedDTypeError,
        EvaluationError,
        QuotaExceededError,
        PayloadTooLargeError,
        AuthenticationError,
        RateLimitedError,
        PermissionDeniedError,
        PolicyRefusedError,
        BudgetExceededError,
        ApprovalRequiredError,
        NotFoundError,
        UnknownStructureError,
        ConflictError,
        PublishInProgressError,
        PublishLostError,
        UploadOffsetError,
        ServerError,
        NodeBusyError,
        DatabaseBusyError,
        EvaluationUnavailableError,
        BudgetMarkError,
        BudgetMarkBehindError,
        NetworkError,
    )
}


#: What a refusal over a user's own budget adds to the node's message.
ASK_FOR_MORE = (
    "Ask an admin for more with client.request_budget(epsilon=..., reason=...), "
    "or publish with a smaller epsilon"
)

#: Fields of an error body (besides ``error`` and ``detail``) kept as exception attributes.
_EXTRA = ("rule", "policy", "policy_revision", "reason", "approval_id", "offset")


#: HTTP's Retry-After as seconds (delay-seconds: ASCII digits), up to 9 of them
_SECONDS = re.compile(r"[0-9]{1,9}")


def error_for(
    status: int,
    code: str | None,
    detail: str,
    extra: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> DPNodeError:
    """The exception for a node error response.

    >>> type(error_for(403, "forbidden", "no")).__name__
    'PermissionDeniedError'
    >>> error_for(503, "weird", "x").code
    'weird'
    >>> error_for(429, "rate_limited", "wait", headers={"Retry-After": "42"}).retry_after
    42
    >>> error_for(503, "overloaded", "busy", headers={"Retry-After": "1"}).retry_after
    1
    >>> str(error_for(403, "budget_exceeded", "over", {"rule": "roles.analyst.epsilon"}))[:55]
    'over. Ask an admin for more with client.request_budget('
    """
    cls = BY_CODE.get(code or "")
    if cls is None:
        cls = ServerError if status >= 500 else DPNodeError
    rule = (extra or {}).get("rule")
    if cls is BudgetExceededError and not str(rule or "").startswith("datasets."):
        detail = f"{detail}. {ASK_FOR_MORE}"  # a dataset's cap is for everyone: no request helps
    error = cls(detail, status=status, code=code)
    for name in _EXTRA:
        if extra and name in extra and hasattr(cls, name):
            setattr(error, name, extra[name])
    if (
        isinstance(error, RateLimitedError | NodeBusyError | EvaluationUnavailableError)
        and headers is not None
    ):
        retry_after = headers.get("Retry-After", "").strip()
        # seconds, in ASCII digits (isdigit() took '²', which int() cannot read); the node
        # never sends the date form, nor more than 9 digits
        if _SECONDS.fullmatch(retry_after):
            error.retry_after = int(retry_after)
    return error


def raise_for_error(response: Any) -> None:
    """Raise the typed error of an HTTP error ``response`` (an ``httpx.Response``) from its
    JSON ``error`` code and ``detail``, or its text when it has no JSON; nothing otherwise."""
    if not response.is_error:
        return
    body = None
    try:
        body = response.json()
        code, detail = body.get("error"), str(body.get("detail", response.text))
    except (ValueError, AttributeError):
        body, code, detail = None, None, response.text or response.reason_phrase
    raise error_for(response.status_code, code, detail, body, response.headers)

"""Domain errors of the node, each with a stable ``code``.

Services and the engine raise these; only the app factory (``dpnode.node.app``) maps
them to HTTP responses of the form ``{"error": code, "detail": message}``, and
the SDK maps each ``code`` back to a typed exception.

    DPNodeError
    ├── InvalidRequestError      invalid_request      malformed or inconsistent input
    │   ├── UploadRejectedError  upload_rejected      data breaks the declared contract
    │   ├── ChecksumMismatchError  checksum_mismatch  an upload chunk damaged on the way
    │   ├── InvalidPolicyError   invalid_policy       a malformed budget policy document
    │   └── GraphError           invalid_graph        a graph the engine refuses
    │       └── UnsupportedDTypeError  unsupported_dtype
    ├── EvaluationError          evaluation_error     a valid graph failed on its values
    ├── QuotaExceededError       quota_exceeded       graph/compute/memory over a quota
    ├── PayloadTooLargeError     payload_too_large    a request body over its limit
    ├── EvaluationUnavailableError  evaluation_unavailable  the node's compute cluster is
    │                                                   out of reach; nothing was done
    ├── BudgetMarkError          budget_mark_unavailable  the spending mark is missing or
    │   │                                                 unreadable; publishes refused
    │   └── BudgetMarkBehindError  budget_mark_behind   the database holds less spending
    │                                                   than the mark (a restored backup)
    ├── AuthenticationError      unauthenticated      missing, bad or expired credentials
    ├── RateLimitedError         rate_limited         too many attempts (logins, public
    │                                                   searches); retry later
    ├── PermissionDeniedError    forbidden            authenticated but not allowed
    │   └── PolicyRefusedError   policy_refused       a budget policy rule refused a publish
    │       ├── BudgetExceededError  budget_exceeded  the charge does not fit a budget or cap
    │       └── ApprovalRequiredError  approval_required  the publish waits for an admin
    ├── NotFoundError            not_found
    │   └── UnknownStructureError  unknown_structure  a graph reference the node lacks
    └── ConflictError            conflict             e.g. a name already taken
        ├── PublishInProgressError  publish_in_progress  a retried publish still running
        ├── PublishLostError        publish_lost         charged, its answer lost with its process
        └── UploadOffsetError    upload_offset        a chunk sent at the wrong offset
"""

from __future__ import annotations

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
    "EvaluationError",
    "EvaluationUnavailableError",
    "GraphError",
    "InvalidPolicyError",
    "InvalidRequestError",
    "NetworkError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PolicyRefusedError",
    "PublishInProgressError",
    "PublishLostError",
    "QuotaExceededError",
    "RateLimitedError",
    "UnknownStructureError",
    "UnsupportedDTypeError",
    "UploadOffsetError",
    "UploadRejectedError",
]


class DPNodeError(Exception):
    """Base of every error the node reports to a client."""

    code: ClassVar[str] = "internal_error"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    def extra(self) -> dict[str, Any]:
        """Fields the HTTP error body carries besides ``error`` and ``detail``."""
        return {}


class InvalidRequestError(DPNodeError):
    code = "invalid_request"


class UploadRejectedError(InvalidRequestError):
    code = "upload_rejected"


class ChecksumMismatchError(InvalidRequestError):
    """An upload chunk does not match the checksum sent with it; nothing was written."""

    code = "checksum_mismatch"


class InvalidPolicyError(InvalidRequestError):
    code = "invalid_policy"


class GraphError(InvalidRequestError):
    code = "invalid_graph"


class UnsupportedDTypeError(GraphError):
    code = "unsupported_dtype"


class EvaluationError(DPNodeError):
    code = "evaluation_error"


class QuotaExceededError(DPNodeError):
    code = "quota_exceeded"


class PayloadTooLargeError(DPNodeError):
    code = "payload_too_large"


class EvaluationUnavailableError(DPNodeError):
    """The cluster that evaluates this publish (``dpnode.node.cluster``) cannot be reached,
    or has no workers: found before anything was charged or read; retry after ``retry_after``
    seconds. Decided from the cluster's state alone, never from a value."""

    code = "evaluation_unavailable"

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class BudgetMarkError(DPNodeError):
    """The node cannot vouch that its database holds all privacy spending (its budget mark,
    kept outside the database, is missing or unreadable): publishes are refused, nothing is
    charged; the detail names the command that resolves it."""

    code = "budget_mark_unavailable"


class BudgetMarkBehindError(BudgetMarkError):
    """The database holds less privacy spending than the node's budget mark (a restored
    backup, a rolled-back upgrade, a node process killed with a reservation): publishes are
    refused until an admin runs ``dpnode budget carry-forward``; nothing is charged."""

    code = "budget_mark_behind"


class AuthenticationError(DPNodeError):
    code = "unauthenticated"


class RateLimitedError(DPNodeError):
    """Too many attempts (logins, a network's public searches; see
    dpnode.node.services.throttle): wait ``retry_after`` s.

    The response carries it as a ``Retry-After`` header; the body keeps the usual shape.
    """

    code = "rate_limited"

    def __init__(self, detail: str, *, retry_after: int) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class PermissionDeniedError(DPNodeError):
    code = "forbidden"


class PolicyRefusedError(PermissionDeniedError):
    """A publish refused by a budget policy: names the policy revision and the rule.

    The error body carries them next to ``error`` and ``detail`` (see :meth:`extra`).
    """

    code = "policy_refused"

    def __init__(
        self,
        detail: str,
        *,
        rule: str | None = None,
        policy: str | None = None,
        policy_revision: int | None = None,
        **more: Any,
    ) -> None:
        super().__init__(detail)
        self.rule = rule
        self.policy = policy
        self.policy_revision = policy_revision
        self.more = more

    def extra(self) -> dict[str, Any]:
        """Fields the HTTP error body carries besides ``error`` and ``detail``."""
        if self.rule is None:
            return {}
        return {
            "rule": self.rule,
            "policy": self.policy,
            "policy_revision": self.policy_revision,
            **self.more,
        }


class BudgetExceededError(PolicyRefusedError):
    code = "budget_exceeded"


class ApprovalRequiredError(PolicyRefusedError):
    """The publish waits for an admin; ``more["approval_id"]`` names the request."""

    code = "approval_required"


class NotFoundError(DPNodeError):
    code = "not_found"


class UnknownStructureError(NotFoundError):
    """A publish referenced a graph structure the node does not hold: resend it whole."""

    code = "unknown_structure"


class ConflictError(DPNodeError):
    code = "conflict"


class PublishInProgressError(ConflictError):
    """A publish with this idempotency key was charged and has not been answered yet."""

    code = "publish_in_progress"


class PublishLostError(ConflictError):
    """A publish with this idempotency key was charged, and the node process computing it
    stopped (or could not store its answer) before the answer was stored: it is not
    released again, and the charge stands."""

    code = "publish_lost"


class UploadOffsetError(ConflictError):
    """A chunk sent at another offset than where its upload stands; ``offset`` says where."""

    code = "upload_offset"

    def __init__(self, detail: str, *, offset: int) -> None:
        super().__init__(detail)
        self.offset = offset

    def extra(self) -> dict[str, Any]:
        return {"offset": self.offset}


class NetworkError(DPNodeError):
    """A network of nodes this node is a member of (or joins) could not be reached, or
    answered an error: the membership's state is unchanged (``dpnode network status``)."""

    code = "network_error"

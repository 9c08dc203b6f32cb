"""Exceptions the SDK raises; each node error code has its own class.

DPNodeError                      any error reported by (or about) the node
├── InvalidRequestError          invalid_request: the request was malformed
│   ├── UploadRejectedError      upload_rejected: data breaks its declared contract
│   └── GraphError               invalid_graph: the node refused a computation
│       ├── PrivacyTrackingError   untrackable_graph: sensitivity cannot be bounded
│       └── UnsupportedDTypeError  unsupported_dtype
├── EvaluationError              evaluation_error: a computation failed on the node
├── QuotaExceededError           quota_exceeded: over a size or compute quota
├── PayloadTooLargeError         payload_too_large
├── AuthenticationError          unauthenticated: bad credentials or expired session
├── PermissionDeniedError        forbidden: your role may not do this
├── NotFoundError                not_found
│   └── UnknownStructureError    unknown_structure: resent whole, automatically
├── ConflictError                conflict: e.g. a name already taken
├── ServerError                  the node failed (5xx); tell its operator
├── NodeUnreachableError         no answer from the node (network, wrong URL)
├── PrivateValueError            raised locally: code asked for a remote tensor's values
└── UnsupportedOperationError    raised locally: an op outside the prim vocabulary
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AuthenticationError",
    "BudgetExceededError",
    "ConflictError",
    "DPNodeError",
    "EvaluationError",
    "GraphError",
    "InvalidRequestError",
    "NodeUnreachableError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PrivateValueError",
    "QuotaExceededError",
    "ServerError",
    "UnsupportedDTypeError",
    "UnsupportedOperationError",
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


class GraphError(InvalidRequestError):
    code = "invalid_graph"


class PrivacyTrackingError(GraphError):
    """The node cannot bound how much one subject moves this computation: nothing ran."""

    code = "untrackable_graph"


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


class PermissionDeniedError(DPNodeError):
    code = "forbidden"


class BudgetExceededError(PermissionDeniedError):
    code = "budget_exceeded"


class NotFoundError(DPNodeError):
    code = "not_found"


class UnknownStructureError(NotFoundError):
    """The node no longer holds a graph structure this client referenced (resent whole)."""

    code = "unknown_structure"


class ConflictError(DPNodeError):
    code = "conflict"


class ServerError(DPNodeError):
    code = "internal_error"


class NodeUnreachableError(DPNodeError):
    code = "unreachable"


class PrivateValueError(DPNodeError):
    """A remote tensor's values were needed locally (``item``, ``bool``, a boolean mask...).

    Values stay on the node; publish a result with ``tensor.publish(epsilon=...)``, or keep the
    computation remote (``torch.where(cond, a, b)`` instead of ``if cond:``).
    """

    code = "private_value"


class UnsupportedOperationError(DPNodeError, NotImplementedError):
    """An op on remote tensors that the prim vocabulary cannot express (see docs/prims.md)."""

    code = "unsupported_operation"


BY_CODE: dict[str, type[DPNodeError]] = {
    cls.code: cls
    for cls in (
        InvalidRequestError,
        UploadRejectedError,
        GraphError,
        PrivacyTrackingError,
        UnsupportedDTypeError,
        EvaluationError,
        QuotaExceededError,
        PayloadTooLargeError,
        AuthenticationError,
        PermissionDeniedError,
        BudgetExceededError,
        NotFoundError,
        UnknownStructureError,
        ConflictError,
        ServerError,
    )
}


def error_for(status: int, code: str | None, detail: str) -> DPNodeError:
    """The exception for a node error response.

    >>> type(error_for(403, "forbidden", "no")).__name__
    'PermissionDeniedError'
    >>> error_for(503, "weird", "x").code
    'weird'
    """
    cls = BY_CODE.get(code or "")
    if cls is None:
        cls = ServerError if status >= 500 else DPNodeError
    return cls(detail, status=status, code=code)

"""The one error policies raise: an invalid document, with every offending key named.

``PolicyError`` is a ``ValueError`` carrying ``problems``, a list of ``(key, message)`` pairs
where ``key`` is the dotted path in the document (``roles.data_scientist.delta``), so that the
API can answer with a 4xx that says exactly what to fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import ValidationError

__all__ = ["PolicyError", "from_validation_error"]

_KNOWN_SECTIONS = {
    "roles": "roles are admin, data_owner, data_scientist",
}


class PolicyError(ValueError):
    """A policy document that cannot be used.

    Attributes:
        problems: ``(key, message)`` pairs; the key is a dotted path, ``""`` for the document.
    """

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = list(problems)
        text = "; ".join(f"{key}: {msg}" if key else msg for key, msg in self.problems)
        super().__init__(f"invalid policy: {text}")


def _message(kind: str, msg: str, key: str, value: object) -> str:
    if kind == "extra_forbidden":
        head = key.split(".")[0]
        hint = _KNOWN_SECTIONS.get(head) if key.count(".") == 1 else None
        return f"unknown key ({hint})" if hint else "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "finite_number":
        return f"must be a finite number, got {value!r}"
    if kind == "timezone_aware":
        return "must carry a UTC offset, e.g. 2026-01-01T00:00:00Z"
    if kind == "literal_error" and key == "version":
        return f"unsupported policy format {value!r}; this node reads 1"
    msg = msg.removeprefix("Value error, ").replace("Input should be", "must be")
    if kind in ("greater_than_equal", "less_than", "greater_than", "less_than_equal"):
        return f"{msg}, got {value!r}"
    return msg


def from_validation_error(exc: ValidationError) -> PolicyError:
    """Translate pydantic's errors into dotted keys and plain messages."""
    problems = []
    for err in exc.errors(include_url=False):
        key = ".".join(str(part) for part in err["loc"])
        problems.append((key, _message(err["type"], err["msg"], key, err.get("input"))))
    return PolicyError(problems)

"""Policy documents: the pydantic models, TOML/JSON loading and canonical serialisation.

A policy is data: a TOML file an admin writes (``default.toml`` beside this module documents every
key) or the same shape as JSON through the API. Unknown keys are refused rather than ignored,
because a misspelt cap that silently does nothing is worse than an error. The canonical form
(:meth:`Policy.to_dict`, :meth:`Policy.to_json`) is what the node stores for each revision, and
:meth:`Policy.content_hash` identifies it; loading the canonical form gives an equal policy.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from collections.abc import Mapping
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_serializer,
    field_validator,
)

from dpnode.policies._errors import PolicyError, from_validation_error
from dpnode.policies._periods import Period, as_utc, format_period, parse_period

__all__ = [
    "ROLES",
    "SCHEMA_VERSION",
    "Amounts",
    "ApprovalThresholds",
    "DatasetCap",
    "Policy",
    "PublishCaps",
    "RateLimit",
    "Renewal",
    "Roles",
    "default_policy",
    "load_policy",
    "load_policy_file",
]

#: The document format this code reads (the ``version`` key). Stored revisions are numbered
#: by the node, separately.
SCHEMA_VERSION = 1
#: The node's roles (``dpnode.node.db.models.Role``), mirrored; a test keeps them in step.
ROLES: tuple[str, ...] = ("admin", "data_owner", "data_scientist")


def _number(value: Any) -> Any:
    # pydantic would read true as 1.0; a boolean epsilon is a mistake, not a number.
    if isinstance(value, bool | str):
        raise ValueError(f"must be a number, not {type(value).__name__} {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value!r}")
    return value


Epsilon = Annotated[float, BeforeValidator(_number), Field(ge=0, allow_inf_nan=False)]
Delta = Annotated[float, BeforeValidator(_number), Field(ge=0, lt=1, allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Amounts(_Model):
    """An allocation of epsilon and delta; a missing key inherits (from the role, or the node)."""

    epsilon: Epsilon | None = None
    delta: Delta | None = None


class Renewal(_Model):
    """Budgets renew every ``every`` (e.g. ``"30d"``), in windows anchored at ``anchor`` (UTC)."""

    every: str
    anchor: AwareDatetime

    @field_validator("every")
    @classmethod
    def _every(cls, value: str) -> str:
        return format_period(parse_period(value))

    @field_validator("anchor")
    @classmethod
    def _anchor(cls, value: datetime) -> datetime:
        return as_utc(value)

    @field_serializer("anchor")
    def _dump_anchor(self, value: datetime) -> str:
        # isoformat writes every year in four digits (strftime's %Y writes 999 for 999)
        text = value.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
        return text.replace(".000000Z", "Z")

    def period(self) -> Period:
        """The windows this renewal defines."""
        return Period(parse_period(self.every), self.anchor)


class PublishCaps(_Model):
    """Largest epsilon and delta of one publish (the release's own guarantee)."""

    max_epsilon: Epsilon | None = None
    max_delta: Delta | None = None


class ApprovalThresholds(_Model):
    """A publish whose epsilon (or delta) is strictly above these waits for an admin."""

    epsilon_above: Epsilon | None = None
    delta_above: Delta | None = None


class RateLimit(_Model):
    """At most ``max_publishes`` publishes per user in any window of length ``window``."""

    max_publishes: Annotated[int, Field(ge=0, strict=True)]
    window: str

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        return format_period(parse_period(value))


class DatasetCap(_Model):
    """Total epsilon and delta all users together may spend on one dataset.

    Never renews unless ``renewal`` is given: the promise to a dataset's subjects is for life.
    """

    max_epsilon: Epsilon | None = None
    max_delta: Delta | None = None
    renewal: Renewal | None = None


class Roles(_Model):
    """Default allocation per role; a role not listed gets the node's default budget."""

    admin: Amounts | None = None
    data_owner: Amounts | None = None
    data_scientist: Amounts | None = None


class Policy(_Model):
    """A budget policy document. Every section is optional; an empty policy adds no rule.

    Attributes:
        version: the document format, :data:`SCHEMA_VERSION`.
        zcdp_delta_share: the part of every delta allocation (and dataset delta cap) reserved
            for converting zCDP (Gaussian) charges to epsilon; the rest pays for deltas charged
            directly. Fixed in advance, so that the combination stays sound under adaptivity.
    """

    version: Literal[1] = 1
    name: str = ""
    description: str = ""
    zcdp_delta_share: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] = 1023 / 1024
    renewal: Renewal | None = None
    roles: Roles = Roles()
    users: dict[str, Amounts] = {}
    publish: PublishCaps = PublishCaps()
    approval: ApprovalThresholds = ApprovalThresholds()
    rate_limit: RateLimit | None = None
    datasets: dict[str, DatasetCap] = {}

    @field_validator("users", mode="before")
    @classmethod
    def _users(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        problems = _user_key_problems(value)
        if problems:
            raise ValueError("; ".join(f"{key!r}: {msg}" for key, msg in problems))
        return {str(key).strip().lower(): amounts for key, amounts in value.items()}

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, value: dict[str, DatasetCap]) -> dict[str, DatasetCap]:
        for name in value:
            if not name.strip():
                raise ValueError("a dataset name must not be empty")
        return value

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        """Validate a document given as a mapping (parsed TOML or JSON).

        Raises:
            PolicyError: naming every offending key.
        """
        if not isinstance(data, Mapping):
            raise PolicyError([("", f"a policy must be a table, got {type(data).__name__}")])
        if "version" in data and data["version"] != SCHEMA_VERSION:
            found = data["version"]
            raise PolicyError(
                [("version", f"unsupported policy format {found!r}; this node reads 1")]
            )
        users = data.get("users")
        if isinstance(users, Mapping) and (problems := _user_key_problems(users)):
            raise PolicyError([(f"users.{key}", msg) for key, msg in problems])
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise from_validation_error(exc) from None

    def to_dict(self) -> dict[str, Any]:
        """The canonical form: JSON-ready, defaults written out, unset optional keys left out."""
        return self.model_dump(mode="json", exclude_none=True)

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no spaces; equal policies give equal text."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False)

    def content_hash(self) -> str:
        """SHA-256 of :meth:`to_json`, hex: identifies a revision's content."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def _user_key_problems(users: Mapping[Any, Any]) -> list[tuple[str, str]]:
    problems, seen = [], set()
    for key in users:
        email = str(key).strip().lower()
        if "@" not in email:
            problems.append((str(key), "not an email address"))
        elif email in seen:
            problems.append((str(key), "listed twice (emails are compared in lower case)"))
        seen.add(email)
    return problems


def load_policy(text: str) -> Policy:
    """Parse and validate a TOML policy document.

    Raises:
        PolicyError: on a TOML syntax error or an invalid document, naming the key.

    >>> load_policy('[publish]\\nmax_epsilon = 1.0').publish.max_epsilon
    1.0
    >>> load_policy('[publish]\\nmax_epsilonn = 1.0')
    Traceback (most recent call last):
    ...
    dpnode.policies._errors.PolicyError: invalid policy: publish.max_epsilonn: unknown key
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError([("", f"not valid TOML: {exc}")]) from None
    except RecursionError:
        raise PolicyError([("", "not valid TOML: nested too deeply")]) from None
    return Policy.from_dict(data)


def load_policy_file(path: str | Path) -> Policy:
    """Read, parse and validate a TOML policy file (UTF-8).

    Raises:
        PolicyError: as :func:`load_policy`.
        OSError: when the file cannot be read.
    """
    return load_policy(Path(path).read_text(encoding="utf-8"))


def default_policy() -> Policy:
    """The policy shipped as ``dpnode/policies/default.toml`` (no rule beyond the defaults)."""
    shipped = resources.files("dpnode.policies").joinpath("default.toml")
    return load_policy(shipped.read_text("utf-8"))

"""The node's budget policy: revisions stored in the database, the newest in force.

Applying a policy validates it with :mod:`policies` and appends a revision; nothing is ever
edited or deleted (triggers refuse it), so the revision that decided any past publish can be
read back. The publish transaction reads the revision in force each time, so a change takes
effect at the next publish without a restart. It reads only the newest revision's id and hash:
revisions are immutable, so the parsed policy is kept by both and the document is read and
parsed once per revision (tests/node/test_policy_cache.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, bindparam, func, select
from sqlalchemy.orm import Session

from dpnode import policies
from dpnode.core.errors import (
    BudgetExceededError,
    InvalidPolicyError,
    NotFoundError,
    PolicyRefusedError,
)
from dpnode.node.db.direct import connection_of
from dpnode.node.db.models import Dataset, PolicyRevision, User
from dpnode.node.services import audit

__all__ = [
    "NEWEST",
    "Applied",
    "InForce",
    "apply",
    "current",
    "get_revision",
    "history",
    "in_force",
    "parse",
    "refusal",
]


@dataclass(frozen=True)
class InForce:
    """The policy deciding publishes now, and the revision it was stored as."""

    policy: policies.Policy
    #: ``None``: no revision was ever applied; the built-in default (``policies/default.toml``).
    revision: int | None

    @property
    def label(self) -> str:
        """How refusals and the audit log name it: ``"'hospital' (revision 3)"``."""
        name = repr(self.policy.name) if self.policy.name else "(unnamed)"
        if self.revision is None:
            return f"{name} (the built-in default)"
        return f"{name} (revision {self.revision})"

    @property
    def name(self) -> str:
        return self.policy.name


#: The rules of a budget (a user's, a role's, the defaults, a dataset's cap): a refusal by one
#: of them is a budget exceeded, by any other rule a policy refusal.
_BUDGET_RULES = ("defaults.", "roles.", "users.", "datasets.")


def refusal(decision: policies.Decision, in_force: InForce) -> PolicyRefusedError:
    """The error that answers a release ``decision`` refused under the policy ``in_force``.

    Its detail names the reason, the policy revision and the rule; a refusal by a budget rule
    is a :class:`BudgetExceededError` (a subclass), any other a :class:`PolicyRefusedError`.
    """
    detail = f"{decision.reason} [policy {in_force.label}, rule {decision.rule}]"
    cls = BudgetExceededError if decision.rule.startswith(_BUDGET_RULES) else PolicyRefusedError
    return cls(
        detail,
        rule=decision.rule,
        policy=in_force.name,
        policy_revision=in_force.revision,
        reason=decision.reason,
    )


#: Parsed revisions by (id, content hash). Revisions are never edited (triggers refuse it), so
#: an entry never goes stale; the hash keeps two databases in one process (tests) apart.
_PARSED: dict[tuple[int, str], policies.Policy] = {}
_PARSED_MAX = 64

_REVISIONS = PolicyRevision.__table__
# Built once: every publish runs them.
_NEWEST = (
    select(_REVISIONS.c.id, _REVISIONS.c.content_hash).order_by(_REVISIONS.c.id.desc()).limit(1)
)
_DOCUMENT = select(_REVISIONS.c.document).where(_REVISIONS.c.id == bindparam("id"))


@lru_cache(maxsize=1)
def _builtin() -> policies.Policy:
    return policies.default_policy()


#: The newest revision's id and hash as two columns of a caller's own statement (NULLs: none),
#: for :func:`in_force` (the publish transaction reads them with the account it locks).
NEWEST = (
    _NEWEST.with_only_columns(_REVISIONS.c.id).scalar_subquery(),
    _NEWEST.with_only_columns(_REVISIONS.c.content_hash).scalar_subquery(),
)


def current(session: Session) -> InForce:
    """The policy in force: the newest revision, else the built-in default.

    Reads the newest revision's id in ``session``'s transaction (so the publish that calls
    it is decided by the revision in force at that instant) and its document only when that
    revision was not parsed before.
    """
    newest = session.connection().execute(_NEWEST).first()
    return in_force(session, None if newest is None else (newest[0], newest[1]))


def in_force(on: Session | Connection, newest: tuple[int | None, str | None] | None) -> InForce:
    """:func:`current`, from the newest revision's id and hash as the caller read them in
    ``on``'s transaction (:data:`NEWEST`; ``None`` or NULLs: no revision)."""
    if newest is None or newest[0] is None:
        return InForce(_builtin(), None)
    key = (int(newest[0]), str(newest[1]))
    policy = _PARSED.get(key)
    if policy is None:
        document = connection_of(on).execute(_DOCUMENT, {"id": key[0]}).scalar_one()
        policy = policies.Policy.from_dict(document)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()  # rare: 64 revisions applied while the node runs
        _PARSED[key] = policy
    return InForce(policy, key[0])


def parse(source: str | None = None, document: Any = None) -> policies.Policy:
    """A policy from TOML text or from a JSON-shaped document (exactly one of them).

    Raises:
        InvalidPolicyError: the document is malformed; the message names every bad key.
    """
    if (source is None) == (document is None):
        raise InvalidPolicyError(
            'send exactly one policy: TOML text ("toml") or the same shape as JSON ("document")'
        )
    try:
        if source is not None:
            return policies.load_policy(source)
        return policies.Policy.from_dict(document)
    except policies.PolicyError as exc:
        raise InvalidPolicyError(str(exc)) from None


@dataclass(frozen=True)
class Applied:
    revision: PolicyRevision
    #: False when the document equals the policy in force (nothing was stored).
    changed: bool
    #: Things worth knowing that did not stop the change, e.g. caps on datasets not uploaded yet.
    warnings: list[str]


def apply(
    session: Session,
    actor: User | None,
    policy: policies.Policy,
    *,
    reason: str,
    source: str = "",
    operator: str | None = None,
) -> Applied:
    """Store ``policy`` as a new revision in force from now on, and audit it; commits.

    Args:
        actor: the admin, or ``None`` for the node's operator on the command line.
        reason: why, for the audit log (required).
        source: the text as the admin wrote it, kept for reading.
        operator: who ran the command line, when ``actor`` is None.

    Raises:
        InvalidPolicyError: no reason, or the policy names users that do not exist.
    """
    if not reason.strip():
        raise InvalidPolicyError("say why the policy changes: a reason is required")
    unknown = _unknown_users(session, policy)
    if unknown:
        raise InvalidPolicyError(
            "invalid policy: users."
            + ", users.".join(unknown)
            + ": no such user on this node (create the account first)"
        )
    in_force = current(session)
    digest = policy.content_hash()
    if in_force.revision is not None and in_force.policy.content_hash() == digest:
        row = session.get(PolicyRevision, in_force.revision)
        assert row is not None
        return Applied(row, False, _warnings(session, policy))
    by = actor.email if actor is not None else f"command line ({operator or 'operator'})"
    row = PolicyRevision(
        created_by_id=actor.id if actor is not None else None,
        created_by=by,
        reason=reason.strip(),
        name=policy.name,
        content_hash=digest,
        document=policy.to_dict(),
        source=source,
    )
    session.add(row)
    session.flush()
    audit.record(
        session,
        actor,
        "policy.apply",
        target_type="policy",
        target_id=row.id,
        revision=row.id,
        previous_revision=in_force.revision,
        name=policy.name,
        content_hash=digest,
        reason=row.reason,
        **({"operator": operator} if actor is None else {}),
    )
    session.commit()
    return Applied(row, True, _warnings(session, policy))


def _unknown_users(session: Session, policy: policies.Policy) -> list[str]:
    if not policy.users:
        return []
    known = set(session.scalars(select(User.email).where(User.email.in_(list(policy.users)))))
    return sorted(set(policy.users) - known)


def _warnings(session: Session, policy: policies.Policy) -> list[str]:
    found = []
    if policy.datasets:
        names = list(policy.datasets)
        known = set(session.scalars(select(Dataset.name).where(Dataset.name.in_(names))))
        found += [
            f"datasets.{name}: no dataset of that name yet; the cap applies once one is uploaded"
            for name in sorted(set(policy.datasets) - known)
        ]
    return found


def history(session: Session, *, limit: int = 100) -> list[PolicyRevision]:
    """Revisions, newest first."""
    query = select(PolicyRevision).order_by(PolicyRevision.id.desc()).limit(limit)
    return list(session.scalars(query))


def get_revision(session: Session, revision: int) -> PolicyRevision:
    row = session.get(PolicyRevision, revision)
    if row is None:
        latest = session.scalar(select(func.max(PolicyRevision.id)))
        raise NotFoundError(
            f"no policy revision {revision}"
            + (f"; the newest is {latest}" if latest else "; no policy was applied yet")
        )
    return row

"""Accounts: creation, authentication and administration."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, NamedTuple

from argon2 import PasswordHasher
from sqlalchemy import bindparam, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from dpnode.core.errors import (
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)
from dpnode.node.db.models import Role, User
from dpnode.node.db.session import READ_ONLY
from dpnode.node.services import audit
from dpnode.node.services.security import (
    MIN_PASSWORD_LENGTH,
    dummy_hash,
    hash_password,
    verify_password,
)
from dpnode.node.services.throttle import LoginThrottle, refusal_error

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def normalise_email(email: str) -> str:
    """Lower-cased, stripped email, refused when it does not look like one.

    >>> normalise_email("  Ada@Example.org "), normalise_email("ＡＤＡ@example.org")
    ('ada@example.org', 'ada@example.org')
    """
    # fullwidth letters are their ASCII selves; an invisible character (a zero-width space)
    # would make another account that looks the same
    email = unicodedata.normalize("NFKC", email).strip().lower()
    invisible = any(unicodedata.category(ch) in ("Cc", "Cf") for ch in email)
    if len(email) > 320 or invisible or not _EMAIL.match(email):
        raise InvalidRequestError(f"{email!r} is not a valid email address")
    return email


def parse_role(role: str) -> Role:
    try:
        return Role(role)
    except ValueError:
        names = ", ".join(r.value for r in Role)
        raise InvalidRequestError(f"unknown role {role!r}; choose one of: {names}") from None


def _check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise InvalidRequestError(
            f"password too short: use at least {MIN_PASSWORD_LENGTH} characters"
        )


def _may_create(actor: User | None, role: Role) -> bool:
    if actor is None or actor.role is Role.ADMIN:  # None: the node operator, from the CLI
        return True
    # A data owner can onboard the data scientists who will analyse their data.
    return actor.role is Role.DATA_OWNER and role is Role.DATA_SCIENTIST


def create_user(
    session: Session,
    hasher: PasswordHasher,
    actor: User | None,
    *,
    email: str,
    password: str,
    role: str,
) -> User:
    """Create an active account.

    Raises:
        PermissionDeniedError: ``actor`` may not create accounts of this role.
        ConflictError: the email is taken.
        InvalidRequestError: bad email, role or password.
    """
    parsed_role = parse_role(role)
    if not _may_create(actor, parsed_role):
        raise PermissionDeniedError(
            f"a {actor.role.value if actor else 'caller'} cannot create {parsed_role.value} "
            "accounts; ask an admin"
        )
    email = normalise_email(email)
    _check_password(password)
    if session.scalar(select(User.id).where(User.email == email)) is not None:
        raise ConflictError(f"a user with email {email} already exists")
    user = User(email=email, password_hash=hash_password(hasher, password), role=parsed_role)
    session.add(user)
    try:
        session.flush()
    except IntegrityError:  # a concurrent request took the name after the check above
        session.rollback()
        raise ConflictError(f"a user with email {email} already exists") from None
    audit.record(
        session,
        actor,
        "user.create",
        target_type="user",
        target_id=user.id,
        email=email,
        role=parsed_role.value,
    )
    session.commit()
    return user


def authenticate(
    session: Session,
    hasher: PasswordHasher,
    email: str,
    password: str,
    *,
    throttle: LoginThrottle | None = None,
    address: str = "",
) -> User:
    """Return the active user with these credentials.

    With a ``throttle``, the attempt is admitted (or refused) for its email and the client
    ``address`` before the password is hashed.

    Raises:
        AuthenticationError: unknown email, wrong password or a deactivated account
            (one message for all three, so it does not reveal which emails exist).
        RateLimitedError: too many failed attempts for this email, or attempts from this
            address, lately (the same answer whether or not the account exists).
    """
    # A malformed email matches no account but still counts, under its own spelling.
    account = email.strip().lower()[:320]
    try:
        email = normalise_email(email)
    except InvalidRequestError:
        email = ""
    if throttle is not None:
        refusal = throttle.admit(account, address)
        if refusal is not None:
            if refusal.first:  # later refusals repeat it: the log is not an attacker's to fill
                audit.record(
                    session,
                    None,
                    "auth.login_throttled",
                    email=account,
                    address=address,
                    scope=refusal.scope,
                    retry_after=refusal.retry_after,
                )
                session.commit()
            raise refusal_error(refusal)
    user = session.scalar(select(User).where(User.email == email)) if email else None
    # End the read before hashing: on SQLite a transaction holds the write lock, and the
    # hash takes milliseconds of CPU that every other writer would wait through.
    session.commit()
    ok = verify_password(hasher, user.password_hash if user else dummy_hash(hasher), password)
    if user is None or not ok or not user.is_active:
        audit.record(session, None, "auth.login_failed", email=email)
        session.commit()
        raise AuthenticationError("wrong email or password, or the account is deactivated")
    if throttle is not None:
        throttle.succeeded(account)
    audit.record(session, user, "auth.login", target_type="user", target_id=user.id)
    session.commit()
    return user


#: Built once: every request with a token reads its account.
_BY_ID = select(User).where(User.id == bindparam("user_id"))
#: What a token whose account is gone is told.
GONE = "this account no longer exists or is deactivated"


def active(session: Session, user_id: int) -> User:
    """The account a valid token names, if it still exists and is active.

    Raises:
        AuthenticationError: no such account, or it was deactivated.
    """
    user = session.scalar(_BY_ID, {"user_id": user_id})
    if user is None or not user.is_active:
        raise AuthenticationError(GONE)
    return user


class Actor(NamedTuple):
    """Who sends a computation, as the computation needs it: a row, not an ORM object (a
    publish reads it on every request)."""

    id: int
    role: Role


#: What :func:`actor_of` reads of an account.
ACTOR = (User.id, User.role, User.is_active)
_ACTOR = select(*ACTOR).where(User.id == bindparam("user_id"))


def active_actor(session: Session, user_id: int) -> Actor:
    """:func:`active`'s check, read in one plain statement.

    Raises:
        AuthenticationError: no such account, or it was deactivated.
    """
    return actor_of(session.connection().execute(_ACTOR, {"user_id": user_id}).first())


def actor_of(row: Any) -> Actor:
    """:func:`active_actor`'s check on a row the caller read with the account's ``id``,
    ``role`` and ``is_active`` (``None``: no such account).

    Raises:
        AuthenticationError: no such account, or it was deactivated.
    """
    if row is None or not row.is_active:
        raise AuthenticationError(GONE)
    return Actor(row.id, row.role)


def caller(session: Session, user_id: int) -> User:
    """The caller a valid token names (see :func:`active`), with the read transaction ended.

    Only a read: on SQLite it takes no lock, so authenticated requests do not queue behind the
    writers, and it ends here, as a request may compute for a while (a publish) after
    authenticating; the account stays attached to ``session``.
    """
    session.connection(execution_options=READ_ONLY)
    user = active(session, user_id)
    session.commit()
    return user


def get_user(session: Session, user_id: int) -> User:
    user = session.get(User, user_id)
    if user is None:
        raise NotFoundError(f"no user with id {user_id}")
    return user


def list_users(session: Session) -> list[User]:
    return list(session.scalars(select(User).order_by(User.id)))


def count_admins(session: Session) -> int:
    query = select(func.count()).where(User.role == Role.ADMIN, User.is_active.is_(True))
    return session.scalar(query) or 0


def update_user(
    session: Session,
    hasher: PasswordHasher,
    actor: User | None,
    user_id: int,
    *,
    role: str | None = None,
    is_active: bool | None = None,
    password: str | None = None,
) -> User:
    """Change a user's role, active flag or password (admins only).

    Raises:
        ConflictError: the change would leave the node without an active admin.
    """
    user = get_user(session, user_id)
    was_active_admin = user.role is Role.ADMIN and user.is_active
    if was_active_admin:
        # Lock the active admins (PostgreSQL; SQLite transactions are serial already), so two
        # admins demoting each other at once cannot both count the other as still active.
        active_admins = select(User.id).where(User.role == Role.ADMIN, User.is_active.is_(True))
        session.execute(active_admins.order_by(User.id).with_for_update())
    changes: dict[str, object] = {}
    if role is not None:
        user.role = parse_role(role)
        changes["role"] = user.role.value
    if is_active is not None:
        user.is_active = is_active
        changes["is_active"] = is_active
    if password is not None:
        _check_password(password)
        user.password_hash = hash_password(hasher, password)
        changes["password"] = "changed"
    session.flush()
    if was_active_admin and count_admins(session) == 0:
        session.rollback()
        raise ConflictError("this change would leave the node without an active admin")
    audit.record(session, actor, "user.update", target_type="user", target_id=user.id, **changes)
    session.commit()
    return user

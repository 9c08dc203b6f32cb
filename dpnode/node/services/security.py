"""Password hashing (Argon2id, memory-hard) and signed, expiring access tokens."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

import jwt
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from node.errors import AuthenticationError
from node.settings import Settings

_ALGORITHM = "HS256"
MIN_PASSWORD_LENGTH = 8


def password_hasher(settings: Settings) -> PasswordHasher:
    return PasswordHasher(
        memory_cost=settings.argon2_memory_kib, time_cost=settings.argon2_time_cost, parallelism=1
    )


def hash_password(hasher: PasswordHasher, password: str) -> str:
    return hasher.hash(password)


def verify_password(hasher: PasswordHasher, password_hash: str, password: str) -> bool:
    """True when ``password`` matches; never raises on a wrong password."""
    try:
        return hasher.verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


@lru_cache(maxsize=4)  # a node holds one hasher; a few for tests' short-lived nodes
def dummy_hash(hasher: PasswordHasher) -> str:
    """A valid Argon2 hash (with ``hasher``'s cost) of a placeholder password.

    Verifying against it when the email is unknown makes a failed login take as long
    whether or not the account exists. It is made once per hasher: hashing it on every
    unknown email would make those attempts cost two hashes, and so tell them apart.
    """
    return hasher.hash("no-such-user-placeholder")


@dataclass(frozen=True)
class IssuedToken:
    token: str
    expires_at: datetime


def issue_token(settings: Settings, user_id: int, *, now: datetime | None = None) -> IssuedToken:
    """Sign a token for ``user_id`` that expires after the configured lifetime."""
    now = now or datetime.now(UTC)
    expires = now + timedelta(seconds=settings.token_lifetime_seconds)
    claims = {"sub": str(user_id), "iat": int(now.timestamp()), "exp": int(expires.timestamp())}
    token = jwt.encode(claims, settings.token_secret.get_secret_value(), algorithm=_ALGORITHM)
    return IssuedToken(token=token, expires_at=expires)


def read_token(settings: Settings, token: str) -> int:
    """Return the user id a valid token was issued to.

    Raises:
        AuthenticationError: the token is malformed, forged or expired.
    """
    try:
        claims = jwt.decode(
            token,
            settings.token_secret.get_secret_value(),
            algorithms=[_ALGORITHM],
            options={"require": ["sub", "exp", "iat"]},
        )
    except jwt.ExpiredSignatureError:
        raise AuthenticationError("your session token has expired; log in again") from None
    except jwt.InvalidTokenError as exc:
        raise AuthenticationError(f"invalid session token ({exc}); log in again") from None
    try:
        return int(claims["sub"])
    except (TypeError, ValueError):
        raise AuthenticationError("invalid session token; log in again") from None

"""Password hashing (Argon2id, memory-hard) and signed, expiring access tokens."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

import jwt
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from dpnode.core.errors import AuthenticationError
from dpnode.node.settings import Settings

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


def new_secret(prefix: str) -> str:
    """A random credential (256 bits, URL-safe) that says what it is by its ``prefix``.

    >>> token = new_secret("dpj_")
    >>> token.startswith("dpj_"), len(token)
    (True, 47)
    """
    return prefix + secrets.token_urlsafe(32)


def secret_digest(secret: str) -> str:
    """What is kept at rest of a credential :func:`new_secret` made: its sha256, in hex.

    A fast hash is enough here, unlike for a password: 256 random bits cannot be guessed from
    their digest, and a lookup by digest costs one index read.

    >>> secret_digest("dpj_x") == secret_digest("dpj_x") != secret_digest("dpj_y")
    True
    """
    return hashlib.sha256(secret.encode()).hexdigest()

from __future__ import annotations

from fastapi import APIRouter

from node.api.deps import (
    ClientAddress,
    CurrentUser,
    HasherDep,
    LoginThrottleDep,
    SessionDep,
    SettingsDep,
)
from node.api.schemas import LoginRequest, Token, UserPublic
from node.services import users
from node.services.security import issue_token

router = APIRouter(tags=["auth"])


@router.post("/auth/login")
def login(
    body: LoginRequest,
    session: SessionDep,
    hasher: HasherDep,
    settings: SettingsDep,
    throttle: LoginThrottleDep,
    address: ClientAddress,
) -> Token:
    """Exchange email and password for an access token that expires.

    Too many failed attempts for an email, or attempts from one address, are answered 429
    with ``Retry-After`` before any password is checked (see node.services.throttle).
    """
    user = users.authenticate(
        session, hasher, body.email, body.password, throttle=throttle, address=address
    )
    issued = issue_token(settings, user.id)
    return Token(access_token=issued.token, expires_at=issued.expires_at)


@router.get("/users/me")
def me(user: CurrentUser) -> UserPublic:
    """The account the token belongs to."""
    return UserPublic.model_validate(user)

from __future__ import annotations

from fastapi import APIRouter

from node.api.deps import CurrentUser, HasherDep, SessionDep, SettingsDep
from node.api.schemas import LoginRequest, Token, UserPublic
from node.services import users
from node.services.security import issue_token

router = APIRouter(tags=["auth"])


@router.post("/auth/login")
def login(
    body: LoginRequest, session: SessionDep, hasher: HasherDep, settings: SettingsDep
) -> Token:
    """Exchange email and password for an access token that expires."""
    user = users.authenticate(session, hasher, body.email, body.password)
    issued = issue_token(settings, user.id)
    return Token(access_token=issued.token, expires_at=issued.expires_at)


@router.get("/users/me")
def me(user: CurrentUser) -> UserPublic:
    """The account the token belongs to."""
    return UserPublic.model_validate(user)

from __future__ import annotations

from fastapi import APIRouter, status

from node.api.deps import AdminUser, CurrentUser, HasherDep, SessionDep
from node.api.schemas import UserCreate, UserPublic, UserUpdate
from node.db.models import Role
from node.errors import PermissionDeniedError
from node.services import users

router = APIRouter(prefix="/users", tags=["users"])


@router.get("")
def list_users(session: SessionDep, actor: CurrentUser) -> list[UserPublic]:
    """All accounts (admins and data owners)."""
    if actor.role is Role.DATA_SCIENTIST:
        raise PermissionDeniedError("data scientists cannot list users")
    return [UserPublic.model_validate(u) for u in users.list_users(session)]


@router.post("", status_code=status.HTTP_201_CREATED)
def create_user(
    body: UserCreate, session: SessionDep, hasher: HasherDep, actor: CurrentUser
) -> UserPublic:
    """Create an account: admins create any role, data owners create data scientists."""
    user = users.create_user(
        session, hasher, actor, email=body.email, password=body.password, role=body.role
    )
    return UserPublic.model_validate(user)


@router.patch("/{user_id}")
def update_user(
    user_id: int, body: UserUpdate, session: SessionDep, hasher: HasherDep, actor: AdminUser
) -> UserPublic:
    """Change a user's role, active flag or password (admins)."""
    user = users.update_user(
        session,
        hasher,
        actor,
        user_id,
        role=body.role,
        is_active=body.is_active,
        password=body.password,
    )
    return UserPublic.model_validate(user)

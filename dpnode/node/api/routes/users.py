from __future__ import annotations

from fastapi import APIRouter, status

from dpnode.core.errors import PermissionDeniedError
from dpnode.node.api.deps import AdminUser, CurrentUser, HasherDep, PathId, SessionDep
from dpnode.node.api.openapi import errors
from dpnode.node.api.schemas import UserCreate, UserPublic, UserUpdate
from dpnode.node.db.models import Role
from dpnode.node.services import users

router = APIRouter(prefix="/users", tags=["users"])


@router.get("", responses=errors(403))
def list_users(session: SessionDep, actor: CurrentUser) -> list[UserPublic]:
    """All accounts (admins and data owners)."""
    if actor.role is Role.DATA_SCIENTIST:
        raise PermissionDeniedError("data scientists cannot list users")
    return [UserPublic.model_validate(u) for u in users.list_users(session)]


@router.post("", status_code=status.HTTP_201_CREATED, responses=errors(403, 409))
def create_user(
    body: UserCreate, session: SessionDep, hasher: HasherDep, actor: CurrentUser
) -> UserPublic:
    """Create an account: admins create any role, data owners create data scientists."""
    user = users.create_user(
        session, hasher, actor, email=body.email, password=body.password, role=body.role
    )
    return UserPublic.model_validate(user)


@router.patch("/{user_id}", responses=errors(404, 409))
def update_user(
    user_id: PathId, body: UserUpdate, session: SessionDep, hasher: HasherDep, actor: AdminUser
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

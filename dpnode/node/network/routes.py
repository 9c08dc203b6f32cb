"""The network role's API, under ``/api/v1/network`` (mounted by ``dpnode serve --network``).

Three kinds of caller: the network's admin (an account of the network's own, logged in as on
any node), member nodes (their member credential as a bearer token), and anyone searching
(the directory lists public catalogs only, the same metadata each node shows to its users).
Anyone's requests are limited per client address (``network_search_*`` settings); the
admin's and the members' are not, so a busy search never holds a heartbeat back.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ValidationError

from dpnode.core.errors import AuthenticationError, InvalidRequestError
from dpnode.node.api.deps import (
    AdminUser,
    CatalogBody,
    ClientAddress,
    ContextDep,
    Credentials,
    PathId,
    ReadSessionDep,
    SessionDep,
    SettingsDep,
    item_ref,
)
from dpnode.node.api.openapi import errors
from dpnode.node.db.models import NetworkMember
from dpnode.node.network import directory
from dpnode.node.network.schemas import (
    Catalog,
    CatalogDataset,
    Heartbeat,
    HeartbeatAnswer,
    JoinAnswer,
    JoinRequest,
    JoinTokenCreate,
    JoinTokenIssued,
    JoinTokenPublic,
    Listing,
    MemberPublic,
    NetworkSearchResults,
    NodePublic,
)

router = APIRouter(prefix="/network", tags=["network"])


def _json_body(name: str, description: str) -> dict[str, Any]:
    """The ``openapi_extra=`` of a route that reads its JSON body itself (to bound its size
    before parsing it)."""
    schema = {"$ref": f"#/components/schemas/{name}"}
    content = {"application/json": {"schema": schema}}
    return {"requestBody": {"required": True, "description": description, "content": content}}


M = TypeVar("M", bound=BaseModel)


def _read(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        where = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()[:5]
        )
        raise InvalidRequestError(f"invalid {model.__name__}: {where}") from None


def get_member(session: SessionDep, credentials: Credentials) -> NetworkMember:
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise AuthenticationError(
            "send this node's member credential: 'Authorization: Bearer dpm_...'"
        )
    return directory.member_of(session, credentials.credentials)


CurrentMember = Annotated[NetworkMember, Depends(get_member)]


async def limit_public(context: ContextDep, address: ClientAddress) -> None:
    """Count a request to a public route against its address's limit (429 beyond it),
    before any database work."""
    context.network_searches.admit(address)


#: The first dependency of every route anyone may call without a login.
LIMITED = [Depends(limit_public)]


# -- the network's admin ------------------------------------------------------------------


@router.post("/tokens", status_code=201)
def create_join_token(
    session: SessionDep, settings: SettingsDep, admin: AdminUser, body: JoinTokenCreate
) -> JoinTokenIssued:
    """Issue a join token for one node (shown once; the network keeps its digest)."""
    row, token = directory.issue_token(session, settings, admin, body.note)
    return JoinTokenIssued(**JoinTokenPublic.model_validate(row).model_dump(), token=token)


@router.get("/tokens")
def list_join_tokens(session: SessionDep, _admin: AdminUser) -> list[JoinTokenPublic]:
    """Every join token, newest first (never the token itself)."""
    return [JoinTokenPublic.model_validate(t) for t in directory.list_tokens(session)]


@router.delete("/tokens/{token_id}", status_code=204, responses=errors(404))
def revoke_join_token(session: SessionDep, admin: AdminUser, token_id: PathId) -> Response:
    """Revoke a join token (members that joined with it stay)."""
    directory.revoke_token(session, admin, token_id)
    return Response(status_code=204)


@router.get("/members")
def list_members(
    session: SessionDep, settings: SettingsDep, _admin: AdminUser
) -> list[MemberPublic]:
    """Every member, reachable or not."""
    return [MemberPublic(**s.public()) for s in directory.members(session, settings)]


@router.delete("/members/{ref}", status_code=204, responses=errors(404))
def remove_member(session: SessionDep, admin: AdminUser, ref: str) -> Response:
    """Remove a member (by id or name): its catalog goes, its credential stops working."""
    directory.remove_member(session, admin, item_ref(ref))
    return Response(status_code=204)


# -- member nodes -------------------------------------------------------------------------


@router.post(
    "/join",
    status_code=201,
    responses=errors(401, 409),
    openapi_extra=_json_body("JoinRequest", "a join token, the node's name and URL, its catalog"),
)
def join(session: SessionDep, settings: SettingsDep, body: CatalogBody) -> JoinAnswer:
    """Join with a token: answers the member credential the node presents from now on."""
    member, credential = directory.join(session, settings, _read(JoinRequest, body))
    return JoinAnswer(
        member_id=member.id,
        name=member.name,
        credential=credential,
        unreachable_after_seconds=settings.network_unreachable_after_seconds,
    )


@router.post("/heartbeat", responses=errors(401))
def heartbeat(session: SessionDep, member: CurrentMember, body: Heartbeat) -> HeartbeatAnswer:
    """A member is alive; answers the digest of the catalog held for it (the member pushes
    its catalog when its own differs)."""
    del body  # the member compares the digests; the network needs only the sign of life
    return HeartbeatAnswer(catalog_digest=directory.heartbeat(session, member))


@router.put(
    "/catalog",
    responses=errors(401),
    openapi_extra=_json_body("Catalog", "the member's public catalog"),
)
def push_catalog(
    session: SessionDep, settings: SettingsDep, member: CurrentMember, body: CatalogBody
) -> HeartbeatAnswer:
    """Replace the member's public catalog (refused whole when any part is invalid)."""
    digest = directory.push_catalog(session, settings, member, _read(Catalog, body))
    return HeartbeatAnswer(catalog_digest=digest)


@router.delete("/membership", status_code=204, responses=errors(401))
def leave(session: SessionDep, member: CurrentMember) -> Response:
    """The member leaves the network: its entry and catalog are deleted."""
    directory.leave(session, member)
    return Response(status_code=204)


# -- anyone -------------------------------------------------------------------------------


@router.get("/nodes", dependencies=LIMITED, responses=errors(429))
def list_nodes(session: ReadSessionDep, settings: SettingsDep) -> list[NodePublic]:
    """The members, where they are and whether they answer (no login needed)."""
    states = directory.members(session, settings)
    return [NodePublic(**{k: s.public()[k] for k in NodePublic.model_fields}) for s in states]


@router.get("/search", dependencies=LIMITED, responses=errors(429))
def search(
    session: ReadSessionDep,
    settings: SettingsDep,
    tags: Annotated[list[str], Query()] = [],  # noqa: B006  (FastAPI copies defaults)
    text: str | None = None,
) -> NetworkSearchResults:
    """Datasets of reachable members carrying all of ``tags`` and matching ``text``, each
    with its node (no login needed: public catalogs only)."""
    found = directory.search(session, settings, tags, text)
    return NetworkSearchResults(
        datasets=[
            Listing(
                node=m.name, node_url=m.url, dataset=CatalogDataset.model_validate(d, strict=False)
            )
            for m, d in found
        ]
    )


def openapi_components() -> dict[str, Any]:
    """The schemas the routes reading their own bodies refer to."""
    out: dict[str, Any] = {}
    for model in (JoinRequest, Catalog):
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


__all__ = ["openapi_components", "router"]

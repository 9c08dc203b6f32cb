"""The admin's network page: on a node, the networks it joined and how its last heartbeat
went; on a network, its members and whether they answer."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from dpnode.node.api.deps import SessionDep, SettingsDep
from dpnode.node.console.render import ConsoleRoute, page
from dpnode.node.console.session import ConsoleAdmin
from dpnode.node.network import directory, membership

router = APIRouter(route_class=ConsoleRoute, include_in_schema=False)


@router.get("/network")
def network_page(
    request: Request, session: SessionDep, settings: SettingsDep, _admin: ConsoleAdmin
) -> Response:
    if settings.role == "network":
        return page(
            request,
            "network.html",
            title="Network members",
            members=directory.members(session, settings),
            unreachable_after=settings.network_unreachable_after_seconds,
        )
    return page(
        request,
        "network.html",
        title="Network membership",
        memberships=membership.memberships(session),
        heartbeat=settings.network_heartbeat_seconds,
    )

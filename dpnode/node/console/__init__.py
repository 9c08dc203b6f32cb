"""The admin console: server-rendered pages over the same route functions as the API.

Every page calls the API's own route functions (``dpnode.node.api.routes``), which call the services
and build the public views, so a page shows what the API shows to that role and refuses what
the API refuses. The console adds only what a browser needs: a session cookie holding the same
expiring token the API issues, a CSRF token in every form, HTML rendering (Jinja2,
autoescaped) and charts drawn as inline SVG on the node. No script, no CDN.
"""

from __future__ import annotations

from fastapi import APIRouter

from dpnode.node.console import pages

#: The console under ``/console`` and, at the node's root, a page that leads to it.
router = APIRouter()
router.include_router(pages.front)
router.include_router(pages.router)

__all__ = ["router"]

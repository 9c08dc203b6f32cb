"""``/docs`` (Swagger UI) and ``/redoc`` served from the node itself, for air-gapped nodes.

FastAPI's pages load their scripts from a CDN, so they are blank where a node has no
internet. The scripts come from the ``fastapi-offline`` package, which ships Swagger UI
(Apache-2.0) and ReDoc (MIT) as files; the node serves them under :data:`ASSETS_URL`.
Both pages are sent with a Content-Security-Policy that lets them load from the node alone:
ReDoc's script still points its "API docs by Redocly" logo at ``cdn.redoc.ly``, and the
browser never asks for it.
"""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"

_INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def node_only(page: HTMLResponse) -> HTMLResponse:
    """``page`` with a Content-Security-Policy that lets it load scripts, styles, images and
    data from the node alone; its inline scripts are allowed by their hashes.

    >>> policy = node_only(HTMLResponse("<script>go()</script>")).headers["Content-Security-Policy"]
    >>> policy.startswith("default-src 'self'; script-src 'self' 'sha256-5KYv+PUboo5h")
    True
    """
    html = bytes(page.body).decode()
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"
        for script in _INLINE_SCRIPT.findall(html)
    )
    page.headers["Content-Security-Policy"] = (
        f"default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    )
    return page


def install(app: FastAPI) -> None:
    """Add ``/docs``, ``/redoc`` and their assets to ``app`` (made with ``docs_url=None``
    and ``redoc_url=None``), outside the OpenAPI document."""
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    def assets(request: Request) -> str:
        return root(request) + ASSETS_URL

    def openapi_url(request: Request) -> str:
        return root(request) + (app.openapi_url or "/openapi.json")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return node_only(
            get_swagger_ui_html(
                openapi_url=openapi_url(request),
                title=f"{app.title} - API",
                swagger_js_url=f"{assets(request)}/swagger-ui-bundle.js",
                swagger_css_url=f"{assets(request)}/swagger-ui.css",
                swagger_favicon_url=f"{assets(request)}/favicon.png",
                oauth2_redirect_url=root(request) + OAUTH2_REDIRECT_URL,
                # no badge from the public online validator
                swagger_ui_parameters={"validatorUrl": None},
            )
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return node_only(
            get_redoc_html(
                openapi_url=openapi_url(request),
                title=f"{app.title} - API",
                redoc_js_url=f"{assets(request)}/redoc.standalone.js",
                redoc_favicon_url=f"{assets(request)}/favicon.png",
                with_google_fonts=False,
            )
        )

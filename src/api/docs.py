"""The API's browsable documentation, served entirely by the node itself (works offline).

``/docs`` is Swagger UI and ``/redoc`` is ReDoc, both reading the app's ``/openapi.json``.
Their JavaScript, CSS and icon come from the ``fastapi-offline`` package's static files,
mounted under ``/docs/static/`` — never from a CDN: every URL the pages load is on the node.
ReDoc's bundle draws its maker's logo from a CDN: it is served at ``/docs/redoc.standalone.js``
with that image's address replaced by an empty ``data:`` one (ReDoc then leaves the logo out).
None of these routes is in the OpenAPI document.

Both pages are sent with ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and a
Content-Security-Policy allowing only what they load: scripts from the node plus the page's
own inline start-up script (by its SHA-256 hash, computed per answer), styles from the node
and inline (both UIs inject theirs), images from the node and ``data:``, ReDoc's web worker
from ``blob:``, ``/openapi.json`` from the node; never framed.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

__all__ = ["DOCS_URL", "REDOC_JS_URL", "REDOC_URL", "STATIC_URL", "install_docs", "redoc_js"]

DOCS_URL = "/docs"
REDOC_URL = "/redoc"
STATIC_URL = "/docs/static"
REDOC_JS_URL = "/docs/redoc.standalone.js"
# the one address ReDoc's bundle would load from outside the node (its maker's logo)
_REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
# the package shipping Swagger UI's and ReDoc's built files, and the folder they are in
_ASSETS = ("fastapi_offline", "static")


_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.S)


def _guarded(page: HTMLResponse) -> HTMLResponse:
    """``page`` with its framing, sniffing and content-security headers."""
    sources = " ".join(["'self'", *(
        "'sha256-" + base64.b64encode(hashlib.sha256(m.group(1)).digest()).decode() + "'"
        for m in _INLINE_SCRIPT.finditer(bytes(page.body)))])
    page.headers.update({
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Content-Security-Policy": (
            f"default-src 'self'; script-src {sources}; "
            "style-src 'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self' blob:; "
            "connect-src 'self'; frame-ancestors 'none'; form-action 'self'; "
            "base-uri 'none'; object-src 'none'"),
    })
    return page


@cache
def redoc_js() -> bytes:
    """ReDoc's bundle, its CDN logo replaced by an empty image (never fetched)."""
    bundle = (files(_ASSETS[0]) / _ASSETS[1] / "redoc.standalone.js").read_bytes()
    return bundle.replace(_REDOC_CDN_LOGO, b"data:,")


def install_docs(app: FastAPI) -> None:
    """Add ``/docs``, ``/redoc`` and their assets to ``app`` (created with ``docs_url=None,
    redoc_url=None``)."""
    app.mount(STATIC_URL, StaticFiles(packages=[_ASSETS]), name="docs-static")

    def urls(request: Request) -> tuple[str, str]:
        root = request.scope.get("root_path", "")
        return f"{root}{app.openapi_url}", f"{root}{STATIC_URL}"

    async def swagger_ui(request: Request) -> HTMLResponse:
        openapi, static = urls(request)
        return _guarded(get_swagger_ui_html(
            openapi_url=openapi, title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{static}/swagger-ui-bundle.js",
            swagger_css_url=f"{static}/swagger-ui.css",
            swagger_favicon_url=f"{static}/favicon.png",
            # no validator badge: it would be an image from swagger.io
            swagger_ui_parameters={"validatorUrl": None}))

    async def redoc(request: Request) -> HTMLResponse:
        openapi, static = urls(request)
        return _guarded(get_redoc_html(
            openapi_url=openapi, title=f"{app.title} - ReDoc",
            redoc_js_url=f"{request.scope.get('root_path', '')}{REDOC_JS_URL}",
            redoc_favicon_url=f"{static}/favicon.png", with_google_fonts=False))

    async def redoc_bundle() -> Response:
        return Response(redoc_js(), media_type="text/javascript; charset=utf-8",
                        headers={"X-Content-Type-Options": "nosniff"})

    app.add_api_route(DOCS_URL, swagger_ui, methods=["GET"], include_in_schema=False)
    app.add_api_route(REDOC_JS_URL, redoc_bundle, methods=["GET"], include_in_schema=False)
    app.add_api_route(REDOC_URL, redoc, methods=["GET"], include_in_schema=False)

"""``/docs`` (Swagger UI) and ``/redoc`` load everything from the node itself: no CDN, so they
work offline. The app runs in-process (ASGI); the pages' assets are fetched from it."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from chronolog.api.app import create_app, openapi_document
from chronolog.tenants import Tenants

BASE = "http://node.test"


class _Assets(HTMLParser):
    """Every URL a page loads: ``<script src>``, ``<link href>``, ``<img src>``."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str]] = []  # (tag, url)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        url = a.get("src") if tag in ("script", "img") else a.get("href") if tag == "link" else None
        if url:
            self.urls.append((tag, url))


async def _page_and_assets(path: str) -> tuple[str, dict[str, httpx.Response]]:
    app = create_app(None, None, Tenants())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
        page = await http.get(path)
        assert page.status_code == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        parser = _Assets()
        parser.feed(page.text)
        assert parser.urls, "the page loads nothing"
        fetched = {}
        for _, url in parser.urls:
            absolute = urljoin(BASE + path, url)
            assert urlsplit(absolute).netloc == urlsplit(BASE).netloc, f"{url} is not on the node"
            fetched[url] = await http.get(absolute)
        spec = await http.get("/openapi.json")
        assert spec.status_code == 200
    return page.text, fetched


@pytest.mark.parametrize("path, script", [("/docs", "swagger-ui-bundle.js"),
                                          ("/redoc", "redoc.standalone.js")])
async def test_docs_pages_load_only_assets_served_by_the_node(path: str, script: str) -> None:
    html, fetched = await _page_and_assets(path)
    assert "://" not in html, "an absolute URL (a CDN, web fonts) in the page"
    assert any(url.endswith(script) for url in fetched), fetched.keys()
    for url, r in fetched.items():
        assert r.status_code == 200, url
        kind = r.headers["content-type"]
        if url.endswith(".js"):
            assert kind.startswith(("text/javascript", "application/javascript")), (url, kind)
            assert len(r.content) > 100_000, url  # the real bundle, not an error page
        elif url.endswith(".css"):
            assert kind.startswith("text/css"), (url, kind)
        else:  # the favicon
            assert kind.startswith("image/"), (url, kind)
    if path == "/docs":
        assert any(url.endswith(".css") for url in fetched)
        assert "/openapi.json" in html


# an image's or a script's address in a bundle (``src:"https://..."``); a link's is not fetched
_FETCHED_FROM = re.compile(rb"""\bsrc\s*[:=]\s*["'](https?://[^"']+)""")


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
async def test_the_docs_scripts_fetch_nothing_from_outside_the_node(path: str) -> None:
    _, fetched = await _page_and_assets(path)
    for url, r in fetched.items():
        if url.endswith(".js"):
            outside = _FETCHED_FROM.findall(r.content)
            assert outside == [], (url, outside[:5])  # no image, script or style from elsewhere
            assert b"cdn." not in r.content, url


async def test_a_missing_asset_is_404_and_the_docs_are_not_in_the_openapi_document() -> None:
    app = create_app(None, None, Tenants())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as http:
        r = await http.get("/docs/static/nothing-here.js")
        assert r.status_code == 404
    paths = openapi_document()["paths"]
    assert not [p for p in paths if p.startswith(("/docs", "/redoc"))]

"""The web dashboard: server-rendered pages (Jinja2) on the node's own HTTP server.

``install_dashboard(app)`` adds it to the API app (``chronolog.api.app.create_app``), so
``chronolog api`` and ``chronolog dev`` both serve it: ``/`` redirects to ``/ui/``, the
pages and their form actions live under ``/ui/`` (``routes``), the session and CSRF
protection in ``session``, the rule-in-words texts in ``words``; the templates and static
files (a little CSS, a little JavaScript, and htmx, vendored) are package data under
``templates/`` and ``static/``: nothing is built and nothing is fetched at install or run
time. None of these routes is in the OpenAPI document.

Pages: Schedules (``/ui/``), a schedule (``/ui/schedules/{id}``), a run (``/ui/runs/{id}``),
Attention (``/ui/attention``) and Health (``/ui/health``). Live updates: each page polls
``/ui/watermark`` (the projection's watermark) every two seconds and, when it moved,
re-reads its live parts (htmx).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from chronolog.api.dashboard.routes import HOME, PREFIX, router

__all__ = ["FORM_PATHS", "HOME", "PREFIX", "install_dashboard"]

STATIC = Path(__file__).parent / "static"
# the paths whose POST bodies are HTML forms (application/x-www-form-urlencoded)
FORM_PATHS = (f"{PREFIX}/",)


def install_dashboard(app: FastAPI) -> list[object]:
    """Add the dashboard to ``app``; its routes (the API's 405 answers leave them out)."""
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC), name="dashboard-static")
    app.include_router(router)
    return list(router.routes)

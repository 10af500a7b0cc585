"""The estimator's dashboard: one HTML page at ``/`` that draws the service's own JSON API.

The page (``static/index.html``), its script and its style sheet ship inside
this package and are served by the estimator itself, so the dashboard works
with no internet and no build step. The script reads ``/v1/metrics``,
``/v1/estimates``, ``/v1/estimates/{metric}`` and ``/v1/freshness`` and draws
SVG in the browser: every number on the page is one the API answered (the
page formats it; each cell keeps the API's value in ``data-value``), and the
CSV download is written from the same values. What each element means:
``docs/DASHBOARD.md``.
"""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["ASSETS", "add_dashboard", "asset"]

#: file name -> media type of everything the page loads (a fixed list: nothing else is served)
ASSETS: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}


def asset(name: str) -> bytes:
    """The bytes of one of :data:`ASSETS` (``KeyError`` for any other name)."""
    if name not in ASSETS:
        raise KeyError(name)
    return files(__package__).joinpath("static", name).read_bytes()


def add_dashboard(app: FastAPI) -> None:
    """Serve the page at ``/`` and its files under ``/dashboard/`` on a FastAPI ``app``."""
    from fastapi import HTTPException
    from fastapi.responses import Response

    def send(name: str) -> Response:
        # no-cache: the page and its script change with the installed version, never under one URL for long
        return Response(asset(name), media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})

    @app.get("/", include_in_schema=False)
    def dashboard_page() -> Response:
        return send("index.html")

    @app.get("/dashboard/{name}", include_in_schema=False)
    def dashboard_asset(name: str) -> Response:
        if name not in ASSETS or name == "index.html":
            raise HTTPException(404, f"no dashboard file {name!r}")
        return send(name)

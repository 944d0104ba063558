"""The Dash app on the FastAPI app: shell, URL routing to the three pages, their callbacks."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from dash import Dash, Input, Output, State, no_update

# The FastAPI backend's request context: Dash's index() reads the request through it.
from dash.backends._fastapi import get_current_request, reset_current_request, set_current_request
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from dashboard.data import KeelApi, in_process_client
from dashboard.layout import empty_state, shell
from dashboard.views import charts, compare, details, run, runs

__all__ = ["mount", "build_dash", "route", "PAGE_PATHS", "LIVE_PARTS"]

ASSETS = Path(__file__).parent / "assets"

LIVE_PARTS = ("math", "charts", "overlay", "scheduler", "tally", "socket", "start")
"""The live updater's scripts (assets/live/<part>.js) in the order the page loads them:
each part uses the ones before it. Dash loads the rest of assets/ by itself, sorted by name."""

PAGE_PATHS = ("/", "/compare", "/runs/{run_id}")
"""Paths that serve the dashboard's page."""


def route(pathname: str | None, search: str | None) -> Any:
    path = (pathname or "/").rstrip("/") or "/"
    if path == "/":
        return runs.layout()
    if path == "/compare":
        return compare.layout(compare.parse_runs(search))
    if path.startswith("/runs/") and path.count("/") == 2:
        return run.layout(path.split("/")[2], details.parse_step(search))
    return empty_state("Page not found", f"Nothing at {pathname}.")


def first_layout() -> Any:
    """The layout Dash sends a page when it starts (`/_dash-layout`, once per page load): the
    shell with the page of the URL that asked already built, so its charts ask for their data
    at once instead of after a round trip to the router. The URL is the request's Referer (the
    page that fetched its layout); without one from this server (a stricter referrer policy, a
    proxy that drops it), the shell alone, and the router builds the page as on navigation."""
    try:
        request = get_current_request()
    except RuntimeError:  # Dash checking its layout at start, outside any request
        return shell()
    referer = urlsplit(request.headers.get("referer", ""))
    if not referer.path or referer.netloc != request.url.netloc:
        return shell()
    search = f"?{referer.query}" if referer.query else ""
    return shell(route(referer.path, search), referer.path + search)


def live_scripts() -> list[dict[str, str]]:
    """The live updater's <script> sources, in LIVE_PARTS' order, each with its file's
    modification time as the query (as Dash marks its own assets, so an edit is refetched)."""
    sources = []
    for part in LIVE_PARTS:
        modified = (ASSETS / "live" / f"{part}.js").stat().st_mtime
        sources.append({"src": f"/assets/live/{part}.js?m={modified}"})
    return sources


PLOTLY_BUNDLE = "_dash-component-suites/plotly/package_data/plotly.min.js"
"""Where Dash serves plotly.js from (dcc.Graph asks for it when the first chart mounts)."""
PRELOAD = "head/preload.js"
"""The script in every page's head that preloads PLOTLY_BUNDLE on the pages that draw charts
(assets/head/, which Dash does not load by itself: it must run before Dash's scripts)."""


def build_dash(server: FastAPI, api: KeelApi) -> Dash:
    """A Dash app living on `server`, reading through `api`."""
    dash_app = Dash(
        "dashboard",
        server=cast(Any, server),  # Dash's hint predates its FastAPI backend
        title="Keel",
        update_title="",
        assets_folder=str(ASSETS),
        assets_path_ignore=["^live$", "^head$"],  # live: loaded in LIVE_PARTS' order instead, below; head: in the head
        external_scripts=live_scripts(),
        suppress_callback_exceptions=True,
        compress=False,
        meta_tags=[{"name": "viewport", "content": "width=device-width, initial-scale=1"}],
    )
    prefix = dash_app.config.requests_pathname_prefix
    modified = (ASSETS / PRELOAD).stat().st_mtime
    head_script = f'<script async src="{prefix}assets/{PRELOAD}?m={modified}" data-bundle="{prefix}{PLOTLY_BUNDLE}"></script>'
    dash_app.index_string = dash_app.index_string.replace("{%css%}", "{%css%}\n        " + head_script)
    dash_app.layout = first_layout

    @dash_app.callback(
        Output("page", "children"),
        Output("page-built-for", "data"),
        Input("url", "pathname"),
        Input("url", "search"),
        State("page-built-for", "data"),
    )
    def page(pathname: str | None, search: str | None, built_for: str | None) -> Any:
        if f"{pathname or ''}{search or ''}" == built_for:
            return no_update, None  # the first layout holds this URL's page already
        return route(pathname, search), None

    charts.register(dash_app, api)
    compare.register(dash_app, api)
    details.register(dash_app, api)
    run.register(dash_app, api)
    runs.register(dash_app, api)
    return dash_app


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class _ApiFallback:
    """ASGI app behind `/api/{path}`: answers as the API would have without Dash's catch-all.

    A known API path with the wrong method is a 405 whose Allow lists every method of the
    path (one route each: GET /rules and POST /rules are two routes, so no single route
    can say); anything else is FastAPI's JSON 404 rather than the dashboard's HTML.
    """

    def __init__(self, app: FastAPI):
        self.app = app

    def _allowed(self, scope: Scope) -> list[str]:
        allowed = []
        for method in _METHODS:
            probe = {**scope, "method": method}
            for candidate in self.app.router.routes:
                if getattr(candidate, "path", "").endswith("{path:path}"):
                    continue  # this fallback and Dash's catch-all
                if candidate.matches(probe)[0] is Match.FULL:
                    allowed.append(method)
                    break
        return allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        allowed = self._allowed(scope)
        if allowed:
            response = JSONResponse({"detail": "Method Not Allowed"}, status_code=405, headers={"Allow": ", ".join(allowed)})
        else:
            response = JSONResponse({"detail": "Not Found"}, status_code=404)
        await response(scope, receive, send)


def mount(app: FastAPI, *, internal_token: str | None = None) -> Dash:
    """Build the dashboard on `app`; call after the API routes are included."""
    dash_app = build_dash(app, KeelApi(in_process_client(app, internal_token)))

    async def page(request: Request) -> HTMLResponse:
        token = set_current_request(request)
        try:
            # Dash sets itself up (scans assets, freezes callbacks) on its first request to
            # "/" or "/_dash-*"; a first visit straight to /compare must not skip that.
            dash_app._setup_server()
            return HTMLResponse(dash_app.index())
        finally:
            reset_current_request(token)

    for path in PAGE_PATHS:
        if path != "/":  # Dash serves "/" itself
            app.add_api_route(path, page, methods=["GET"], include_in_schema=False)

    # Dash's GET catch-all answers any unknown path with the page; API clients must
    # keep getting the API's own answers (JSON 404, 405) instead.
    app.router.routes.append(
        Route(
            "/api/{path:path}",
            _ApiFallback(app),
            methods=list(_METHODS),
            include_in_schema=False,
        )
    )
    return dash_app

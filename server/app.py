"""The application factory: one process serves ingest, REST, live push and the dashboard."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse, RedirectResponse, Response
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from dashboard import mount_dashboard
from server import compression
from server.auth import FailedAuthLimit, allowed, presented_token
from server.bodies import BodyLimit
from server.components import running
from server.config import Settings
from server.deps import get_components
from server.errors import NotFound
from server.origins import OriginGuard, SecurityHeaders, SitePolicy
from server.ratelimit import client_key
from server.routes import alerts as alert_routes
from server.routes import api_tokens as token_routes
from server.routes import backtest as backtest_routes
from server.routes import health, login, runs, streams
from server.routes import run_commands as command_routes
from server.schemas import errors
from server.serving import BodyDeadline

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/login", "/logout", "/docs", "/docs/oauth2-redirect", "/openapi.json"})
"""Pages served without the login cookie: these paths exactly, and everything under /api/
(API routes answer 401 themselves)."""
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def is_open_path(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith("/api/")


class LoginRequired:
    """ASGI middleware: with auth on, a page request without a read credential (the login
    cookie, a bearer token) is sent to the login form (303); open paths pass, and API routes
    answer 401 themselves. Plain ASGI rather than Starlette's `@app.middleware("http")`,
    which runs the rest of every request in a task of its own and copies its response."""

    def __init__(self, app: ASGIApp, *, auth_enabled: bool):
        self.app = app
        self.auth_enabled = auth_enabled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.auth_enabled and scope["type"] == "http" and not is_open_path(scope["path"]):
            if not await allowed(HTTPConnection(scope), "read"):
                await RedirectResponse("/login", status_code=303)(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def limit_writes(conn: HTTPConnection) -> None:
    """REST writes count against the client's request bucket (server/ratelimit.py); their
    bodies are charged to its byte bucket as they are read (server/bodies.py)."""
    if conn.scope["type"] != "http" or conn.scope["method"] not in WRITE_METHODS:
        return
    components = get_components(conn)
    client = client_key(conn, components.settings.auth_enabled, presented_token(conn))
    reservation = components.rate_limits.requests.reserve(client, 1)
    if not reservation.granted:
        retry_after = reservation.retry_after_s
        raise HTTPException(429, f"rate limit exceeded; retry in {retry_after} s", headers={"Retry-After": str(retry_after)})


async def not_found(conn: HTTPConnection, exc: Exception) -> Response:
    """Every route's 404: what the domain raised (`NotFound`: no such run, rule, alert,
    silence or webhook), its message as the body's `detail`, as FastAPI answers an
    HTTPException. A websocket's is left to its route, as before."""
    if conn.scope["type"] != "http":
        raise exc
    return JSONResponse({"detail": str(exc)}, status_code=404)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    internal_token = secrets.token_urlsafe(32)
    site_policy = SitePolicy.from_settings(settings)  # before anything is built: a bad origin fails here

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running(settings, internal_token) as components:
            app.state.components = components  # what server.deps hands to every route
            yield

    app = FastAPI(
        title="Keel",
        summary="Live stability monitoring for off-policy RL training",
        version="0.1.0",
        lifespan=lifespan,
        exception_handlers={NotFound: not_found},
    )

    api = APIRouter(prefix="/api/v1", dependencies=[Depends(limit_writes)], responses=errors(400))  # 400: the server could not read the request
    api.include_router(runs.router)
    api.include_router(streams.router)
    api.include_router(alert_routes.router)
    api.include_router(backtest_routes.router)
    api.include_router(command_routes.router)
    api.include_router(token_routes.router)
    app.include_router(api)
    app.include_router(health.router)

    app.include_router(login.router)

    # Inside the login middleware below (added later, so outermost): a body timeout is
    # answered here, as the response the login middleware passes on.
    app.add_middleware(BodyDeadline, timeout_s=settings.http_body_timeout_s)

    # API routes answer 401 themselves; pages send the browser to the login form.
    app.add_middleware(LoginRequired, auth_enabled=settings.auth_enabled)

    mount_dashboard(app, internal_token=internal_token)
    # gzip for browsers and API clients that accept it; Dash's immutable files compressed once.
    app.add_middleware(GZipMiddleware, minimum_size=compression.MINIMUM_SIZE, compresslevel=compression.LEVEL)
    app.add_middleware(compression.StaticGzip)
    # Credentials from an address with too many failed authentications: 429, before any
    # token is looked up; each failed lookup counted (server/auth.py).
    app.add_middleware(FailedAuthLimit)
    # Outside Dash's middleware too: a request for a foreign Host, or a foreign page's
    # write or websocket, reaches nothing else.
    app.add_middleware(OriginGuard, policy=site_policy)
    # Outside everything that reads a body (authentication, the login form, FastAPI's
    # parsing, Dash): a body over its route's limit is refused (413) while it is read.
    app.add_middleware(BodyLimit, settings=settings)
    # Added last, so outermost: every response carries the security headers, the guard's
    # refusals included (server/serving.py adds them to uvicorn's own responses).
    app.add_middleware(SecurityHeaders)
    return app

"""The application factory: one process serves ingest, REST, live push and the dashboard."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from dashboard import mount_dashboard
from server.auth import allowed
from server.config import Settings
from server.routes import alerts as alert_routes
from server.routes import health, login, runs, streams
from server.services import running

OPEN_PATHS = ("/api/", "/healthz", "/readyz", "/login", "/logout", "/docs", "/openapi.json")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    internal_token = secrets.token_urlsafe(32)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with running(settings, internal_token) as services:
            app.state.services = services  # what server.deps hands to every route
            yield

    app = FastAPI(
        title="Keel",
        summary="Live stability monitoring for off-policy RL training",
        version="0.1.0",
        lifespan=lifespan,
    )

    api = APIRouter(prefix="/api/v1")
    api.include_router(runs.router)
    api.include_router(streams.router)
    api.include_router(alert_routes.router)
    app.include_router(api)
    app.include_router(health.router)

    app.include_router(login.router)

    @app.middleware("http")
    async def dashboard_login(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        # API routes answer 401 themselves; pages send the browser to the login form.
        path = request.url.path
        if settings.auth_enabled and not path.startswith(OPEN_PATHS) and not await allowed(request, "read"):
            return RedirectResponse("/login", status_code=303)
        return await call_next(request)

    mount_dashboard(app, internal_token=internal_token)
    return app

"""The application factory: one process serves ingest, REST, live push and the dashboard."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI

from dashboard import mount_dashboard
from server import db
from server.config import Settings
from server.ingest import PointsListener
from server.live import LiveHub
from server.routes import health, runs, streams
from server.storage import Store

log = logging.getLogger("keel.server")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            await db.upgrade_async(settings.database_url)
        engine = db.create_engine(settings.database_url)
        app.state.store = Store(engine)
        try:
            yield
        finally:
            await engine.dispose()

    app = FastAPI(
        title="Keel",
        summary="Live stability monitoring for off-policy RL training",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.hub = LiveHub(queue_size=settings.live_queue_size)
    app.state.ingest_connections = 0
    # After-commit hooks of the ingest path (the alert engine registers here).
    listeners: list[PointsListener] = []
    app.state.points_listeners = listeners

    api = APIRouter(prefix="/api/v1")
    api.include_router(runs.router)
    api.include_router(streams.router)
    app.include_router(api)
    app.include_router(health.router)

    mount_dashboard(app, settings)
    return app

"""The application factory: one process serves ingest, REST, live push and the dashboard."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import RedirectResponse, Response

from dashboard import mount_dashboard
from server import db
from server.alerts.engine import AlertEngine
from server.auth import allowed, create_token
from server.config import Settings
from server.fanout import Fanout
from server.ingest import PointsListener
from server.live import LiveHub
from server.routes import alerts as alert_routes
from server.routes import health, login, runs, streams
from server.storage import Store
from server.webhooks.delivery import DeliveryWorker, RetryPolicy

log = logging.getLogger("keel.server")

OPEN_PATHS = ("/api/", "/healthz", "/readyz", "/login", "/logout", "/docs", "/openapi.json")


async def _every(period_s: float, job: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(period_s)
        try:
            await job()
        except Exception:
            log.exception("periodic job failed")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.migrate_on_start:
            await db.upgrade_async(settings.database_url)
        engine = db.create_engine(settings.database_url)
        store = Store(engine)
        deliveries = DeliveryWorker(
            store,
            allow_private=settings.allow_private_webhooks,
            timeout_s=settings.webhook_timeout_s,
            policy=RetryPolicy(max_attempts=settings.webhook_max_attempts, base_s=settings.webhook_retry_base_s),
        )
        alerts = AlertEngine(store, app.state.hub, base_url=settings.base_url, on_outbox=deliveries.wake)
        app.state.store, app.state.alerts, app.state.deliveries = store, alerts, deliveries
        if settings.bootstrap_token:
            await create_token(store, "bootstrap", ["admin"], settings.bootstrap_token)
        listeners.append(alerts.on_points)
        tasks = [
            asyncio.create_task(deliveries.run_forever(), name="keel-webhooks"),
            asyncio.create_task(_every(settings.silence_check_s, alerts.check_silent_runs), name="keel-silence"),
        ]
        if not store.sqlite:  # replicas may share this database: feed each other's live pages
            fanout = Fanout(app.state.hub, store, settings.database_url)
            app.state.hub.relay, app.state.fanout = fanout.relay, fanout
            tasks += [
                asyncio.create_task(fanout.send_forever(), name="keel-fanout-send"),
                asyncio.create_task(fanout.listen_forever(), name="keel-fanout-listen"),
                asyncio.create_task(fanout.deliver_forever(), name="keel-fanout-deliver"),
            ]
        try:
            yield
        finally:
            app.state.hub.relay = None
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            listeners.remove(alerts.on_points)
            await alerts.flush()
            await deliveries.close()
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
    # Lets the dashboard's in-process API reads through when auth is on (read scope only).
    app.state.internal_token = secrets.token_urlsafe(32)
    # After-commit hooks of the ingest path (the alert engine registers here).
    listeners: list[PointsListener] = []
    app.state.points_listeners = listeners

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

    mount_dashboard(app, settings)
    return app

"""Everything the server runs, built once per process in the lifespan, each component
given its collaborators through its constructor (the composition root)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from server import db
from server.alerts.coordination import Coordination, Replicated, SingleProcess
from server.alerts.engine import AlertEngine
from server.alerts.hazard import HazardCache, HazardModel, load_model
from server.alerts.notify import Notifier
from server.alerts.rulebook import RuleBook
from server.api_tokens import create_token
from server.config import Settings, deprecated_env
from server.fanout import Fanout
from server.ingest import AfterCommit, FrameBudget, IngestSlots, SocketSlots
from server.live import LiveHub
from server.ratelimit import RateLimits
from server.storage import Store
from server.webhooks.delivery import DeliveryWorker, RetryPolicy

__all__ = ["Components", "running"]

log = logging.getLogger("keel.server")


@dataclass(frozen=True)
class Components:
    settings: Settings
    store: Store
    hub: LiveHub
    committed: AfterCommit
    """What follows every committed write (live push, alert engine)."""
    rulebook: RuleBook
    alerts: AlertEngine
    deliveries: DeliveryWorker
    ingest_slots: IngestSlots
    live_slots: SocketSlots
    frame_budget: FrameBudget
    rate_limits: RateLimits
    """Per-client token buckets for REST writes and ingest (server/ratelimit.py)."""
    internal_token: str
    """Lets the dashboard's in-process API reads through when auth is on (read scope only)."""
    fanout: Fanout | None
    """Live fan-out to other replicas (PostgreSQL); None with SQLite's one process."""
    hazard_model: HazardModel
    """The one collapse-hazard model of this process (`Settings.hazard_model`): the `hazard`
    rules, the backtest, the hazard reads and the signals all compute with it."""
    hazards: HazardCache
    """Each read run's collapse hazard so far under `hazard_model` (GET /runs/{id}/hazard extends it)."""


async def _every(period_s: float, job: Callable[[], Awaitable[None]]) -> None:
    while True:
        await asyncio.sleep(period_s)
        try:
            await job()
        except Exception:
            log.exception("periodic job failed")


@asynccontextmanager
async def running(settings: Settings, internal_token: str) -> AsyncIterator[Components]:
    """Build the components, run their background tasks, and take it all down again."""
    for old, new in deprecated_env():
        log.warning("%s is deprecated and will stop working; set %s instead", old, new)
    # One hazard model per process: a bad file is refused at start, not at the first hazard read.
    hazard_model = await asyncio.to_thread(load_model, settings.hazard_model)
    if settings.migrate_on_start:
        await db.upgrade_async(settings.database_url)
    engine = db.create_engine(settings.database_url)
    store = Store(engine, max_keys_per_run=settings.max_keys_per_run, max_config_bytes=settings.max_config_bytes)
    # Replicas may share a PostgreSQL database (the store's write path says whether this
    # one can be shared): they feed each other's live pages and take turns with a run's alerts.
    fanout: Fanout | None
    coordination: Coordination
    if store.shared:
        fanout, coordination = Fanout(store, settings.database_url), Replicated(store)
    else:
        fanout, coordination = None, SingleProcess(store)
    hub = LiveHub(
        buffer_bytes=settings.live_buffer_bytes,
        total_buffer_bytes=settings.live_total_buffer_bytes,
        relay=fanout.relay if fanout else None,
    )
    deliveries = DeliveryWorker(
        store,
        allow_private=settings.allow_private_webhooks,
        timeout_s=settings.webhook_timeout_s,
        policy=RetryPolicy(max_attempts=settings.webhook_max_attempts, base_s=settings.webhook_retry_base_s),
    )
    rulebook = RuleBook(store, ttl_s=coordination.rules_ttl_s)
    alerts = AlertEngine(
        store, hub, rulebook, coordination, Notifier(settings.base_url), hazard_model=hazard_model, on_outbox=deliveries.wake
    )
    components = Components(
        settings=settings,
        store=store,
        hub=hub,
        committed=AfterCommit(hub, [alerts.on_points]),
        rulebook=rulebook,
        alerts=alerts,
        deliveries=deliveries,
        ingest_slots=IngestSlots(settings.max_ingest_connections, settings.max_ingest_connections_per_token, "ingest"),
        live_slots=SocketSlots(settings.max_live_connections, settings.max_live_connections_per_token, "live"),
        frame_budget=FrameBudget(settings.ingest_buffer_bytes),
        rate_limits=RateLimits.from_settings(settings),
        internal_token=internal_token,
        fanout=fanout,
        hazard_model=hazard_model,
        hazards=HazardCache(hazard_model),
    )
    if settings.bootstrap_token:
        await create_token(store, "bootstrap", ["admin"], settings.bootstrap_token)
    tasks = [
        asyncio.create_task(deliveries.run_forever(), name="keel-webhooks"),
        asyncio.create_task(_every(settings.silent_run_check_s, alerts.check_silent_runs), name="keel-silent-runs"),
        asyncio.create_task(_every(settings.silent_run_check_s, alerts.forget_idle_runs), name="keel-alerts-idle"),
    ]
    if fanout is not None:
        tasks += [
            asyncio.create_task(fanout.send_forever(), name="keel-fanout-send"),
            asyncio.create_task(fanout.listen_forever(hub), name="keel-fanout-listen"),
            asyncio.create_task(fanout.deliver_forever(hub), name="keel-fanout-deliver"),
        ]
    try:
        yield components
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await alerts.flush()
        await deliveries.close()
        await store.close()

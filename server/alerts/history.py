"""The alerts raised: listing them and acknowledging one (their REST operations)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import select

from server.errors import NotFound
from server.models import Alert, Run
from server.storage import Store

__all__ = ["acknowledge", "list_alerts"]


async def list_alerts(
    store: Store,
    *,
    run_ids: Sequence[str] | None,
    state: str | None,
    severity: str | None,
    project: str | None,
    limit: int,
    before_id: int | None = None,
) -> list[Alert]:
    """Newest first; `run_ids` (None: every run) filters to those runs, `before_id` to the
    alerts older than that id (the next page). The route caps `run_ids` (one bound
    parameter each: SQLite and PostgreSQL refuse a statement past their own limits)."""
    query = select(Alert).order_by(Alert.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(Alert.id < before_id)
    if run_ids:
        query = query.where(Alert.run_id.in_(run_ids))
    if state is not None:
        query = query.where(Alert.state == state)
    if severity is not None:
        query = query.where(Alert.severity == severity)
    if project is not None:
        query = query.join(Run, Run.id == Alert.run_id).where(Run.project == project)
    async with store.sessions() as session:
        return list((await session.scalars(query)).all())


async def acknowledge(store: Store, alert_id: int, by: str) -> Alert:
    async with store.writing() as session:
        alert = await session.get(Alert, alert_id)
        if alert is None:
            raise NotFound(f"alert {alert_id} not found")
        alert.acknowledged_at, alert.acknowledged_by = time.time(), by
    return alert

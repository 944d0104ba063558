"""Alerts (list, acknowledge), silences and webhooks: their REST operations. Rules: rulebook.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from server.alerts.notify import outbox_row
from server.errors import InvalidRequest, NotFound
from server.jsonview import iso
from server.models import Alert, Delivery, Run, Silence, Webhook
from server.storage import Store
from server.webhooks import signing
from server.webhooks.formats import FORMATS

MAX_SILENCE_S = 10 * 365 * 86400
"""A silence lasts at most 10 years and starts at most 10 years from now: one meant
"forever" is a mistake to refuse, not a mute to keep without anyone noticing."""


async def list_alerts(
    store: Store, *, run_ids: Sequence[str] | None, state: str | None, severity: str | None, project: str | None, limit: int
) -> list[Alert]:
    """Newest first; `run_ids` (None: every run) filters to those runs."""
    query = select(Alert).order_by(Alert.id.desc()).limit(limit)
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


def silence_json(silence: Silence, now: float) -> dict[str, Any]:
    return {
        "id": silence.id, "matchers": silence.matchers, "starts_at": silence.starts_at, "ends_at": silence.ends_at,
        "comment": silence.comment, "created_by": silence.created_by, "active": silence.starts_at <= now < silence.ends_at,
    }


async def create_silence(
    store: Store, matchers: dict[str, str], starts_at: float, ends_at: float, comment: str, created_by: str, *, now: float
) -> Silence:
    if not matchers:
        raise InvalidRequest("a silence needs at least one matcher")
    if ends_at <= starts_at:
        raise InvalidRequest("ends_at must be after starts_at")
    if ends_at - starts_at > MAX_SILENCE_S or starts_at > now + MAX_SILENCE_S:
        raise InvalidRequest(f"a silence lasts at most 10 years ({MAX_SILENCE_S} s) and starts within 10 years from now")
    async with store.writing() as session:
        silence = Silence(matchers=matchers, starts_at=starts_at, ends_at=ends_at, comment=comment, created_by=created_by)
        session.add(silence)
    return silence


async def list_silences(store: Store, *, limit: int, before_id: int | None, active: bool | None, now: float) -> list[Silence]:
    """Newest first: at most `limit`, older than `before_id`, in force at `now` or not (`active`)."""
    query = select(Silence).order_by(Silence.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(Silence.id < before_id)
    in_force = (Silence.starts_at <= now) & (Silence.ends_at > now)
    if active is True:
        query = query.where(in_force)
    elif active is False:
        query = query.where(~in_force)
    async with store.sessions() as session:
        return list((await session.scalars(query)).all())


async def expire_silence(store: Store, silence_id: int) -> Silence:
    async with store.writing() as session:
        silence = await session.get(Silence, silence_id)
        if silence is None:
            raise NotFound(f"silence {silence_id} not found")
        silence.ends_at = min(silence.ends_at, time.time())
    return silence


def webhook_json(hook: Webhook) -> dict[str, Any]:
    return {"id": hook.id, "url": hook.url, "format": hook.format, "enabled": hook.enabled, "disabled_reason": hook.disabled_reason}


async def create_webhook(store: Store, url: str, format_name: str, secret: str | None) -> Webhook:
    if format_name not in FORMATS:
        raise InvalidRequest(f"format must be one of {', '.join(FORMATS)}")
    secret = secret or signing.new_secret()
    signing.validate_secret(secret)
    async with store.writing() as session:
        hook = Webhook(url=url, format=format_name, secret=secret, enabled=True, disabled_reason=None, created_at=time.time())
        session.add(hook)
    return hook


async def list_webhooks(store: Store) -> list[Webhook]:
    async with store.sessions() as session:
        return list((await session.scalars(select(Webhook).order_by(Webhook.id))).all())


async def delete_webhook(store: Store, hook_id: int) -> None:
    async with store.writing() as session:
        hook = await session.get(Webhook, hook_id)
        if hook is None:
            raise NotFound(f"webhook {hook_id} not found")
        await session.delete(hook)


async def queue_test_event(store: Store, hook_id: int, base_url: str) -> Delivery:
    now = time.time()
    async with store.writing() as session:
        hook = await session.get(Webhook, hook_id)
        if hook is None:
            raise NotFound(f"webhook {hook_id} not found")
        event_id = f"evt_test_{uuid.uuid4().hex}"
        payload = {
            "type": "test",
            "timestamp": iso(now),
            "alert": {
                "id": 0, "run_id": "00000000-0000-0000-0000-000000000000", "run_name": "example-run", "project": "default",
                "group": None, "rule": "test event", "metric": "mismatch/kl", "severity": "info", "state": "firing",
                "step": 0, "value": 0.0, "started_step": 0, "resolved_step": None, "fired_step": 0,
                "message": "Keel test event: this webhook is configured correctly.", "fingerprint": "test",
                "started_at": iso(now), "resolved_at": None, "url": f"{base_url}/compare?runs=",
                "rule_id": None, "silenced": False, "acknowledged_at": None, "acknowledged_by": None,
            },
        }
        delivery = outbox_row(hook.id, event_id, "test", payload, now)
        session.add(delivery)
    return delivery


async def list_deliveries(store: Store, hook_id: int, limit: int = 100) -> list[Delivery]:
    async with store.sessions() as session:
        if await session.get(Webhook, hook_id) is None:
            raise NotFound(f"webhook {hook_id} not found")
        return list(
            (await session.scalars(select(Delivery).where(Delivery.webhook_id == hook_id).order_by(Delivery.id.desc()).limit(limit))).all()
        )

"""The webhooks and their outbox: the REST operations on webhooks (create, list, delete,
send a test event, list deliveries), and `outbox_row`, how any event is queued for one
(the alert pipeline's notifier queues with it; delivery.py sends what is queued)."""

from __future__ import annotations

import re
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select

from server.errors import InvalidRequest, NotFound
from server.jsonview import iso
from server.models import Delivery, Webhook
from server.storage import Store
from server.webhooks import signing
from server.webhooks.formats import FORMATS

__all__ = [
    "create_webhook", "delete_webhook", "list_deliveries", "list_webhooks", "masked_url", "outbox_row", "queue_test_event",
    "webhook_json",
]


def outbox_row(webhook_id: int, event_id: str, event_type: str, payload: dict[str, Any], now: float) -> Delivery:
    return Delivery(
        webhook_id=webhook_id, event_id=event_id, event_type=event_type, payload=payload, status="pending",
        attempts=0, next_attempt_at=now, last_error=None, created_at=now, delivered_at=None,
    )


URL_MASK = "***"


def webhook_json(hook: Webhook, *, whole_url: bool = True) -> dict[str, Any]:
    """A webhook as the API shows it. Its URL is whole only for an admin (`whole_url`):
    a receiver's URL is often its secret (Slack's and Discord's carry it in the path)."""
    url = hook.url if whole_url else masked_url(hook.url)
    reason = hook.disabled_reason if whole_url else masked_urls(hook.disabled_reason)
    return {"id": hook.id, "url": url, "format": hook.format, "enabled": hook.enabled, "disabled_reason": reason}


def masked_urls(text: str | None) -> str | None:
    """`text` (a delivery's error, a disabled reason) with every URL in it masked as
    `masked_url` does: an HTTP client's error often quotes the URL it failed to reach."""
    return None if text is None else _URL.sub(lambda match: masked_url(match.group(0)), text)


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>()]+")


def masked_url(url: str) -> str:
    """`scheme://host[:port]/***`: where a webhook goes, not how to post to it (the userinfo,
    path, query and fragment, where receivers keep their secrets, are left out)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{netloc}{f':{port}' if port is not None else ''}/{URL_MASK}"


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
                "run_url": f"{base_url}/runs/00000000-0000-0000-0000-000000000000",
                "commands_url": f"{base_url}/api/v1/runs/00000000-0000-0000-0000-000000000000/commands",
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

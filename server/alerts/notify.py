"""Stage three of the alert pipeline: silences, then the webhook outbox.

A firing alert matched by an active silence is marked silenced and notifies no one,
nor does its resolution. Every other event becomes one outbox row per enabled webhook,
in the same transaction as the alert rows (server/webhooks/delivery.py sends them).
"""

from __future__ import annotations

import fnmatch
import time
from typing import Any
from urllib.parse import quote

from sqlalchemy.ext.asyncio import AsyncSession

from server.alerts import repository
from server.alerts.transitions import AlertEvent
from server.jsonview import iso
from server.models import Alert, Run, Silence, Webhook
from server.webhooks.registry import outbox_row

__all__ = ["Notifier", "event_payload", "labels", "silence_matches"]


def labels(alert: Alert, run: Run) -> dict[str, str]:
    return {
        "rule": alert.rule_name,
        "run_id": run.id,
        "run_name": run.name,
        "project": run.project,
        "group": run.group or "",
        "metric": alert.metric,
        "severity": alert.severity,
    }


def silence_matches(silence: Silence, alert_labels: dict[str, str]) -> bool:
    return all(fnmatch.fnmatchcase(alert_labels.get(name, ""), pattern) for name, pattern in silence.matchers.items())


def event_payload(event_type: str, alert: dict[str, Any], run: Run, base_url: str) -> dict[str, Any]:
    """A format-neutral webhook event about `alert` (its API JSON); server.webhooks.formats
    renders it per receiver."""
    return {
        "type": event_type,
        "timestamp": iso(time.time()),
        "alert": {
            **alert,
            "run_name": run.name,
            "project": run.project,
            "group": run.group,
            "step": alert["resolved_step"] if alert["state"] == "resolved" else alert["fired_step"],
            "url": f"{base_url}/compare?runs={run.id}",
            "run_url": f"{base_url}/runs/{quote(run.id, safe='')}",
            "commands_url": f"{base_url}/api/v1/runs/{quote(run.id, safe='')}/commands",
        },
    }


class Notifier:
    def __init__(self, base_url: str):
        self.base_url = base_url
        """Where the dashboard is, for the links in notifications."""

    async def notify(self, session: AsyncSession, run: Run, events: list[AlertEvent], now: float) -> bool:
        """Apply silences and queue the events' deliveries; whether any delivery was queued."""
        silences: list[Silence] | None = None
        webhooks: list[Webhook] | None = None
        queued = False
        for event in events:
            alert = event.alert
            if event.state == "firing":
                if silences is None:
                    silences = await repository.active_silences(session, now)
                alert.silenced = any(silence_matches(s, labels(alert, run)) for s in silences)
            if alert.silenced:
                continue
            if webhooks is None:
                webhooks = await repository.enabled_webhooks(session)
            payload = event_payload(f"alert.{event.state}", event.snapshot, run, self.base_url)
            for hook in webhooks:
                session.add(outbox_row(hook.id, f"evt_{alert.id}_{event.state}", payload["type"], payload, now))
            queued = queued or bool(webhooks)
        return queued

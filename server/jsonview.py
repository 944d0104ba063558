"""Stored rows as JSON, for every surface that shows them: REST responses, live pushes and
webhook events. Plain functions, no FastAPI, so the alert pipeline can use them too."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from server.models import Alert
from wire.signals import Alert as WireAlert

__all__ = ["alert_json", "iso", "wire_alert"]


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat()


def wire_alert(alert: Alert) -> WireAlert:
    """A stored alert as the wire carries it (wire/signals.py `Alert`)."""
    return WireAlert(
        id=alert.id,
        run_id=alert.run_id,
        rule=alert.rule_name,
        metric=alert.metric,
        severity=alert.severity,
        state=alert.state,
        started_step=alert.started_step,
        resolved_step=alert.resolved_step,
        message=alert.message,
        keys=tuple(key for key in alert.metric.split(",") if key),
        rule_id=alert.rule_id,
        fingerprint=alert.fingerprint,
        fired_step=alert.fired_step,
        value=alert.value,
        started_at=iso(alert.started_at),
        resolved_at=iso(alert.resolved_at),
        silenced=alert.silenced,
        acknowledged_at=iso(alert.acknowledged_at),
        acknowledged_by=alert.acknowledged_by,
    )


def alert_json(alert: Alert) -> dict[str, Any]:
    """The API shape of an alert (REST, live pushes, signals and webhook events; docs/protocol.md
    fields first): the wire's `Alert`, encoded."""
    return wire_alert(alert).to_json()

"""Stage two of the alert pipeline: lifecycle changes become alert rows.

An alert opens as pending (or firing), fires, resolves, or is cancelled (deleted: it
never was an alert). Every firing and resolution is also an `AlertEvent` for the
notification stage, with the alert as it was at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from server.alerts.lifecycle import Transition
from server.alerts.state import Change, fingerprint
from server.jsonview import alert_json
from server.models import Alert, Run

__all__ = ["AlertEvent", "record"]


@dataclass
class AlertEvent:
    """An alert fired or resolved: what notifications are about."""

    alert: Alert
    state: str
    """"firing" or "resolved"."""
    snapshot: dict[str, Any]
    """`alert_json(alert)` when it happened (a later change in the same frame moves on)."""


async def record(
    session: AsyncSession, run: Run, changes: list[Change], now: float
) -> tuple[list[Alert], list[AlertEvent]]:
    """Write the changes (in order) to the alerts table: the alerts changed, and the events."""
    touched: dict[int, Alert] = {}
    events: list[AlertEvent] = []
    for change in changes:
        tracked = change.tracked
        alert = await session.get(Alert, tracked.alert_id) if tracked.alert_id is not None else None
        if change.transition in (Transition.PENDING, Transition.FIRING) and (alert is None or alert.state == "resolved"):
            alert = Alert(
                fingerprint=fingerprint(change.rule.id, run.id), rule_id=change.rule.id, rule_name=change.rule.name,
                run_id=run.id, metric=(change.metric or change.rule.metric)[:200], severity=change.rule.severity, state="pending",
                started_step=tracked.lifecycle.started_step if tracked.lifecycle.started_step is not None else change.step,
                fired_step=None, resolved_step=None, value=change.value, message=change.message[:1000],
                started_at=now, resolved_at=None, silenced=False, acknowledged_at=None, acknowledged_by=None,
            )
            session.add(alert)
            await session.flush()
            tracked.alert_id = alert.id
        if alert is None:
            continue
        if change.transition is Transition.CANCELLED:
            await session.delete(alert)
            tracked.alert_id = None
            touched.pop(alert.id, None)
            continue
        if change.transition is Transition.FIRING:
            alert.state, alert.fired_step, alert.value, alert.message = "firing", change.step, change.value, change.message[:1000]
            if change.metric:
                alert.metric = change.metric[:200]
        elif change.transition is Transition.RESOLVED:
            alert.state, alert.resolved_step, alert.resolved_at = "resolved", change.step, now
            tracked.alert_id = None
        if change.transition in (Transition.FIRING, Transition.RESOLVED):
            events.append(AlertEvent(alert, alert.state, alert_json(alert)))
        touched[alert.id] = alert
    return list(touched.values()), events

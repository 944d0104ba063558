"""SQL for rules, rule states, alerts, silences and the webhook outbox."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from server.alerts.lifecycle import Transition
from server.alerts.rules import DEFAULT_RULES
from server.models import Alert, Delivery, Project, Rule, RuleState, Run, Silence, Webhook
from server.schemas import iso
from server.storage import Store

if TYPE_CHECKING:
    from server.alerts.engine import _Change, _Tracked


def rule_applies(rule: Rule, run: Run) -> bool:
    return (
        (rule.project is None or rule.project == run.project)
        and (rule.group is None or rule.group == run.group)
        and (rule.run_id is None or rule.run_id == run.id)
    )


async def load_rules(sessions: async_sessionmaker[AsyncSession]) -> list[Rule]:
    async with sessions() as session:
        return list((await session.scalars(select(Rule).order_by(Rule.id))).all())


async def install_project(store: Store, project: str, now: float) -> bool:
    """Record the project and install its default rules, once, even under concurrent first runs.

    True if this call installed them.
    """
    insert = sqlite_insert if store.sqlite else pg_insert
    async with store.writing() as session:
        created = await session.execute(
            insert(Project)
            .values(name=project, created_at=now)
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(Project.name)
        )
        if created.first() is None:  # another server or run installed it first
            return False
        for spec in DEFAULT_RULES:
            session.add(
                Rule(
                    name=spec.name, project=project, group=None, run_id=None, metric=spec.metric,
                    detector=spec.detector, params=dict(spec.params), severity=spec.severity,
                    for_steps=spec.for_steps, keep_firing_for=spec.keep_firing_for,
                    enabled=True, builtin=True, created_at=now,
                )
            )
        return True


async def load_states(
    sessions: async_sessionmaker[AsyncSession], run_id: str, rule_ids: Sequence[int]
) -> dict[int, tuple[dict[str, Any], int | None]]:
    async with sessions() as session:
        return await load_states_in(session, run_id, rule_ids)


async def load_states_in(
    session: AsyncSession, run_id: str, rule_ids: Sequence[int]
) -> dict[int, tuple[dict[str, Any], int | None]]:
    rows = await session.execute(
        select(RuleState.rule_id, RuleState.state, RuleState.last_step).where(
            RuleState.run_id == run_id, RuleState.rule_id.in_(list(rule_ids))
        )
    )
    return {rule_id: (state, last_step) for rule_id, state, last_step in rows}


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


def alert_json(alert: Alert) -> dict[str, Any]:
    """The API shape of an alert (PROTOCOL.md fields first)."""
    from trainer_hooks.protocol import encode_value

    return {
        "id": alert.id,
        "run_id": alert.run_id,
        "rule": alert.rule_name,
        "metric": alert.metric,
        "severity": alert.severity,
        "state": alert.state,
        "started_step": alert.started_step,
        "resolved_step": alert.resolved_step,
        "message": alert.message,
        "keys": [key for key in alert.metric.split(",") if key],
        "rule_id": alert.rule_id,
        "fingerprint": alert.fingerprint,
        "fired_step": alert.fired_step,
        "value": None if alert.value is None else encode_value(alert.value),
        "started_at": iso(alert.started_at),
        "resolved_at": iso(alert.resolved_at),
        "silenced": alert.silenced,
        "acknowledged_at": iso(alert.acknowledged_at),
        "acknowledged_by": alert.acknowledged_by,
    }


def event_payload(event_type: str, alert: Alert, run: Run, base_url: str) -> dict[str, Any]:
    """A format-neutral webhook event; server.webhooks.formats renders it per receiver."""
    return {
        "type": event_type,
        "timestamp": iso(time.time()),
        "alert": {
            **alert_json(alert),
            "run_name": run.name,
            "project": run.project,
            "group": run.group,
            "step": alert.resolved_step if alert.state == "resolved" else alert.fired_step,
            "url": f"{base_url}/compare?runs={run.id}",
        },
    }


async def apply(
    store: Store,
    run: Run,
    changes: list[_Change],
    states: list[tuple[int, _Tracked]],
    fingerprint: Callable[[int, str], str],
    base_url: str,
    *,
    session: AsyncSession | None = None,
) -> list[tuple[Alert, bool]]:
    """Persist rule states, alert transitions and outbox rows in one transaction (the
    caller's `session`, else a new one).

    Returns the alerts that changed and whether a notification was queued for each.
    """
    if session is None:
        async with store.writing() as session:
            return await apply(store, run, changes, states, fingerprint, base_url, session=session)
    now = time.time()
    touched: dict[int, tuple[Alert, bool]] = {}
    silences: list[Silence] | None = None
    webhooks: list[Webhook] | None = None
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
        queued = False
        if change.transition is Transition.CANCELLED:
            await session.delete(alert)
            tracked.alert_id = None
            touched.pop(alert.id, None)
            continue
        if change.transition is Transition.FIRING:
            alert.state, alert.fired_step, alert.value, alert.message = "firing", change.step, change.value, change.message[:1000]
            if change.metric:
                alert.metric = change.metric[:200]
            if silences is None:
                silences = list((await session.scalars(select(Silence).where(Silence.starts_at <= now, Silence.ends_at > now))).all())
            alert.silenced = any(silence_matches(s, labels(alert, run)) for s in silences)
        elif change.transition is Transition.RESOLVED:
            alert.state, alert.resolved_step, alert.resolved_at = "resolved", change.step, now
            tracked.alert_id = None
        if change.transition in (Transition.FIRING, Transition.RESOLVED) and not alert.silenced:
            if webhooks is None:
                webhooks = list((await session.scalars(select(Webhook).where(Webhook.enabled.is_(True)))).all())
            await session.flush()
            payload = event_payload(f"alert.{alert.state}", alert, run, base_url)
            for hook in webhooks:
                session.add(outbox_row(hook.id, f"evt_{alert.id}_{alert.state}", payload["type"], payload, now))
            queued = bool(webhooks)
        touched[alert.id] = (alert, queued or touched.get(alert.id, (alert, False))[1])
    # After the changes: new alerts' ids are part of the state. One statement for all.
    if states:
        await _upsert_states(session, store.sqlite, run.id, [(rule_id, t.to_json(), t.last_step) for rule_id, t in states])
    return list(touched.values())


def outbox_row(webhook_id: int, event_id: str, event_type: str, payload: dict[str, Any], now: float) -> Delivery:
    return Delivery(
        webhook_id=webhook_id, event_id=event_id, event_type=event_type, payload=payload, status="pending",
        attempts=0, next_attempt_at=now, last_error=None, created_at=now, delivered_at=None,
    )


async def _upsert_states(
    session: AsyncSession, sqlite: bool, run_id: str, rows: list[tuple[int, dict[str, Any], int | None]]
) -> None:
    insert = sqlite_insert if sqlite else pg_insert
    statement = insert(RuleState).values(
        [{"rule_id": rule_id, "run_id": run_id, "state": state, "last_step": last_step} for rule_id, state, last_step in rows]
    )
    stored, incoming = RuleState.last_step, statement.excluded.last_step
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=["rule_id", "run_id"],
            set_={"state": statement.excluded.state, "last_step": incoming},
            # Never back in time: a replica (or a late shutdown flush) holding an older state
            # must not overwrite what another has evaluated since.
            where=or_(stored.is_(None), and_(incoming.is_not(None), incoming >= stored)),
        )
    )


async def delete_rule_states(session: AsyncSession, rule_id: int) -> None:
    await session.execute(delete(RuleState).where(RuleState.rule_id == rule_id))

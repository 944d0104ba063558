"""Alerts, rules, silences and webhooks (REST)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from server.alerts import admin
from server.alerts.rulebook import rule_json
from server.auth import ADMIN, READ
from server.deps import DeliveriesDep, RuleBookDep, SettingsDep, StoreDep
from server.errors import NotFound
from server.schemas import alert_json
from server.webhooks.netguard import checked_address

router = APIRouter(tags=["alerts"])


def _missing(exc: NotFound) -> HTTPException:
    return HTTPException(404, str(exc))


# -- alerts -----------------------------------------------------------------------


@router.get("/alerts", dependencies=[READ])
async def list_alerts(
    store: StoreDep,
    run_id: Annotated[list[str] | None, Query(description="repeat for several runs")] = None,
    state: Literal["pending", "firing", "resolved"] | None = None,
    severity: str | None = None,
    project: str | None = None,
    limit: int = Query(500, ge=1, le=10_000),
) -> list[dict[str, Any]]:
    alerts = await admin.list_alerts(store, run_ids=run_id, state=state, severity=severity, project=project, limit=limit)
    return [alert_json(alert) for alert in alerts]


class AckIn(BaseModel):
    by: str = Field(default="anonymous", max_length=200)


@router.post("/alerts/{alert_id}/ack", dependencies=[ADMIN])
async def acknowledge(alert_id: int, store: StoreDep, body: AckIn | None = None) -> dict[str, Any]:
    try:
        return alert_json(await admin.acknowledge(store, alert_id, (body or AckIn()).by))
    except NotFound as exc:
        raise _missing(exc) from None


# -- rules ------------------------------------------------------------------------


class RuleIn(BaseModel):
    name: str = Field(min_length=1, max_length=200)
    metric: str = Field(min_length=1, max_length=200)
    detector: str
    params: dict[str, Any] = Field(default_factory=dict)
    severity: str = "warning"
    project: str | None = None
    group: str | None = None
    run_id: str | None = None
    for_steps: int = Field(1, ge=0)
    keep_firing_for: int = Field(1, ge=0)
    enabled: bool = True


class RulePatch(BaseModel):
    name: str | None = None
    metric: str | None = None
    detector: str | None = None
    params: dict[str, Any] | None = None
    severity: str | None = None
    for_steps: int | None = Field(None, ge=0)
    keep_firing_for: int | None = Field(None, ge=0)
    enabled: bool | None = None


@router.get("/rules", dependencies=[READ])
async def list_rules(rules: RuleBookDep, project: str | None = None) -> list[dict[str, Any]]:
    return [rule_json(rule) for rule in await rules.list(project)]


@router.post("/rules", status_code=201, dependencies=[ADMIN])
async def create_rule(body: RuleIn, rules: RuleBookDep) -> dict[str, Any]:
    try:
        rule = await rules.create(body.model_dump())
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return rule_json(rule)


@router.patch("/rules/{rule_id}", dependencies=[ADMIN])
async def update_rule(rule_id: int, body: RulePatch, rules: RuleBookDep) -> dict[str, Any]:
    try:
        rule = await rules.update(rule_id, body.model_dump(exclude_none=True))
    except NotFound as exc:
        raise _missing(exc) from None
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return rule_json(rule)


@router.delete("/rules/{rule_id}", status_code=204, dependencies=[ADMIN])
async def delete_rule(rule_id: int, rules: RuleBookDep) -> None:
    try:
        await rules.delete(rule_id)
    except NotFound as exc:
        raise _missing(exc) from None


# -- silences -----------------------------------------------------------------------


class SilenceIn(BaseModel):
    matchers: dict[str, str] = Field(description="label -> glob; labels: rule, run_id, run_name, project, group, metric, severity")
    duration_s: float | None = Field(None, gt=0, description="from now; or give ends_at")
    starts_at: float | None = None
    ends_at: float | None = None
    comment: str = Field("", max_length=1000)
    created_by: str = Field("anonymous", max_length=200)


@router.get("/silences", dependencies=[READ])
async def list_silences(store: StoreDep) -> list[dict[str, Any]]:
    now = time.time()
    return [admin.silence_json(s, now) for s in await admin.list_silences(store)]


@router.post("/silences", status_code=201, dependencies=[ADMIN])
async def create_silence(body: SilenceIn, store: StoreDep) -> dict[str, Any]:
    now = time.time()
    starts_at = body.starts_at if body.starts_at is not None else now
    ends_at = body.ends_at if body.ends_at is not None else (starts_at + body.duration_s if body.duration_s else None)
    if ends_at is None:
        raise HTTPException(422, "give duration_s or ends_at: silences are time-bounded")
    try:
        silence = await admin.create_silence(store, body.matchers, starts_at, ends_at, body.comment, body.created_by)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return admin.silence_json(silence, now)


@router.delete("/silences/{silence_id}", dependencies=[ADMIN])
async def expire_silence(silence_id: int, store: StoreDep) -> dict[str, Any]:
    try:
        return admin.silence_json(await admin.expire_silence(store, silence_id), time.time())
    except NotFound as exc:
        raise _missing(exc) from None


# -- webhooks -----------------------------------------------------------------------


class WebhookIn(BaseModel):
    url: str = Field(min_length=1, max_length=2000)
    format: Literal["generic", "slack", "discord", "alertmanager"] = "generic"
    secret: str | None = Field(None, description="whsec_<base64>; generated when omitted")


@router.post("/webhooks", status_code=201, dependencies=[ADMIN])
async def create_webhook(body: WebhookIn, store: StoreDep, settings: SettingsDep) -> dict[str, Any]:
    try:
        await checked_address(body.url, allow_private=settings.allow_private_webhooks)
    except ValueError as exc:  # ForbiddenTarget (an InvalidRequest) included
        raise HTTPException(422, str(exc)) from None
    try:
        hook = await admin.create_webhook(store, body.url, body.format, body.secret)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None
    return {**admin.webhook_json(hook), "secret": hook.secret}


@router.get("/webhooks", dependencies=[READ])
async def list_webhooks(store: StoreDep) -> list[dict[str, Any]]:
    return [admin.webhook_json(hook) for hook in await admin.list_webhooks(store)]


@router.delete("/webhooks/{hook_id}", status_code=204, dependencies=[ADMIN])
async def delete_webhook(hook_id: int, store: StoreDep) -> None:
    try:
        await admin.delete_webhook(store, hook_id)
    except NotFound as exc:
        raise _missing(exc) from None


@router.post("/webhooks/{hook_id}/test", status_code=202, dependencies=[ADMIN])
async def test_webhook(
    hook_id: int, store: StoreDep, settings: SettingsDep, deliveries: DeliveriesDep
) -> dict[str, Any]:
    try:
        delivery = await admin.queue_test_event(store, hook_id, settings.base_url)
    except NotFound as exc:
        raise _missing(exc) from None
    deliveries.wake()
    return {"event_id": delivery.event_id, "status": "queued"}


@router.get("/webhooks/{hook_id}/deliveries", dependencies=[READ])
async def list_deliveries(hook_id: int, store: StoreDep) -> list[dict[str, Any]]:
    return [
        {
            "id": d.id, "event_id": d.event_id, "event_type": d.event_type, "status": d.status, "attempts": d.attempts,
            "next_attempt_at": d.next_attempt_at, "last_error": d.last_error, "delivered_at": d.delivered_at,
        }
        for d in await admin.list_deliveries(store, hook_id)
    ]

"""Alerts, rules, silences and webhooks (REST)."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from server.alerts import history, silences
from server.alerts.rulebook import rule_json
from server.auth import ADMIN, READ, allowed
from server.deps import DeliveriesDep, RuleBookDep, SettingsDep, StoreDep
from server.jsonview import alert_json
from server.schemas import MAX_INT, ApiRoute, Name, RowId, Text, errors, unprocessable
from server.webhooks import registry
from server.webhooks.netguard import checked_address
from wire.signals import ACTION

router = APIRouter(tags=["alerts"], route_class=ApiRoute, responses=errors(401))

STRICT = ConfigDict(strict=True)
"""Bodies take JSON's types as they are: `true` is not a number, nor `1` a boolean."""
StepCount = Annotated[int, Field(ge=0, le=MAX_INT)]
Action = Annotated[str, Field(pattern=f"^{ACTION.pattern}$", description="1-64 of [A-Za-z0-9_.-]")]


# -- what the routes answer ----------------------------------------------------------------


class AlertOut(BaseModel):
    """An alert as every surface writes it: wire.signals.Alert's fields, in its order (a test
    keeps the two the same)."""

    id: int
    run_id: str
    rule: str
    metric: str
    severity: str
    state: Literal["pending", "firing", "resolved"]
    started_step: int | None
    resolved_step: int | None
    message: str
    keys: list[str]
    rule_id: int | None
    fingerprint: str
    fired_step: int | None
    value: float | str | None = Field(description='the value that fired it; non-finite as "nan", "inf", "-inf"')
    started_at: str | None = Field(description="ISO 8601, UTC")
    resolved_at: str | None
    silenced: bool
    acknowledged_at: str | None
    acknowledged_by: str | None


class RuleOut(BaseModel):
    id: int
    name: str
    project: str | None
    group: str | None
    run_id: str | None
    metric: str
    detector: str
    params: dict[str, Any]
    severity: str
    for_steps: int
    keep_firing_for: int
    enabled: bool
    builtin: bool
    action: str | None


class SilenceOut(BaseModel):
    id: int
    matchers: dict[str, str]
    starts_at: float
    ends_at: float
    comment: str
    created_by: str
    active: bool = Field(description="in force now")


class WebhookOut(BaseModel):
    id: int
    url: str = Field(description="whole for an admin, `scheme://host/***` for a read token")
    format: str
    enabled: bool
    disabled_reason: str | None


class NewWebhookOut(WebhookOut):
    secret: str = Field(description="the signing secret, shown this once")


class QueuedOut(BaseModel):
    event_id: str
    status: Literal["queued"]


class DeliveryOut(BaseModel):
    id: int
    event_id: str
    event_type: str
    status: str
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    delivered_at: float | None


# -- alerts -----------------------------------------------------------------------


MAX_RUNS_PER_READ = 1000
"""The most `run_id`s one GET /alerts takes (as GET /runs and /series): more is a 422 that
says so. Each is a bound parameter of one statement, and URLs that long are refused by
proxies (and by uvicorn itself well before 10,000 ids); read many runs' alerts by
`project`/`state` and join, or page with `before_id`."""


@router.get("/alerts", response_model=list[AlertOut], dependencies=[READ])
async def list_alerts(
    store: StoreDep,
    run_id: Annotated[
        list[Text] | None,
        Query(max_length=MAX_RUNS_PER_READ, description=f"repeat for several runs, at most {MAX_RUNS_PER_READ}"),
    ] = None,
    state: Literal["pending", "firing", "resolved"] | None = None,
    severity: Text | None = None,
    project: Text | None = None,
    limit: int = Query(500, ge=1, le=10_000),
    before_id: int | None = Query(None, ge=1, le=MAX_INT, description="the next page: alerts older than this id"),
) -> list[dict[str, Any]]:
    """Newest first, `limit` at a time; pass the last id of a page as `before_id` for the next."""
    alerts = await history.list_alerts(
        store, run_ids=run_id, state=state, severity=severity, project=project, limit=limit, before_id=before_id
    )
    return [alert_json(alert) for alert in alerts]


class AckIn(BaseModel):
    model_config = STRICT
    by: Name = "anonymous"


@router.post("/alerts/{alert_id}/ack", response_model=AlertOut, dependencies=[ADMIN], responses=errors(404, 429))
async def acknowledge(alert_id: RowId, store: StoreDep, body: AckIn | None = None) -> dict[str, Any]:
    return alert_json(await history.acknowledge(store, alert_id, (body or AckIn()).by))


# -- rules ------------------------------------------------------------------------


RequiredName = Annotated[Name, Field(min_length=1)]
DetectorName = Annotated[Text, Field(max_length=50)]


class RuleIn(BaseModel):
    model_config = STRICT
    name: RequiredName
    metric: RequiredName
    detector: DetectorName
    params: dict[Text, Any] = Field(default_factory=dict, description="the detector's parameters (docs/alerts.md)")
    severity: Text = "warning"
    project: Name | None = None
    group: Name | None = None
    run_id: Name | None = None
    for_steps: StepCount = 1
    keep_firing_for: StepCount = 1
    enabled: bool = True
    action: Action | None = Field(None, description="a command sent to the run when an alert of this rule fires (`checkpoint`, `stop`, ...)")


class RulePatch(BaseModel):
    model_config = STRICT
    name: RequiredName | None = None
    metric: RequiredName | None = None
    detector: DetectorName | None = None
    params: dict[Text, Any] | None = None
    severity: Text | None = None
    for_steps: StepCount | None = None
    keep_firing_for: StepCount | None = None
    enabled: bool | None = None
    action: Action | Literal[""] | None = Field(None, description='"" takes the action away')


@router.get("/rules", response_model=list[RuleOut], dependencies=[READ])
async def list_rules(rules: RuleBookDep, project: Text | None = None) -> list[dict[str, Any]]:
    return [rule_json(rule) for rule in await rules.list(project)]


@router.post("/rules", status_code=201, response_model=RuleOut, dependencies=[ADMIN], responses=errors(429))
async def create_rule(body: RuleIn, rules: RuleBookDep) -> dict[str, Any]:
    try:
        rule = await rules.create(body.model_dump())
    except ValueError as exc:
        raise unprocessable(str(exc)) from None
    return rule_json(rule)


@router.patch("/rules/{rule_id}", response_model=RuleOut, dependencies=[ADMIN], responses=errors(404, 429))
async def update_rule(rule_id: RowId, body: RulePatch, rules: RuleBookDep) -> dict[str, Any]:
    try:
        changes = body.model_dump(exclude_none=True)
        if changes.get("action") == "":
            changes["action"] = None
        rule = await rules.update(rule_id, changes)
    except ValueError as exc:
        raise unprocessable(str(exc)) from None
    return rule_json(rule)


@router.delete("/rules/{rule_id}", status_code=204, dependencies=[ADMIN], responses=errors(404, 429))
async def delete_rule(rule_id: RowId, rules: RuleBookDep) -> None:
    await rules.delete(rule_id)


# -- silences -----------------------------------------------------------------------


UnixTime = Annotated[float, Field(ge=0, allow_inf_nan=False, description="unix seconds")]


class SilenceIn(BaseModel):
    model_config = STRICT
    matchers: dict[Name, Name] = Field(description="label -> glob; labels: rule, run_id, run_name, project, group, metric, severity")
    duration_s: float | None = Field(
        None, gt=0, le=silences.MAX_SILENCE_S, allow_inf_nan=False, description="from starts_at; or give ends_at"
    )
    starts_at: UnixTime | None = Field(None, description="unix seconds; now when omitted")
    ends_at: UnixTime | None = Field(None, description=f"unix seconds, at most {silences.MAX_SILENCE_S} s after starts_at")
    comment: Annotated[Text, Field(max_length=1000)] = ""
    created_by: Name = "anonymous"


@router.get("/silences", response_model=list[SilenceOut], dependencies=[READ])
async def list_silences(
    store: StoreDep,
    limit: int = Query(500, ge=1, le=10_000),
    before_id: int | None = Query(None, ge=1, le=MAX_INT, description="the next page: silences older than this id"),
    active: bool | None = Query(None, description="only silences in force now (true) or not (false)"),
) -> list[dict[str, Any]]:
    """Newest first, `limit` at a time; pass the last id of a page as `before_id` for the next."""
    now = time.time()
    listed = await silences.list_silences(store, limit=limit, before_id=before_id, active=active, now=now)
    return [silences.silence_json(s, now) for s in listed]


@router.post("/silences", status_code=201, response_model=SilenceOut, dependencies=[ADMIN], responses=errors(429))
async def create_silence(body: SilenceIn, store: StoreDep) -> dict[str, Any]:
    now = time.time()
    starts_at = body.starts_at if body.starts_at is not None else now
    ends_at = body.ends_at if body.ends_at is not None else (starts_at + body.duration_s if body.duration_s else None)
    if ends_at is None:
        raise unprocessable("give duration_s or ends_at: silences are time-bounded", "duration_s")
    try:
        silence = await silences.create_silence(store, body.matchers, starts_at, ends_at, body.comment, body.created_by, now=now)
    except ValueError as exc:
        raise unprocessable(str(exc)) from None
    return silences.silence_json(silence, now)


@router.delete("/silences/{silence_id}", response_model=SilenceOut, dependencies=[ADMIN], responses=errors(404, 429))
async def expire_silence(silence_id: RowId, store: StoreDep) -> dict[str, Any]:
    return silences.silence_json(await silences.expire_silence(store, silence_id), time.time())


# -- webhooks -----------------------------------------------------------------------


class WebhookIn(BaseModel):
    model_config = STRICT
    url: Annotated[Text, Field(min_length=1, max_length=2000)]
    format: Literal["generic", "slack", "discord", "alertmanager"] = "generic"
    secret: Annotated[Text, Field(max_length=200)] | None = Field(None, description="whsec_<base64>; generated when omitted")


@router.post("/webhooks", status_code=201, response_model=NewWebhookOut, dependencies=[ADMIN], responses=errors(429))
async def create_webhook(body: WebhookIn, store: StoreDep, settings: SettingsDep) -> dict[str, Any]:
    """The only response that carries the webhook's signing secret."""
    try:
        await checked_address(body.url, allow_private=settings.allow_private_webhooks)
    except ValueError as exc:  # ForbiddenTarget (an InvalidRequest) included
        raise unprocessable(str(exc), "url") from None
    try:
        hook = await registry.create_webhook(store, body.url, body.format, body.secret)
    except ValueError as exc:
        raise unprocessable(str(exc)) from None
    return {**registry.webhook_json(hook), "secret": hook.secret}


@router.get("/webhooks", response_model=list[WebhookOut], dependencies=[READ])
async def list_webhooks(request: Request, store: StoreDep) -> list[dict[str, Any]]:
    """Every webhook. Its URL is whole for an admin token (or with auth off); a read token
    sees `scheme://host/***`: a receiver's URL is often its secret (Slack's, Discord's)."""
    whole_url = await allowed(request, "admin")
    return [registry.webhook_json(hook, whole_url=whole_url) for hook in await registry.list_webhooks(store)]


@router.delete("/webhooks/{hook_id}", status_code=204, dependencies=[ADMIN], responses=errors(404, 429))
async def delete_webhook(hook_id: RowId, store: StoreDep) -> None:
    await registry.delete_webhook(store, hook_id)


@router.post("/webhooks/{hook_id}/test", status_code=202, response_model=QueuedOut, dependencies=[ADMIN], responses=errors(404, 429))
async def test_webhook(
    hook_id: RowId, store: StoreDep, settings: SettingsDep, deliveries: DeliveriesDep
) -> dict[str, Any]:
    delivery = await registry.queue_test_event(store, hook_id, settings.base_url)
    deliveries.wake()
    return {"event_id": delivery.event_id, "status": "queued"}


@router.get("/webhooks/{hook_id}/deliveries", response_model=list[DeliveryOut], dependencies=[READ], responses=errors(404))
async def list_deliveries(hook_id: RowId, request: Request, store: StoreDep) -> list[dict[str, Any]]:
    """A webhook's deliveries, newest first; for a read token every URL in an error is masked
    as the webhook's own (`scheme://host/***`)."""
    deliveries = await registry.list_deliveries(store, hook_id)
    whole = await allowed(request, "admin")
    return [
        {
            "id": d.id, "event_id": d.event_id, "event_type": d.event_type, "status": d.status, "attempts": d.attempts,
            "next_attempt_at": d.next_attempt_at, "last_error": d.last_error if whole else registry.masked_urls(d.last_error),
            "delivered_at": d.delivered_at,
        }
        for d in deliveries
    ]

"""API models (REST bodies and responses). Wire frames are in trainer_hooks/protocol.py."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from server.models import Alert, Run
from server.storage import KeyInfo, SeriesData
from trainer_hooks.protocol import encode_value


def iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat()


def alert_json(alert: Alert) -> dict[str, Any]:
    """The API shape of an alert (REST, live pushes and webhook events; docs/protocol.md fields first)."""
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


class RunOut(BaseModel):
    id: str
    name: str
    project: str
    group: str | None
    status: str
    """running, finished, failed, killed, or stale (running but silent)."""
    last_step: int | None
    started_at: str
    last_seen_at: str
    finished_at: str | None
    tags: list[str]

    @classmethod
    def from_run(cls, run: Run, *, now: float, stale_after_s: float) -> RunOut:
        status = run.status
        if status == "running" and now - run.last_seen_at > stale_after_s:
            status = "stale"
        return cls(
            id=run.id,
            name=run.name,
            project=run.project,
            group=run.group,
            status=status,
            last_step=run.last_step,
            started_at=iso(run.started_at) or "",
            last_seen_at=iso(run.last_seen_at) or "",
            finished_at=iso(run.finished_at),
            tags=list(run.tags or []),
        )


class RunDetail(RunOut):
    config: dict[str, Any]
    acked_seq: int

    @classmethod
    def from_run(cls, run: Run, *, now: float, stale_after_s: float) -> RunDetail:
        base = RunOut.from_run(run, now=now, stale_after_s=stale_after_s)
        return cls(**base.model_dump(), config=run.config or {}, acked_seq=run.acked_seq)


class KeyOut(BaseModel):
    key: str
    count: int
    last_step: int | None

    @classmethod
    def from_info(cls, info: KeyInfo) -> KeyOut:
        return cls(key=info.key, count=info.count, last_step=info.last_step)


WireValue = float | str


class SeriesOut(BaseModel):
    key: str
    downsampled: bool
    steps: list[int]
    values: list[WireValue]
    min: list[WireValue] | None = None
    max: list[WireValue] | None = None

    @classmethod
    def from_data(cls, data: SeriesData) -> SeriesOut:
        out = cls(
            key=data.key,
            downsampled=data.downsampled,
            steps=data.steps,
            values=[encode_value(v) for v in data.values],
        )
        if data.downsampled:
            out.min = [encode_value(v) for v in data.mins or []]
            out.max = [encode_value(v) for v in data.maxs or []]
        return out


class PointsIn(BaseModel):
    rows: list[Any]


class PointsWritten(BaseModel):
    stored_rows: int
    last_step: int | None

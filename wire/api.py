"""A run and a command as the REST API answers them (docs/read-api.md): what `GET /runs`,
`GET /runs/{id}` and `GET|POST /runs/{id}/commands` write, and what both of Keel's clients
(`keel.client.Client`, `dashboard.data.KeelApi`) read.

Each is a frozen dataclass with one encoder (`to_json()`) and one decoder (`from_json`, a
ProtocolError naming the field for a malformed answer). The server's response models have
exactly these fields in this order (tests/wire/test_server_builds_the_wire.py), and the
clients decode every run and command they read through here, so a server that answers
something else is a clear error in the client, not a KeyError three calls later.

Stdlib only, like the rest of `wire`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from wire.errors import ProtocolError
from wire.fields import number, opt_int, opt_string, require_int, string, strings
from wire.messages import FINISH_STATUSES, decode_value, encode_value

__all__ = ["COMMAND_STATES", "RUN_EXTRAS", "RUN_STATUSES", "ApiCommand", "ApiRun", "LatestPoint", "as_read"]

RUN_STATUSES = ("running", *FINISH_STATUSES, "silent")
COMMAND_STATES = ("pending", "delivered", "acked", "failed")


def _choice(raw: dict[str, Any], name: str, kind: str, choices: tuple[str, ...]) -> str:
    value = string(raw, name, kind)
    if value not in choices:
        raise ProtocolError(f"{kind}.{name} must be one of {', '.join(choices)}, not {value[:40]!r}")
    return value


def _opt_number(raw: dict[str, Any], name: str, kind: str) -> float | None:
    return None if raw.get(name) is None else number(raw, name, kind)


def _object(raw: dict[str, Any], name: str, kind: str) -> dict[str, Any] | None:
    value = raw.get(name)
    if value is not None and not isinstance(value, dict):
        raise ProtocolError(f"{kind}.{name} must be a JSON object or null")
    return value


@dataclass(frozen=True)
class LatestPoint:
    """A key's last point (`GET /runs?latest=k1,k2`)."""

    step: int
    value: float
    """Non-finite values as the wire's strings in JSON."""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "value": encode_value(self.value)}

    @classmethod
    def from_json(cls, raw: Any) -> LatestPoint:
        if not isinstance(raw, dict):
            raise ProtocolError("run.latest's points must be JSON objects")
        try:
            value = decode_value(raw.get("value"))
        except ProtocolError as exc:
            raise ProtocolError(f"run.latest: {exc}") from None
        return cls(step=require_int(raw, "step", "run.latest", 0, 2**63 - 1), value=value)


@dataclass(frozen=True)
class ApiRun:
    """A run as the REST API answers it. The fields up to `latest` are in every answer;
    `hazard` and `collapsed_at` only in `GET /runs?hazard=true`, `config` and `acked_seq` only
    in `GET /runs/{id}` (RUN_EXTRAS: None when the answer had none, and left out of
    `to_json()` then)."""

    id: str
    name: str
    project: str
    group: str | None
    status: str
    """running, finished, failed, killed, or silent (running, but nothing sent for a while)."""
    last_step: int | None
    started_at: str
    """ISO 8601, UTC."""
    last_seen_at: str
    finished_at: str | None
    tags: tuple[str, ...]
    unsent: int | None = None
    """Frames its trainer ended without getting acknowledged (null: none)."""
    actions: dict[str, str] | None = None
    """The command actions its trainer takes, with what each does (null: no trainer listens)."""
    latest: dict[str, LatestPoint] | None = None
    hazard: float | None = None
    collapsed_at: int | None = None
    config: dict[str, Any] | None = None
    acked_seq: int | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "name": self.name, "project": self.project, "group": self.group,
            "status": self.status, "last_step": self.last_step, "started_at": self.started_at,
            "last_seen_at": self.last_seen_at, "finished_at": self.finished_at, "tags": list(self.tags),
            "unsent": self.unsent, "actions": None if self.actions is None else dict(self.actions),
            "latest": None if self.latest is None else {key: point.to_json() for key, point in self.latest.items()},
        }  # fmt: skip
        extras = {"hazard": self.hazard, "collapsed_at": self.collapsed_at, "config": self.config, "acked_seq": self.acked_seq}
        return body | {key: value for key, value in extras.items() if value is not None}

    @classmethod
    def from_json(cls, raw: Any) -> ApiRun:
        if not isinstance(raw, dict):
            raise ProtocolError(f"a run must be a JSON object, not {type(raw).__name__}")
        actions = _object(raw, "actions", "run")
        if actions is not None and not all(isinstance(text, str) for text in actions.values()):
            raise ProtocolError("run.actions must map each action to a string")
        latest = _object(raw, "latest", "run")
        return cls(
            id=string(raw, "id", "run"),
            name=string(raw, "name", "run"),
            project=string(raw, "project", "run"),
            group=opt_string(raw, "group", "run"),
            status=_choice(raw, "status", "run", RUN_STATUSES),
            last_step=opt_int(raw, "last_step", "run"),
            started_at=string(raw, "started_at", "run"),
            last_seen_at=string(raw, "last_seen_at", "run"),
            finished_at=opt_string(raw, "finished_at", "run"),
            tags=strings(raw, "tags", "run") or (),
            unsent=opt_int(raw, "unsent", "run"),
            actions=actions,
            latest=None if latest is None else {str(key): LatestPoint.from_json(point) for key, point in latest.items()},
            hazard=_opt_number(raw, "hazard", "run"),
            collapsed_at=opt_int(raw, "collapsed_at", "run"),
            config=_object(raw, "config", "run"),
            acked_seq=opt_int(raw, "acked_seq", "run"),
        )


RUN_EXTRAS = ("hazard", "collapsed_at", "config", "acked_seq")
"""ApiRun's fields that only some answers carry."""
assert [f.name for f in fields(ApiRun)][-len(RUN_EXTRAS) :] == list(RUN_EXTRAS)


@dataclass(frozen=True)
class ApiCommand:
    """A command to a run's trainer as the REST API answers it (the run page's command list).
    What the trainer itself receives is `wire.signals.Command`."""

    id: str
    run_id: str
    action: str
    payload: dict[str, Any]
    state: str
    """pending, delivered, acked or failed."""
    requested_by: str
    """The token's name, "local" with auth off, or "rule <name>" for a rule's action."""
    created_at: float
    """Seconds since the epoch, as the times below."""
    delivered_at: float | None
    finished_at: float | None
    message: str
    """The handler's answer, or why the command failed without one."""
    answered_by: str | None
    """The writer whose trainer answered."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, raw: Any) -> ApiCommand:
        if not isinstance(raw, dict):
            raise ProtocolError(f"a command must be a JSON object, not {type(raw).__name__}")
        payload = _object(raw, "payload", "command")
        return cls(
            id=string(raw, "id", "command"),
            run_id=string(raw, "run_id", "command"),
            action=string(raw, "action", "command"),
            payload={} if payload is None else payload,
            state=_choice(raw, "state", "command", COMMAND_STATES),
            requested_by=string(raw, "requested_by", "command"),
            created_at=number(raw, "created_at", "command"),
            delivered_at=_opt_number(raw, "delivered_at", "command"),
            finished_at=_opt_number(raw, "finished_at", "command"),
            message=string(raw, "message", "command", default=""),
            answered_by=opt_string(raw, "answered_by", "command"),
        )


def as_read(kind: type[ApiRun] | type[ApiCommand], raw: Any, *, many: bool = False) -> Any:
    """A run or command answer (a list of them with `many`) read through its decoder and
    written back as the JSON dicts the clients hand on: what a client returns is what the
    contract holds. Raises ProtocolError for an answer that is not one."""
    if not many:
        return kind.from_json(raw).to_json()
    if not isinstance(raw, list):
        raise ProtocolError(f"expected a list of {kind.__name__}, got {type(raw).__name__}")
    return [kind.from_json(item).to_json() for item in raw]

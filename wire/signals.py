"""What the server tells a trainer on its own ingest socket (docs/protocol.md, "Signals").

A client asks for signals by name: in its hello (`"listen": [...]`) or later on the same
connection (`{"type": "listen", "listen": [...]}`, which replaces the set). A server that
sends them says which in its welcome (`"signals": [...]`); a client that never asks gets
nothing it did not get before.

- "alerts": `{"type": "alerts", "firing": [alert, ...]}` once when asked (the run's open
  alerts), then `{"type": "alert", "alert": alert}` for each change (firing, resolved).
- "hazard": `{"type": "hazard", "step": s, "hazard": p}`, the run's collapse hazard after the
  rows just stored (at most one per new step; none while it warms up).
- "commands": `{"type": "command", "command": command}` for each command addressed to the run
  that was not acknowledged yet (again after a reconnect: at least once). The client answers
  `{"type": "command_result", "id": ..., "ok": true | false, "message": "..."}`.
  A client that listens to commands may say which actions its handler takes, with a line on
  what each does: `"actions": {"stop": "saves a checkpoint and stops", ...}` in the same
  hello or listen message (absent: it did not say; the run page then offers the usual two).

Each signal message is a frozen dataclass here (`AlertsMessage`, `AlertMessage`,
`HazardMessage`, `CommandMessage`, and the client's `Listen` and `CommandResult`) with one
encoder (`to_json()`) and one decoder (`from_json`, a ProtocolError for a malformed one);
`read_signal` reads any of the server's. `Alert`
is the alert as these messages, `GET /alerts`, the live socket and webhook events carry it.

Stdlib only, like the rest of `wire`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wire.errors import ProtocolError
from wire.fields import message_of, number, opt_int, opt_string, require_int, string, strings
from wire.messages import (
    ACTION,
    MAX_STEP,
    SIGNALS,
    decode_value,
    encode_value,
    parse_action,
    parse_actions,
    parse_signals,
)

__all__ = [
    "SIGNALS",
    "SIGNAL_TYPES",
    "Alert",
    "AlertMessage",
    "AlertsMessage",
    "ACTION",
    "Command",
    "CommandMessage",
    "CommandResult",
    "HazardMessage",
    "Listen",
    "Signal",
    "parse_action",
    "read_signal",
]

MAX_RESULT_MESSAGE = 1000
"""Characters of a command result's message kept (the rest is cut)."""


@dataclass(frozen=True)
class Command:
    """A command addressed to a run, as its handler in the trainer receives it."""

    id: str
    """Unique; a command delivered twice (after a reconnect) carries the same id."""
    action: str
    payload: dict[str, Any] = field(default_factory=dict)
    requested_by: str = ""
    """The token's name, or "rule <name>" for a rule's action."""
    created_at: float = 0.0

    @classmethod
    def from_json(cls, raw: Any) -> Command:
        """Raises ProtocolError (a ValueError) without a string `id` and `action`."""
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not isinstance(raw.get("action"), str):
            raise ProtocolError(f"not a command (it needs a string id and action): {str(raw)[:200]}")
        payload = raw.get("payload")
        created_at = raw.get("created_at")
        return cls(
            id=raw["id"],
            action=raw["action"],
            payload=payload if isinstance(payload, dict) else {},
            requested_by=str(raw.get("requested_by") or ""),
            created_at=0.0 if created_at is None else number(raw, "created_at", "command"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "action": self.action,
            "payload": self.payload,
            "requested_by": self.requested_by,
            "created_at": self.created_at,
        }


@dataclass(frozen=True)
class Listen:
    """`{"type": "listen", "listen": [...], "actions": {...}}`: the signals a client listens
    to from now on (replacing the set its hello or last listen asked for), and the actions
    its command handler takes (None: it does not say). A hello carries the same two fields."""

    signals: frozenset[str] = frozenset()
    actions: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        message: dict[str, Any] = {"type": "listen", "listen": sorted(self.signals)}
        if self.actions is not None:
            message["actions"] = dict(self.actions)
        return message

    @classmethod
    def from_json(cls, raw: Any) -> Listen:
        msg = message_of(raw, "listen")
        return cls(parse_signals(msg), parse_actions(msg))


@dataclass(frozen=True)
class CommandResult:
    """The client's answer to a command: `{"type": "command_result", "id", "ok", "message"}`
    (the message cut at MAX_RESULT_MESSAGE characters, NUL removed)."""

    id: str
    ok: bool
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"type": "command_result", "id": self.id, "ok": self.ok, "message": self.message[:MAX_RESULT_MESSAGE]}

    @classmethod
    def from_json(cls, raw: Any) -> CommandResult:
        msg = message_of(raw, "command_result")
        command_id, ok, message = msg.get("id"), msg.get("ok"), msg.get("message", "")
        if not isinstance(command_id, str) or not 0 < len(command_id) <= 64:
            raise ProtocolError("command_result needs the command's id")
        if not isinstance(ok, bool):
            raise ProtocolError("command_result needs ok: true or false")
        if not isinstance(message, str):
            raise ProtocolError("command_result's message must be a string")
        return cls(command_id, ok, message[:MAX_RESULT_MESSAGE].replace("\x00", ""))


# -- the alert, and the signal messages --------------------------------------------------


@dataclass(frozen=True)
class Alert:
    """One alert (an episode of a rule on a run: pending -> firing -> resolved), as the server
    writes it everywhere: `GET /alerts`, the `alerts` and `alert` signals, the live socket and
    webhook events. The first nine fields are docs/protocol.md's; the rest the server adds."""

    id: int
    run_id: str
    rule: str
    """The rule's name."""
    metric: str
    """The rule's metric: one key, or comma-separated globs."""
    severity: str
    state: str
    """`pending`, `firing` or `resolved`."""
    started_step: int | None
    resolved_step: int | None
    message: str = ""
    keys: tuple[str, ...] = ()
    """The metric keys of `metric` (split at its commas)."""
    rule_id: int | None = None
    """None once the rule is deleted."""
    fingerprint: str = ""
    """The same for every episode of one (rule, run)."""
    fired_step: int | None = None
    value: float | None = None
    """The value that fired it (non-finite as the wire's strings)."""
    started_at: str | None = None
    """ISO 8601, UTC."""
    resolved_at: str | None = None
    silenced: bool = False
    acknowledged_at: str | None = None
    acknowledged_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "run_id": self.run_id,
            "rule": self.rule,
            "metric": self.metric,
            "severity": self.severity,
            "state": self.state,
            "started_step": self.started_step,
            "resolved_step": self.resolved_step,
            "message": self.message,
            "keys": list(self.keys),
            "rule_id": self.rule_id,
            "fingerprint": self.fingerprint,
            "fired_step": self.fired_step,
            "value": None if self.value is None else encode_value(self.value),
            "started_at": self.started_at,
            "resolved_at": self.resolved_at,
            "silenced": self.silenced,
            "acknowledged_at": self.acknowledged_at,
            "acknowledged_by": self.acknowledged_by,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Alert:
        """An alert from its JSON; `id`, `run_id`, `rule`, `severity` and `state` are required,
        the other fields may be absent (their defaults). Raises ProtocolError."""
        if not isinstance(raw, dict):
            raise ProtocolError(f"an alert must be a JSON object, not {type(raw).__name__}")
        value = raw.get("value")
        silenced = raw.get("silenced", False)
        if not isinstance(silenced, bool):
            raise ProtocolError("alert.silenced must be true or false")
        try:
            decoded = None if value is None else decode_value(value)
        except ProtocolError as exc:
            raise ProtocolError(f"alert.value: {exc}") from None
        return cls(
            id=require_int(raw, "id", "alert", 0, 2**63 - 1),
            run_id=string(raw, "run_id", "alert"),
            rule=string(raw, "rule", "alert"),
            metric=string(raw, "metric", "alert", default=""),
            severity=string(raw, "severity", "alert"),
            state=string(raw, "state", "alert"),
            started_step=opt_int(raw, "started_step", "alert"),
            resolved_step=opt_int(raw, "resolved_step", "alert"),
            message=string(raw, "message", "alert", default=""),
            keys=strings(raw, "keys", "alert") or (),
            rule_id=opt_int(raw, "rule_id", "alert"),
            fingerprint=string(raw, "fingerprint", "alert", default=""),
            fired_step=opt_int(raw, "fired_step", "alert"),
            value=decoded,
            started_at=opt_string(raw, "started_at", "alert"),
            resolved_at=opt_string(raw, "resolved_at", "alert"),
            silenced=silenced,
            acknowledged_at=opt_string(raw, "acknowledged_at", "alert"),
            acknowledged_by=opt_string(raw, "acknowledged_by", "alert"),
        )


@dataclass(frozen=True)
class AlertsMessage:
    """"alerts": the run's firing alerts, oldest first, sent once when a client starts
    listening to alerts (it replaces what the client held)."""

    run_id: str
    firing: tuple[Alert, ...]

    def to_json(self) -> dict[str, Any]:
        return {"type": "alerts", "run_id": self.run_id, "firing": [alert.to_json() for alert in self.firing]}

    @classmethod
    def from_json(cls, raw: Any) -> AlertsMessage:
        msg = message_of(raw, "alerts")
        firing = msg.get("firing")
        if not isinstance(firing, list):
            raise ProtocolError("alerts.firing must be a list of alerts")
        return cls(string(msg, "run_id", "alerts"), tuple(Alert.from_json(alert) for alert in firing))


@dataclass(frozen=True)
class AlertMessage:
    """"alert": one alert of the run changed (`alert.state` says to what). The live socket
    pushes the same message to pages."""

    run_id: str
    alert: Alert

    def to_json(self) -> dict[str, Any]:
        return {"type": "alert", "run_id": self.run_id, "alert": self.alert.to_json()}

    @classmethod
    def from_json(cls, raw: Any) -> AlertMessage:
        msg = message_of(raw, "alert")
        return cls(string(msg, "run_id", "alert message"), Alert.from_json(msg.get("alert")))


@dataclass(frozen=True)
class HazardMessage:
    """"hazard": the run's collapse hazard at `step` (docs/alerts.md, "Collapse hazard")."""

    run_id: str
    step: int
    hazard: float

    def to_json(self) -> dict[str, Any]:
        return {"type": "hazard", "run_id": self.run_id, "step": self.step, "hazard": self.hazard}

    @classmethod
    def from_json(cls, raw: Any) -> HazardMessage:
        msg = message_of(raw, "hazard")
        return cls(string(msg, "run_id", "hazard"), require_int(msg, "step", "hazard", 0, MAX_STEP), number(msg, "hazard", "hazard"))


@dataclass(frozen=True)
class CommandMessage:
    """"command": a command addressed to the run, not answered yet (sent at least once)."""

    run_id: str
    command: Command

    def to_json(self) -> dict[str, Any]:
        return {"type": "command", "run_id": self.run_id, "command": self.command.to_json()}

    @classmethod
    def from_json(cls, raw: Any) -> CommandMessage:
        msg = message_of(raw, "command")
        return cls(string(msg, "run_id", "command message"), Command.from_json(msg.get("command")))


Signal = AlertsMessage | AlertMessage | HazardMessage | CommandMessage
"""A signal the server sends a listening client."""

_DECODERS: dict[str, Callable[[Any], Signal]] = {
    "alerts": AlertsMessage.from_json,
    "alert": AlertMessage.from_json,
    "hazard": HazardMessage.from_json,
    "command": CommandMessage.from_json,
}
SIGNAL_TYPES = tuple(_DECODERS)
"""The `type` of each signal message."""


def read_signal(raw: Any) -> Signal | None:
    """The signal `raw` is; None for a message of another type. Raises ProtocolError for a
    signal that is malformed, or for anything but an object with a string `type`."""
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ProtocolError(f"a server message must be a JSON object with a string 'type': {str(raw)[:200]}")
    decode = _DECODERS.get(raw["type"])
    return None if decode is None else decode(raw)

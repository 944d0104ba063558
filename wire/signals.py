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

Stdlib only, like the rest of `wire`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from wire.errors import ProtocolError

__all__ = [
    "SIGNALS",
    "Command",
    "command_result_message",
    "listen_message",
    "parse_action",
    "parse_actions",
    "parse_command_result",
    "parse_listen",
]

SIGNALS = ("alerts", "hazard", "commands")
"""What a client may listen to, in the order the docs list them."""

ACTION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A command's action: `checkpoint`, `stop` or a name of the user's own."""
MAX_ACTIONS = 16
"""Actions a client may declare for its command handler."""
MAX_ACTION_TEXT = 200
"""Characters of an action's description kept (the rest is cut)."""
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
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str) or not isinstance(raw.get("action"), str):
            raise ValueError(f"not a command: {str(raw)[:200]}")
        payload = raw.get("payload")
        return cls(
            id=raw["id"],
            action=raw["action"],
            payload=payload if isinstance(payload, dict) else {},
            requested_by=str(raw.get("requested_by") or ""),
            created_at=float(raw.get("created_at") or 0.0),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "action": self.action,
            "payload": self.payload,
            "requested_by": self.requested_by,
            "created_at": self.created_at,
        }


def parse_action(raw: Any) -> str:
    if not isinstance(raw, str) or not ACTION.fullmatch(raw):
        raise ValueError("an action is 1-64 of [A-Za-z0-9_.-], starting with a letter or digit")
    return raw


def parse_listen(msg: dict[str, Any]) -> frozenset[str]:
    """The signals a hello or a listen message asks for. Names this server does not know are
    left out (a newer client may ask for more); anything but a list of strings is malformed."""
    raw = msg.get("listen")
    if raw is None:
        return frozenset()
    if not isinstance(raw, list) or not all(isinstance(name, str) for name in raw):
        raise ProtocolError("listen must be a list of signal names")
    return frozenset(name for name in raw if name in SIGNALS)


def parse_actions(msg: dict[str, Any]) -> dict[str, str] | None:
    """The actions a hello or a listen message declares its command handler takes, each with
    what it does; None when it declares none (a client that does not say)."""
    raw = msg.get("actions")
    if raw is None:
        return None
    if not isinstance(raw, dict) or len(raw) > MAX_ACTIONS:
        raise ProtocolError(f"actions must be an object of at most {MAX_ACTIONS} action names to descriptions")
    actions: dict[str, str] = {}
    for name, text in raw.items():
        if not isinstance(name, str) or not ACTION.fullmatch(name) or not isinstance(text, str):
            raise ProtocolError(f"actions: {str(name)[:64]!r} is not an action name (1-64 of [A-Za-z0-9_.-]) with a text")
        actions[name] = text[:MAX_ACTION_TEXT].replace("\x00", "")
    return actions


def listen_message(signals: frozenset[str] | set[str], actions: dict[str, str] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "listen", "listen": sorted(signals)}
    if actions is not None:
        message["actions"] = actions
    return message


def parse_command_result(msg: dict[str, Any]) -> tuple[str, bool, str]:
    """(command id, ok, message) of a `command_result`."""
    command_id, ok, message = msg.get("id"), msg.get("ok"), msg.get("message", "")
    if not isinstance(command_id, str) or not 0 < len(command_id) <= 64:
        raise ProtocolError("command_result needs the command's id")
    if not isinstance(ok, bool):
        raise ProtocolError("command_result needs ok: true or false")
    if not isinstance(message, str):
        raise ProtocolError("command_result's message must be a string")
    return command_id, ok, message[:MAX_RESULT_MESSAGE].replace("\x00", "")


def command_result_message(command_id: str, ok: bool, message: str = "") -> dict[str, Any]:
    return {"type": "command_result", "id": command_id, "ok": ok, "message": message[:MAX_RESULT_MESSAGE]}

"""What the server pushes to a browser on `/api/v1/live?runs=<id>,<id>` (docs/protocol.md,
"Live"): what `dashboard/assets/live/` reads. The browser sends nothing on that socket (it
names its runs in the query string), so every live message goes server -> browser.

- "points": `{"type": "points", "run_id": ..., "rows": [...]}`, rows of the run just
  committed, encoded as in an ingest frame (`encode_rows`) but without their step details
  (up to 64 KiB of samples a step: pages read those over REST). Non-finite values travel as
  the wire's strings ("nan", "inf", "-inf").
- "status": `{"type": "status", "run_id": ..., "status": ...}` when a run finishes.
- "alert": `{"type": "alert", "run_id", "alert": alert}` for an alert's change: the same
  message a listening trainer is sent, `wire.signals.AlertMessage`.

Each is a frozen dataclass with one encoder (`to_json()`, what the server sends) and one
decoder (`from_json`, a ProtocolError for a malformed message); `read_live` reads any of
them. Standard library only, like the rest of `wire`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wire.errors import ProtocolError
from wire.fields import message_of, string
from wire.messages import Limits, Row, encode_rows, parse_rows
from wire.signals import AlertMessage

__all__ = ["LIVE_TYPES", "Live", "LivePoints", "LiveStatus", "read_live"]

_LIMITS = Limits()
"""An ingest frame's bounds (the server's defaults), what live rows are read within."""


@dataclass(frozen=True)
class LivePoints:
    """"points": rows of the run just committed, without their step details (a row decoded
    from it has none, whatever the stored row had)."""

    run_id: str
    rows: list[Row]

    def to_json(self) -> dict[str, Any]:
        return {"type": "points", "run_id": self.run_id, "rows": encode_rows(self.rows, details=False)}

    @classmethod
    def from_json(cls, raw: Any, limits: Limits = _LIMITS) -> LivePoints:
        """The rows are read as an ingest frame's (`parse_rows`, within `limits`)."""
        msg = message_of(raw, "points")
        run_id = string(msg, "run_id", "points")
        try:
            rows = parse_rows(msg.get("rows"), limits)
        except ProtocolError as exc:
            raise ProtocolError(f"live points: {exc}", code=exc.code, close_code=exc.close_code) from None
        return cls(run_id, rows)


@dataclass(frozen=True)
class LiveStatus:
    """"status": the run finished; `status` is its new status (`finished`, `failed` or
    `killed` today; a status a newer server sends is kept as it is)."""

    run_id: str
    status: str

    def to_json(self) -> dict[str, Any]:
        return {"type": "status", "run_id": self.run_id, "status": self.status}

    @classmethod
    def from_json(cls, raw: Any) -> LiveStatus:
        msg = message_of(raw, "status")
        return cls(string(msg, "run_id", "status"), string(msg, "status", "status"))


Live = LivePoints | LiveStatus | AlertMessage
"""A message the server pushes to a browser on the live socket."""

_DECODERS: dict[str, Callable[[Any], Live]] = {
    "points": LivePoints.from_json,
    "alert": AlertMessage.from_json,
    "status": LiveStatus.from_json,
}
LIVE_TYPES = tuple(_DECODERS)
"""The `type` of each live message."""


def read_live(raw: Any) -> Live | None:
    """The live message `raw` is; None for a message of another type (one a newer server
    sends). Raises ProtocolError for a live message that is malformed, or for anything but
    an object with a string `type`."""
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ProtocolError(f"a live message must be a JSON object with a string 'type': {str(raw)[:200]}")
    decode = _DECODERS.get(raw["type"])
    return None if decode is None else decode(raw)

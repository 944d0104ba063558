"""What the server answers on the ingest socket (docs/protocol.md, "Ingest"): `welcome` to a
hello, `ack` or `reject` to each points frame, `bye` to finish, `error` before a close.

Each is a frozen dataclass with one encoder (`to_json()`, what the server sends) and one
decoder (`from_json`, what a client reads; a ProtocolError for a malformed message). Fields
a newer server may add are ignored, and a field a server before it did not send is None.
`read_reply` reads any of them. The signals a listening client is sent on the same socket
are in wire/signals.py. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wire.errors import ErrorMessage, ProtocolError
from wire.fields import message_of, require_int, string, strings
from wire.messages import MAX_SEQ

__all__ = ["REPLY_TYPES", "Ack", "Bye", "ErrorMessage", "Reject", "Reply", "Welcome", "read_reply"]


@dataclass(frozen=True)
class Welcome:
    """The answer to a hello: the run streamed and where this writer's frames stand."""

    run_id: str
    acked_seq: int
    """The highest seq of this writer's frames already stored; -1 for none."""
    accepts: tuple[str, ...] | None = None
    """The step details the server stores (`ACCEPTS`); None: it did not say (a server before
    step details, which stores none)."""
    signals: tuple[str, ...] | None = None
    """The signals a client may listen to (wire/signals.py `SIGNALS`); None: it sends none."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "welcome", "run_id": self.run_id, "acked_seq": self.acked_seq}
        if self.accepts is not None:
            out["accepts"] = list(self.accepts)
        if self.signals is not None:
            out["signals"] = list(self.signals)
        return out

    @classmethod
    def from_json(cls, raw: Any) -> Welcome:
        msg = message_of(raw, "welcome")
        return cls(
            string(msg, "run_id", "welcome"),
            require_int(msg, "acked_seq", "welcome", -1, MAX_SEQ),
            strings(msg, "accepts", "welcome"),
            strings(msg, "signals", "welcome"),
        )


@dataclass(frozen=True)
class Ack:
    """Every row of frame `seq` is committed (or was already: a resend)."""

    seq: int

    def to_json(self) -> dict[str, Any]:
        return {"type": "ack", "seq": self.seq}

    @classmethod
    def from_json(cls, raw: Any) -> Ack:
        return cls(require_int(message_of(raw, "ack"), "seq", "ack", 0, MAX_SEQ))


@dataclass(frozen=True)
class Reject:
    """The server will never store frame `seq` (it breaks the protocol); the seq is used up,
    so the writer goes on with the next frame. `code` is `malformed` or `too_large`."""

    seq: int
    code: str
    message: str

    @classmethod
    def of(cls, seq: int, error: ProtocolError) -> Reject:
        return cls(seq, error.code, str(error))

    def to_json(self) -> dict[str, Any]:
        return {"type": "reject", "seq": self.seq, "code": self.code, "message": self.message}

    @classmethod
    def from_json(cls, raw: Any) -> Reject:
        msg = message_of(raw, "reject")
        return cls(
            require_int(msg, "seq", "reject", 0, MAX_SEQ),
            string(msg, "code", "reject"),
            string(msg, "message", "reject", default=""),
        )

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


@dataclass(frozen=True)
class Bye:
    """The run is marked with the finish's status; the server closes (1000)."""

    def to_json(self) -> dict[str, Any]:
        return {"type": "bye"}

    @classmethod
    def from_json(cls, raw: Any) -> Bye:
        message_of(raw, "bye")
        return cls()


Reply = Welcome | Ack | Reject | Bye | ErrorMessage
"""A message the server answers an ingest client with."""

_DECODERS: dict[str, Callable[[Any], Reply]] = {
    "welcome": Welcome.from_json,
    "ack": Ack.from_json,
    "reject": Reject.from_json,
    "bye": Bye.from_json,
    "error": ErrorMessage.from_json,
}
REPLY_TYPES = tuple(_DECODERS)
"""The `type` of each reply."""


def read_reply(raw: Any) -> Reply | None:
    """The reply `raw` is; None for a message of another type (a signal, or one a newer server
    sends). Raises ProtocolError for a reply that is malformed, or for anything but an object
    with a string `type`."""
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise ProtocolError(f"a server message must be a JSON object with a string 'type': {str(raw)[:200]}")
    decode = _DECODERS.get(raw["type"])
    return None if decode is None else decode(raw)

"""The root of Keel's errors, the protocol's error, and the close codes it is sent with.

Here, in the stdlib-only package, because the trainer-side client and the server share
them: both catch `KeelError`, and both read the close codes (docs/protocol.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLOSE_AUTH",
    "CLOSE_CONFLICT",
    "CLOSE_FORBIDDEN",
    "CLOSE_IDLE",
    "CLOSE_MALFORMED",
    "CLOSE_OVERLOADED",
    "CLOSE_SERVER_FAULT",
    "CLOSE_TOO_LARGE",
    "ErrorMessage",
    "KeelError",
    "ProtocolError",
]

CLOSE_MALFORMED = 4400
CLOSE_AUTH = 4401
CLOSE_TOO_LARGE = 4413
CLOSE_OVERLOADED = 1013
CLOSE_SERVER_FAULT = 1011
CLOSE_IDLE = 4408
"""No hello within the server's hello timeout, or no frame within its idle timeout."""
CLOSE_FORBIDDEN = 4403
"""The token may not write to this run: it belongs to another token's name (docs/security.md)."""
CLOSE_CONFLICT = 4409
"""What the client sent contradicts what the server holds: a seq gap, a connection of the
same writer that another one superseded, a hello for a run of another project or for a
finished run. The error message's `code` says which (docs/protocol.md)."""


class KeelError(Exception):
    """The root of every error Keel raises on purpose (docs/architecture.md lists the tree)."""


class ProtocolError(KeelError, ValueError):
    """A message that breaks the protocol. `close_code` is what the server closes with."""

    def __init__(self, message: str, *, code: str = "malformed", close_code: int = CLOSE_MALFORMED):
        super().__init__(message)
        self.code = code
        self.close_code = close_code

    def to_message(self) -> dict[str, Any]:
        """The `error` message the server sends before it closes with `close_code`."""
        return ErrorMessage(self.code, str(self)).to_json()


@dataclass(frozen=True)
class ErrorMessage:
    """`{"type": "error", "code", "message"}`: what the server says before it closes an
    ingest socket (docs/protocol.md, "Errors"); the close code that follows decides what a
    client does. A rate-limited client is also told `retry_after_s`."""

    code: str
    message: str
    retry_after_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "error", "code": self.code, "message": self.message}
        if self.retry_after_s is not None:
            out["retry_after_s"] = self.retry_after_s
        return out

    @classmethod
    def from_json(cls, raw: Any) -> ErrorMessage:
        """Raises ProtocolError for anything but an error message (a missing `message` is "")."""
        if not isinstance(raw, dict) or raw.get("type") != "error":
            raise ProtocolError(f"not an error message: {str(raw)[:200]}")
        code, message, retry = raw.get("code"), raw.get("message", ""), raw.get("retry_after_s")
        if not isinstance(code, str):
            raise ProtocolError("error.code must be a string")
        if not isinstance(message, str):
            raise ProtocolError("error.message must be a string")
        if retry is not None and (isinstance(retry, bool) or not isinstance(retry, (int, float))):
            raise ProtocolError("error.retry_after_s must be a number")
        return cls(code, message, None if retry is None else float(retry))

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

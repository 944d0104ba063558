"""The root of Keel's errors, the protocol's error, and the close codes it is sent with.

Here, in the stdlib-only package, because the trainer-side client and the server share
them: both catch `KeelError`, and both read the close codes (docs/protocol.md).
"""

from __future__ import annotations

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
        return {"type": "error", "code": self.code, "message": str(self)}

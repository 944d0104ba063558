"""The server's errors: one tree under `KeelError` (trainer_hooks.protocol), so a caller
catches what Keel raises on purpose with one `except`. docs/architecture.md lists it.

    KeelError
    ├── ProtocolError      a frame or request body that breaks the wire protocol (4400/4413, 422)
    ├── SpoolBusyError     (client) another live process owns the run's spool
    ├── NotFound           a run, rule, alert, silence or webhook that does not exist (404)
    │   └── UnknownRun     the run of a points write, a read or a finish
    ├── InvalidRequest     a well-formed request the server will not carry out (422)
    └── ForbiddenTarget    a webhook URL that resolves to a private address (refused, not retried)
"""

from __future__ import annotations

from trainer_hooks.protocol import KeelError, ProtocolError

__all__ = ["ForbiddenTarget", "InvalidRequest", "KeelError", "NotFound", "ProtocolError", "UnknownRun"]


class NotFound(KeelError, LookupError):
    """The thing named does not exist."""


class UnknownRun(NotFound):
    """No run with this id has said hello."""


class InvalidRequest(KeelError, ValueError):
    """A request the server understood and refuses (a rule that cannot be built, say)."""


class ForbiddenTarget(InvalidRequest):
    """A webhook URL whose host resolves to a loopback, private or link-local address."""

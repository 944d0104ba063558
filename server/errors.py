"""The server's errors: one tree under `KeelError` (wire/errors.py), so a caller
catches what Keel raises on purpose with one `except`. docs/architecture.md lists it.

    KeelError
    ├── ProtocolError      a frame or request body that breaks the wire protocol (4400/4413, 422)
    │   └── TooLarge       what a run would grow past a bound: its metric keys, its config (413)
    ├── SpoolBusyError     (client) another live process owns the run's spool
    ├── NotFound           a run, rule, alert, silence or webhook that does not exist (404)
    │   └── UnknownRun     the run of a points write, a read or a finish
    ├── InvalidRequest     a well-formed request the server will not carry out (422)
    │   └── ForbiddenTarget a webhook URL that resolves to a private address (refused, not retried)
    ├── TooManyPending     a command for a run that holds as many undelivered ones as it may (429)
    ├── NotTaken           a command that no trainer of the run can take: it ended, or takes others (409)
    ├── Forbidden          a write to a run that belongs to another token's name (close 4403, 403)
    └── Conflict           contradicts what the server holds (close 4409, HTTP 409); `code` says what:
        ├── RunConflict    a hello for a run id that belongs to another project
        ├── SeqGap         a frame seq past the writer's next one (frames were skipped)
        └── Superseded     a connection of a writer that a newer connection took over
"""

from __future__ import annotations

from wire import CLOSE_TOO_LARGE, KeelError, ProtocolError

__all__ = [
    "Conflict",
    "Forbidden",
    "ForbiddenTarget",
    "InvalidRequest",
    "KeelError",
    "NotFound",
    "NotTaken",
    "ProtocolError",
    "RunConflict",
    "SeqGap",
    "Superseded",
    "TooLarge",
    "TooManyPending",
    "UnknownRun",
]


class TooLarge(ProtocolError):
    """A write that would take its run past one of the server's bounds: more distinct metric
    keys than `max_keys_per_run`, a config larger than `max_config_bytes`. Nothing of it is
    stored. A points frame is rejected (`reject`, code `too_large`), a hello closed with
    4413, a REST write answered 413."""

    def __init__(self, message: str):
        super().__init__(message, code="too_large", close_code=CLOSE_TOO_LARGE)


class NotFound(KeelError, LookupError):
    """The thing named does not exist."""


class UnknownRun(NotFound):
    """No run with this id has said hello. Its message is the API's 404 for the run."""

    def __init__(self, run_id: str):
        super().__init__(f"run {run_id!r} not found")
        self.run_id = run_id


class InvalidRequest(KeelError, ValueError):
    """A request the server understood and refuses (a rule that cannot be built, say)."""


class Forbidden(KeelError):
    """The token may not speak for this run: the run belongs to another token's name. Nothing
    of the run changes. Close 4403 on an ingest socket, 403 over REST."""


class TooManyPending(KeelError):
    """A run holds as many pending commands as it may (server/run_commands.py MAX_PENDING):
    its trainer is not taking them. Answered 429."""


class NotTaken(KeelError):
    """A command no trainer of its run can take: the run has ended, or its trainer said which
    actions it takes and this is not one of them. Answered 409; a rule's action is stored
    `failed` with the same words."""


class ForbiddenTarget(InvalidRequest):
    """A webhook URL whose host resolves to a loopback, private or link-local address."""


class Conflict(KeelError):
    """The request contradicts what the server holds; `code` names the conflict on the wire."""

    code = "conflict"

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class RunConflict(Conflict):
    code = "run_conflict"


class SeqGap(Conflict):
    code = "seq_gap"


class Superseded(Conflict):
    code = "superseded"

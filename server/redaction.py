"""No secret in a log line: credentials in URLs (and Keel's own secrets) are masked as
they are logged.

Keel refuses a token in a query string (server/auth.py), but a client may send one
anyway (`/api/v1/runs?token=...`), and uvicorn's access log writes every request's path
and query. The filter here rewrites each record before it is written: the value of a
query parameter named like a credential (`token`, `auth`, `authorization`, `password`, ...),
the password of a URL's userinfo (`postgresql://user:pass@host`), a `Bearer` token
(`Bearer%20...` in a URL too), anything shaped like a Keel API token or a webhook secret,
and the server's own secrets whatever their shape (the bootstrap token, the database
password) become `***`. It sits on the handlers that `keel serve` (and the tests' in-process server) log
through, so every logger that reaches them is covered.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from typing import Any

from uvicorn.config import LOGGING_CONFIG

from wire.redaction import MASK, mask_patterns

__all__ = ["MASK", "MIN_LITERAL_SECRET", "RedactSecrets", "logging_config", "redact"]

MIN_LITERAL_SECRET = 8
"""A secret given by value (`logging_config(secrets=...)`) is masked wherever it appears
when it is at least this long; a shorter one (compose's database password "keel") would
mask ordinary words, and is masked only where the patterns find it."""


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every credential the patterns find, and every one of `secrets` (the
    server's own, given by value), as `***`."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    return mask_patterns(text)


class RedactSecrets(logging.Filter):
    """Masks secrets in a record's message and traceback; drops no record. `secrets`: the
    server's own secrets by value (at least MIN_LITERAL_SECRET characters), masked wherever
    they appear, whatever their shape."""

    def __init__(self, name: str = "", secrets: Iterable[str] = ()):
        super().__init__(name)
        # Longest first: a secret that contains another is masked whole.
        self.secrets = sorted({s for s in secrets if s and len(s) >= MIN_LITERAL_SECRET}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.access" and isinstance(record.args, tuple):
            # Its formatter reads the arguments (client, method, path, version, status):
            # masked one by one, the path with its query among them.
            record.args = tuple(self._redacted(value) for value in record.args)
        else:
            try:
                message = record.getMessage()
            except Exception:  # a broken format: left for the handler to report, as ever
                return True
            masked = redact(message, self.secrets)
            if masked != message:  # masked after formatting: "password=%s" is one secret, not two parts
                record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            # What Formatter.format would write, masked; it uses exc_text when set.
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info), self.secrets)
        return True

    def _redacted(self, value: Any) -> Any:
        if value is None or isinstance(value, (bool, int, float)):
            return value  # as they are: %d must still format the status
        text = str(value)
        masked = redact(text, self.secrets)
        return value if masked == text else masked


def logging_config(*, keel_loggers: bool, secrets: Iterable[str | None] = ()) -> dict[str, Any]:
    """uvicorn's logging configuration with `RedactSecrets` on its handlers.

    `keel_loggers`: also send Keel's own loggers ("keel.*") to the same, filtered, stderr
    handler. For a process that Keel owns (`keel serve`); a process that embeds a server
    (the tests' in-process server) keeps its own logging of them. `secrets`: the server's own secrets
    by value (None for one not set), masked wherever they appear.
    """
    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"redact_secrets": {"()": RedactSecrets, "secrets": [s for s in secrets if s]}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact_secrets"]
    if keel_loggers:
        config["loggers"]["keel"] = {"handlers": ["default"], "propagate": False}  # level: the root's (WARNING)
    return config

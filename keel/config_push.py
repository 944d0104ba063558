"""A run's config that changes after the run exists, sent with `PATCH /api/v1/runs/{id}`.

A hello carries a run's config once, when it creates the run; a hello for a run that exists
keeps the stored config (docs/protocol.md). A trainer's logger goes on writing config after
training has started (wandb's `config.update`: verl and TRL add keys then), so `keel watch`
sends the whole config with this PATCH each time it changes. The server sets every top-level
key it names and keeps the others, so sending the same config again changes nothing: the
caller keeps the config last acknowledged in its durable state and sends again whatever a
crash may have left unacknowledged (at least once, harmlessly).

One request at a time, on a daemon thread: a slow or silent server never holds the caller's
loop (which streams the points). A request that failed is retried after a backoff (doubling,
up to `backoff_max`); one the server refused for what it is (a config too deep, a token without
the ingest scope) is reported as `final`: sending it again cannot help.

Standard library only (see keel/cli.py).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from wire.urls import api_url

__all__ = ["ConfigPush", "Sent", "api_url"]

FINAL_STATUSES = frozenset({400, 401, 403, 405, 413, 422})
"""Answers that say the request itself is refused: the same request gets the same answer.
(A 404 is retried: the run's hello may not have reached the server yet.)"""


@dataclass(frozen=True)
class Sent:
    """How one PATCH ended."""

    config: dict[str, Any]
    """The config it sent."""
    error: str | None
    """None: the server stored it (HTTP 200)."""
    final: bool = False
    """The server refused the request itself: sending the same config again cannot help."""


class ConfigPush:
    """The PATCHes of one run's config, at most one in flight."""

    def __init__(
        self,
        server_url: str,
        run_id: str,
        token: str | None = None,
        *,
        timeout: float = 10.0,
        backoff_initial: float = 0.5,
        backoff_max: float = 5.0,
    ) -> None:
        self.url = f"{api_url(server_url)}/runs/{urllib.parse.quote(run_id, safe='')}"
        self.timeout = timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._thread: threading.Thread | None = None
        self._outcome: Sent | None = None
        self._failures = 0
        self._next_try = 0.0

    @property
    def busy(self) -> bool:
        """A request is in flight, or its outcome has not been taken by `result()`."""
        return self._thread is not None or self._outcome is not None

    def send(self, config: dict[str, Any]) -> bool:
        """Start PATCHing `config` unless a request is in flight or the retry after a failed one
        is not due yet; whether it started. A config JSON cannot carry (NaN) ends at once, as
        a final `Sent`."""
        if self.busy or time.monotonic() < self._next_try:
            return False
        try:
            body = json.dumps({"config": config}, separators=(",", ":"), allow_nan=False).encode()
        except ValueError as exc:  # NaN or inf: JSON has no such number, and the server takes none
            self._outcome = Sent(config, f"the config cannot be sent as JSON ({exc})", final=True)
            return True
        self._thread = threading.Thread(target=self._patch, args=(config, body), name="keel-config-push", daemon=True)
        self._thread.start()
        return True

    def result(self) -> Sent | None:
        """The outcome of the request `send` started, once it has ended (then only once)."""
        thread = self._thread
        if thread is not None:
            if thread.is_alive():
                return None
            thread.join()
            self._thread = None
        outcome, self._outcome = self._outcome, None
        if outcome is None:
            return None
        if outcome.error is None or outcome.final:
            self._failures = 0
            self._next_try = 0.0
        else:
            self._failures += 1
            delay = min(self.backoff_max, self.backoff_initial * 2 ** (self._failures - 1))
            self._next_try = time.monotonic() + delay
        return outcome

    def _patch(self, config: dict[str, Any], body: bytes) -> None:
        request = urllib.request.Request(self.url, data=body, headers=self._headers, method="PATCH")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
            self._outcome = Sent(config, None)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            self._outcome = Sent(config, f"HTTP {exc.code}: {detail}", final=exc.code in FINAL_STATUSES)
        except Exception as exc:  # refused, reset, timed out, a broken answer: try again later
            self._outcome = Sent(config, str(getattr(exc, "reason", exc)) or type(exc).__name__)

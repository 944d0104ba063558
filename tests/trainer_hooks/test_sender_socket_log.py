"""The Sender's connection logs a keepalive failure as one warning line, not a traceback
(websockets logs it with exc_info when a busy server misses a ping)."""

from __future__ import annotations

import logging

import pytest

from trainer_hooks.sender import SocketLog


def test_a_keepalive_failure_is_one_warning_line_and_other_errors_pass_through(caplog: pytest.LogCaptureFixture) -> None:
    log = SocketLog(logging.getLogger("keel.socket"))
    with caplog.at_level(logging.DEBUG, logger="keel.socket"):
        try:
            raise TimeoutError("timed out while closing connection")
        except TimeoutError:
            log.error("keepalive ping failed", exc_info=True)  # what websockets' keepalive thread does
        log.error("unexpected %s", "thing")
    records = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert records == [
        ("WARNING", "keel: the server did not answer a keepalive ping in time; reconnecting", False),
        ("ERROR", "unexpected thing", False),
    ]

"""A server with auth on: the Monitor's token is sent; a refused token stops dialing and keeps the spool."""

from __future__ import annotations

import logging
import time

import pytest

from tests.support.monitor import (
    FAST,
    assert_every_step_once,
    headline,
    keel,
    servers,
)
from trainer_hooks.monitor import Monitor

make_server = pytest.fixture(name="make_server")(servers)

TOKEN = "keel_test-admin-token-0123456789"


def test_token_is_sent_and_accepted(make_server, sqlite_url, tmp_path, monkeypatch) -> None:
    server = make_server(sqlite_url, token=TOKEN)
    monkeypatch.setenv("KEEL_TOKEN", TOKEN)  # the default for token=None
    with Monitor(server.url, run_name="authed", spool_dir=tmp_path, sender_config=FAST) as monitor:
        for step in range(30):
            monitor.log(step, headline(step))
    assert_every_step_once(server, monitor.run_id, 30)
    assert server.run(monitor.run_id)["status"] == "finished"


def test_refused_token_keeps_the_spool_for_keel_sync(
    make_server, sqlite_url, tmp_path, caplog
) -> None:
    server = make_server(sqlite_url, token=TOKEN)
    monitor = Monitor(
        server.url, run_name="refused", token="keel_wrong", spool_dir=tmp_path, sender_config=FAST
    )
    for step in range(40):
        monitor.log(step, headline(step))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="keel"):
        assert monitor.finish(timeout=20) is False
    # Refused credentials are final: finish() does not sit out its timeout redialing.
    assert time.monotonic() - started < 5
    assert "refused our credentials" in caplog.text and "--token" in caplog.text
    assert f"keel sync {monitor.spool_path}" in caplog.text
    assert server.last_step(monitor.run_id) == -1

    refused = keel("sync", str(tmp_path), "--token", "keel_still_wrong", "--timeout", "10")
    assert refused.returncode == 1
    assert (tmp_path / monitor.run_id).exists()
    accepted = keel("sync", str(tmp_path), "--token", TOKEN)
    assert accepted.returncode == 0, accepted.stderr
    assert_every_step_once(server, monitor.run_id, 40)
    assert server.run(monitor.run_id)["status"] == "finished"

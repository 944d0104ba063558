"""An acknowledged row is stored exactly once through faults: the database dropping every
connection mid-run (what a PostgreSQL restart does to a server), and two Monitors
streaming one run at once."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.monitor import FAST, assert_every_step_once, headline, servers
from trainer_hooks.monitor import Monitor

make_server = pytest.fixture(name="make_server")(servers)


def test_every_acked_step_is_stored_once_when_the_database_drops_its_connections(
    make_server, postgres_url, drop_connections, tmp_path
) -> None:
    server = make_server(postgres_url)
    monitor = Monitor(server.url, run_name="pg-drops", spool_dir=tmp_path, sender_config=FAST)
    dropped = 0
    for step in range(300):
        monitor.log(step, headline(step))
        if step % 75 == 40:
            dropped += drop_connections(postgres_url)
        time.sleep(0.005)
    assert monitor.finish(timeout=60)
    assert dropped > 0  # the server really lost its connections
    assert_every_step_once(server, monitor.run_id, 300)
    assert server.run(monitor.run_id)["status"] == "finished"


def test_two_monitors_streaming_one_run_at_once_store_every_step_once(make_server, sqlite_url, tmp_path) -> None:
    """Two writers of one run (a run resumed elsewhere while the first still streams)."""
    server = make_server(sqlite_url)
    first = Monitor(server.url, run_name="twice", spool_dir=tmp_path / "a", sender_config=FAST)
    second = Monitor(server.url, run_name="twice", run_id=first.run_id, spool_dir=tmp_path / "b", sender_config=FAST)

    def stream(monitor: Monitor, steps: range) -> None:
        for step in steps:
            monitor.log(step, headline(step))
            time.sleep(0.002)

    threads = [
        threading.Thread(target=stream, args=(first, range(0, 200, 2))),
        threading.Thread(target=stream, args=(second, range(1, 200, 2))),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert second.finish(timeout=60) and first.finish(timeout=60)
    assert_every_step_once(server, first.run_id, 200)

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


def test_a_trainer_that_ends_before_its_frames_are_acked_ends_its_run_with_them_counted(make_server, sqlite_url, tmp_path) -> None:
    """The server stops answering (paused, its socket open) while the trainer ends: finish()
    gives up at its timeout, and the run is shown as finished with the frames it never got
    counted (not silent); the spool keeps them and `keel sync` sends them."""
    import os
    import signal

    from tests.support.monitor import keel

    server = make_server(sqlite_url)
    monitor = Monitor(server.url, run_name="ends-early", spool_dir=tmp_path, sender_config=FAST)
    monitor.log(0, headline(0))
    deadline = time.monotonic() + 30
    while server.last_step(monitor.run_id) != 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.process is not None
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)
    woken = threading.Timer(2.0, os.kill, (pid, signal.SIGCONT))  # while finish() says its last word
    try:
        for step in range(1, 400):
            monitor.log(step, headline(step))
            time.sleep(0.005)  # frames are cut as the steps come: more than the sender has in flight
        woken.start()
        assert not monitor.finish(timeout=1)  # the server is still paused at the deadline
    finally:
        woken.join()
        os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + 30
    while server.run(monitor.run_id)["status"] != "finished" and time.monotonic() < deadline:
        time.sleep(0.1)
    shown = server.run(monitor.run_id)
    assert shown["status"] == "finished" and shown["unsent"] and shown["unsent"] > 0, shown
    synced = keel("sync", "--server", server.url, str(tmp_path))
    assert synced.returncode == 0, synced.stderr
    assert_every_step_once(server, monitor.run_id, 400)
    assert server.run(monitor.run_id)["unsent"] is None

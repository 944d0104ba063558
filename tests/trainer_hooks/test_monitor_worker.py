"""The Monitor's worker process, against a real `keel serve`: killed, it is restarted on the
same spool; orphaned by a SIGKILLed trainer, it spools what it had and exits at once."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest

from tests.support.monitor import (
    FAST,
    assert_every_step_once,
    headline,
    keel,
    python_process,
    servers,
    spooled_steps,
    wait_until,
)
from trainer_hooks.monitor import Monitor

make_server = pytest.fixture(name="make_server")(servers)


def _alive(pid: int) -> bool:
    """Running (a zombie nobody reaped, as under a container's bare PID 1, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_a_killed_worker_is_restarted_and_the_run_goes_on(
    make_server, sqlite_url, tmp_path, caplog
) -> None:
    server = make_server(sqlite_url)
    monitor = Monitor(server.url, run_name="restart", spool_dir=tmp_path, sender_config=FAST)
    for step in range(100):
        monitor.log(step, headline(step))
    wait_until(lambda: server.last_step(monitor.run_id) == 99, what="first 100 steps stored")
    first = monitor._link.pid
    assert first is not None and _alive(first)
    with caplog.at_level(logging.WARNING, logger="keel"):
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: monitor._link.pid not in (None, first), what="a new worker")
        for step in range(100, 200):
            monitor.log(step, headline(step))
        assert monitor.finish(timeout=60)
    assert "exited (code -9) before the run finished" in caplog.text
    assert monitor.dropped == {}
    assert_every_step_once(server, monitor.run_id, 200)
    assert server.run(monitor.run_id)["status"] == "finished"


def test_a_sigkilled_trainer_leaves_the_spool_to_keel_sync_and_no_process_behind(
    make_server, sqlite_url, tmp_path
) -> None:
    server = make_server(sqlite_url, start=False)
    code = f"""
        import time
        from tests.support.monitor import headline
        from trainer_hooks.monitor import Monitor
        from trainer_hooks.sender import SenderConfig
        monitor = Monitor({server.url!r}, run_name="orphan", spool_dir={str(tmp_path)!r},
                          sender_config=SenderConfig(flush_interval=5.0))
        print(monitor.run_id, monitor._link.pid, flush=True)
        for step in range(300):
            monitor.log(step, headline(step))
        print("logged", flush=True)
        time.sleep(600)
    """
    with python_process(code) as trainer:
        assert trainer.stdout is not None
        run_id, pid = trainer.stdout.readline().split()
        assert trainer.stdout.readline().strip() == "logged"
        # Killed well inside the 5 s batching window: nothing is spooled yet.
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
    killed = time.monotonic()
    wait_until(lambda: not _alive(int(pid)), timeout=15, what="the worker to exit")
    assert time.monotonic() - killed < 10.0  # the finish timeout of a killed run
    assert spooled_steps(tmp_path / run_id) == list(range(300))
    server.start()
    result = keel("sync", str(tmp_path / run_id))
    assert result.returncode == 0, result.stderr
    assert_every_step_once(server, run_id, 300)
    assert server.run(run_id)["status"] == "killed"


def test_a_worker_that_keeps_dying_is_replaced_by_one_on_a_thread(
    make_server, sqlite_url, tmp_path
) -> None:
    """After the worker process died four times, the Monitor runs it on a thread of the
    trainer: slower for the learner, but the run goes on with every step."""
    server = make_server(sqlite_url)
    monitor = Monitor(server.url, run_name="dying", spool_dir=tmp_path, sender_config=FAST)
    step = 0
    for _ in range(4):
        for _ in range(25):
            monitor.log(step, headline(step))
            step += 1
        done = step - 1
        wait_until(
            lambda done=done: server.last_step(monitor.run_id) == done, what="steps stored"
        )
        pid = monitor._link.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda pid=pid: monitor._link.pid != pid, what="the next worker")
    assert monitor._link.pid is None  # the thread
    for _ in range(25):
        monitor.log(step, headline(step))
        step += 1
    assert monitor.finish(timeout=60)
    assert_every_step_once(server, monitor.run_id, 125)

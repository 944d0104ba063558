"""`keel sync` and lost acks, against a real `keel serve` subprocess."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
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
from trainer_hooks.sender import ConnState, upload
from trainer_hooks.spool import Spool
from wire import RunInfo

make_server = pytest.fixture(name="make_server")(servers)

TRAINER = """
    import sys, time
    from tests.support.monitor import headline
    from trainer_hooks.monitor import Monitor
    from trainer_hooks.sender import SenderConfig

    config = SenderConfig(flush_interval=0.05, backoff_initial=0.05, backoff_max=0.3)
    monitor = Monitor({url!r}, run_name="doomed", spool_dir={root!r}, sender_config=config)
    print(monitor.run_id, flush=True)
    for step in range({half}):
        monitor.log(step, headline(step))
        time.sleep(0.002)
    print("half", flush=True)
    sys.stdin.readline()  # the test kills the server meanwhile
    for step in range({half}, {steps}):
        monitor.log(step, headline(step))
    print("logged", flush=True)
    time.sleep(600)  # still "training" when SIGKILL arrives
"""


@pytest.mark.postgres
def test_keel_sync_uploads_what_a_sigkilled_trainer_left(
    make_server, database_url, tmp_path
) -> None:
    server = make_server(database_url)
    root = tmp_path / "spool"
    steps, half = 400, 150
    code = TRAINER.format(url=server.url, root=str(root), half=half, steps=steps)
    with python_process(code, stdin=subprocess.PIPE) as trainer:
        assert trainer.stdout is not None and trainer.stdin is not None
        run_id = trainer.stdout.readline().strip()
        assert trainer.stdout.readline().strip() == "half"
        # Part of the run reached the server before it went away.
        wait_until(lambda: server.last_step(run_id) == half - 1, what="first half stored")
        server.kill()
        trainer.stdin.write("go\n")
        trainer.stdin.flush()
        assert trainer.stdout.readline().strip() == "logged"
        wait_until(lambda: sorted(spooled_steps(root / run_id)) == list(range(steps)), what="spool")
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
    server.start()
    assert server.run(run_id)["status"] == "running"
    result = keel("sync", str(root))
    assert result.returncode == 0, result.stderr
    assert f"({run_id})" in result.stdout and "status killed" in result.stdout
    assert_every_step_once(server, run_id, steps)
    run = server.run(run_id)
    assert (run["status"], run["last_step"]) == ("killed", steps - 1)
    assert not (root / run_id).exists()
    # Nothing left to do: a second sync finds no spool and says so.
    assert keel("sync", str(root)).returncode == 1


def test_finish_timeout_keeps_the_spool_and_names_the_sync_command(
    make_server, sqlite_url, tmp_path, caplog
) -> None:
    server = make_server(sqlite_url, start=False)
    monitor = Monitor(server.url, run_name="late", spool_dir=tmp_path, sender_config=FAST)
    for step in range(50):
        monitor.log(step, headline(step))
    with caplog.at_level(logging.WARNING, logger="keel"):
        assert monitor.finish(timeout=1.0) is False
    assert monitor.spool_path is not None
    assert f"keel sync {monitor.spool_path}" in caplog.text
    assert sorted(spooled_steps(monitor.spool_path)) == list(range(50))
    assert json.loads((monitor.spool_path / "run.json").read_text())["status"] == "finished"
    monitor.log(50, headline(50))  # after finish: ignored, no error
    server.start()
    result = keel("sync", str(monitor.spool_path))
    assert result.returncode == 0, result.stderr
    assert_every_step_once(server, monitor.run_id, 50)
    assert server.run(monitor.run_id)["status"] == "finished"


def _spool_with_frames(
    path: Path, run: RunInfo, steps: int, per_frame: int, value_offset: float = 0.0
) -> None:
    """A fresh spool (no seq_base, nothing acked) holding `steps` rows of headline metrics."""
    for stale in ("run.json", "frames.jsonl", "acked.json"):
        (path / stale).unlink(missing_ok=True)
    spool = Spool.open(path, run=run)
    for start in range(0, steps, per_frame):
        rows = [
            {
                "step": step,
                "values": {key: value + value_offset for key, value in headline(step).items()},
            }
            for step in range(start, start + per_frame)
        ]
        spool.append(json.dumps(rows))
    spool.close()


@pytest.mark.parametrize("lost", ["acked_marker", "acked_marker_and_seq_base"])
def test_frames_resent_after_a_lost_ack_are_not_stored_twice(
    make_server, sqlite_url, tmp_path, lost
) -> None:
    """The server committed every frame but the client never recorded the acks.

    `acked_marker`: the welcome's acked_seq tells the client, which sends nothing again.
    `acked_marker_and_seq_base`: the client also forgot its numbering (and its writer id),
    so all 10 frames go out again as a new writer's, with different values: the server
    keeps the first values.
    """
    server = make_server(sqlite_url)
    run = RunInfo(id="5d0c3a52-6f0a-4f57-9a55-1d4c0e7f0001", name="lost-ack")
    path = tmp_path / run.id
    _spool_with_frames(path, run, steps=100, per_frame=10)
    spool = Spool.open(path)
    assert upload(spool, server.url, status="finished").state is ConnState.DONE
    spool.close()
    assert server.run(run.id)["acked_seq"] == 9

    # The acks are lost: the same frames are unacked in the spool again.
    (path / "acked.json").unlink()
    if lost == "acked_marker_and_seq_base":
        (path / "frames.jsonl").unlink()
        _spool_with_frames(path, run, steps=100, per_frame=10, value_offset=1000.0)
    spool = Spool.open(path)
    assert spool.unacked == 10
    assert spool.seq_base == (0 if lost == "acked_marker" else None)
    assert upload(spool, server.url, status="finished").state is ConnState.DONE
    spool.close()
    assert server.run(run.id)["acked_seq"] == 9  # the highest seq of any writer
    assert_every_step_once(server, run.id, 100)  # each step once, with its first value


def test_sync_reports_a_spool_in_use(tmp_path) -> None:
    run = RunInfo(id="5d0c3a52-6f0a-4f57-9a55-1d4c0e7f0002", name="busy")
    holder = Spool.open(tmp_path / run.id, run=run, server_url="http://127.0.0.1:9")
    try:
        result = keel("sync", str(tmp_path))
    finally:
        holder.close()
    assert result.returncode == 1
    assert "in use by another process" in result.stderr


def test_sync_of_a_sigkilled_trainer_that_never_reached_the_server(
    make_server, sqlite_url, tmp_path
) -> None:
    server = make_server(sqlite_url, start=False)
    code = f"""
        import time
        from tests.support.monitor import headline
        from trainer_hooks.monitor import Monitor
        from trainer_hooks.sender import SenderConfig
        monitor = Monitor({server.url!r}, run_name="offline", spool_dir={str(tmp_path)!r},
                          sender_config=SenderConfig(flush_interval=0.05))
        print(monitor.run_id, flush=True)
        for step in range(250):
            monitor.log(step, headline(step))
        time.sleep(600)
    """
    with python_process(code) as trainer:
        assert trainer.stdout is not None
        run_id = trainer.stdout.readline().strip()
        wait_until(lambda: spooled_steps(tmp_path / run_id) == list(range(250)), what="spool")
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
    server.start()
    result = keel("sync", str(tmp_path / run_id))
    assert result.returncode == 0, result.stderr
    assert_every_step_once(server, run_id, 250)
    assert server.run(run_id)["status"] == "killed"

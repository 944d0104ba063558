"""`keel watch FILE` on a console log that a writer appends to while it runs, against a real
server: the lines verl's own console logger prints and a loop's `[Step i/N] k=v` lines, a
watcher killed with SIGKILL mid-file, runs back to back in one log, a log rotated and
truncated under the watcher."""

from __future__ import annotations

import contextlib
import io
import json
import math
import time
from pathlib import Path
from typing import Any

import httpx

from keel.console import read_console
from tests.support.monitor import wait_until as _wait
from tests.support.watched import Watch
from tests.support.watched import api_get as _get
from tests.support.watched import stored_series as _series

RAY = "\x1b[36m(main_task pid=48213)\x1b[0m "


def verl_lines(rows: list[tuple[int, dict[str, object]]]) -> list[str]:
    """What verl 0.9.1's console logger prints, printed by it: verl/utils/logger/aggregate_logger.py
    `LocalLogger.log` -> `concat_dict_to_str` (`step:N - key:pprint.pformat(value) - ...`), the
    `console` backend of verl/utils/tracking.py `Tracking`."""
    from verl.utils.logger.aggregate_logger import LocalLogger

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for step, data in rows:
            LocalLogger(print_to_console=True).log(data, step=step)
    return out.getvalue().splitlines()


def verl_rows(steps: range, scale: float = 1.0) -> list[tuple[int, dict[str, object]]]:
    """verl's metrics per step as its trainer hands them to the logger (numpy scalars)."""
    import numpy as np

    return [(step, {"rollout_corr/k3_kl": np.float64(0.001 * step * scale), "critic/score/mean": np.float64(step / 7 * scale),
                    "actor/pg_loss": np.float64(math.nan) if step == 5 else np.float64(-0.5 + step / 1000),
                    "timing_s/gen": 12.25 + step, "response_length/max": np.int64(300 + step)})
            for step in steps]  # fmt: skip


def loop_lines(steps: range, total: int, offset: float = 0.0) -> list[str]:
    """A hand-written loop's progress lines, `[Step i/N] k=v ...`."""
    return [f"[Step {step}/{total}] loss={0.5 - step / 64 + offset!r} reward_avg={step / 3 + offset!r}" for step in steps]


def append(path: Path, lines: list[str], *, pause: float = 0.0) -> None:
    """Appends `lines` one by one, each flushed on its own, as a trainer's redirected stdout grows."""
    with path.open("a", encoding="utf-8") as handle:
        for line in lines:
            handle.write(line + "\n")
            handle.flush()
            time.sleep(pause)


def runs_of(url: str, project: str = "default") -> list[dict[str, Any]]:
    return sorted(httpx.get(f"{url}/api/v1/runs", params={"project": project}).json(), key=lambda run: run["name"])


def test_verl_and_step_lines_stream_as_they_are_appended_with_every_value_as_printed(server_factory, sqlite_url: str,
                                                                                     tmp_path: Path) -> None:  # fmt: skip
    server = server_factory(sqlite_url)
    verl_log, loop_log = tmp_path / "verl.log", tmp_path / "train.log"
    verl_log.write_text("INFO: starting the trainer\n")
    loop_log.touch()
    watch = Watch(tmp_path, server.url, [verl_log, loop_log], "--finish-after", "4").start()
    printed = verl_lines(verl_rows(range(1, 21)))
    try:
        append(verl_log, [RAY + line for line in printed[:10]], pause=0.02)
        append(loop_log, loop_lines(range(1, 11), 20), pause=0.02)
        verl_id, loop_id = read_console(verl_log)[0].run_id, read_console(loop_log)[0].run_id
        _wait(lambda: len(_series(server.url, verl_id, "mismatch/kl")) == 10, 60, "verl's first lines")
        _wait(lambda: len(_series(server.url, loop_id, "loss")) == 10, 60, "the loop's first lines")

        with verl_log.open("a") as handle:  # a line half written: waited for, then read whole
            handle.write(printed[10][:25])
            handle.flush()
            time.sleep(1.0)
            assert 11 not in _series(server.url, verl_id, "mismatch/kl")
            handle.write(printed[10][25:] + "\n")
        append(verl_log, printed[11:], pause=0.02)
        append(loop_log, loop_lines(range(11, 21), 20), pause=0.02)
        # Each run is finished once its log has been still for 4 s (a pause above may have
        # finished it early: it is then followed again, and finished with every point).
        _wait(lambda: "run 'verl': finished; 100 point(s) stored" in watch.output(), 60, "verl's run finished")
        _wait(lambda: "run 'train': finished; 40 point(s) stored" in watch.output(), 60, "the loop's run finished")
    finally:
        watch.stop()

    kl, reward, pg = (_series(server.url, verl_id, key) for key in ("mismatch/kl", "reward/mean", "loss/pg"))
    assert kl == {step: 0.001 * step for step in range(1, 21)}
    assert reward == {step: step / 7 for step in range(1, 21)}
    assert pg == {step: "nan" if step == 5 else -0.5 + step / 1000 for step in range(1, 21)}
    assert _series(server.url, verl_id, "response/length_max") == {step: 300.0 + step for step in range(1, 21)}
    keys = {entry["key"] for entry in _get(server.url, f"/runs/{verl_id}/keys")}
    assert keys == {"mismatch/kl", "reward/mean", "loss/pg", "verl/timing_s/gen", "response/length_max"}
    verl_run = _get(server.url, f"/runs/{verl_id}")
    assert verl_run["name"] == "verl" and verl_run["config"]["keel_watch"] == {
        "source": "console", "path": str(verl_log), "run": 1, "framework": "verl"}  # fmt: skip

    assert _series(server.url, loop_id, "loss") == {step: 0.5 - step / 64 for step in range(1, 21)}
    assert _series(server.url, loop_id, "reward_avg") == {step: step / 3 for step in range(1, 21)}
    assert _get(server.url, f"/runs/{loop_id}")["name"] == "train"
    assert _get(server.url, f"/runs/{verl_id}")["status"] == _get(server.url, f"/runs/{loop_id}")["status"] == "finished"
    assert [run["id"] for run in runs_of(server.url)] == [loop_id, verl_id]
    output = watch.output()
    assert "console log " + str(verl_log) + ": framework verl (" in output
    assert "run 'verl': the log has not grown for 4 s; marking the run finished" in output


def test_a_watcher_killed_mid_file_again_and_again_stores_every_step_once(server_factory, sqlite_url: str, tmp_path: Path) -> None:
    """SIGKILL at three points of a log a writer keeps appending to: each restart reads on from
    the saved offset, in the same run; every step is stored, none read twice."""
    import threading

    server = server_factory(sqlite_url)
    log = tmp_path / "verl.log"
    log.touch()
    printed = verl_lines(verl_rows(range(1, 121)))
    writer = threading.Thread(target=append, args=(log, printed), kwargs={"pause": 0.03})
    watch = Watch(tmp_path, server.url, [log]).start()
    writer.start()
    try:
        _wait(lambda: log.stat().st_size > 200, 30, "a first line")
        run_id = read_console(log)[0].run_id  # its first record names it
        for seen in (15, 45, 80):
            _wait(lambda seen=seen: len(_series(server.url, run_id, "reward/mean")) >= seen, 60, f"{seen} steps")
            watch.kill()  # no goodbye: whatever it held in memory is gone
            time.sleep(0.3)  # lines keep arriving with no one watching
            watch.start()
        writer.join(60)
        _wait(lambda: len(_series(server.url, run_id, "reward/mean")) == 120, 60, "every step")
    finally:
        watch.stop()
    assert _series(server.url, run_id, "reward/mean") == {step: step / 7 for step in range(1, 121)}
    assert _series(server.url, run_id, "mismatch/kl") == {step: 0.001 * step for step in range(1, 121)}
    (state,) = watch.states()
    # Each line was cut into a frame exactly once across the four watchers, into one run.
    assert state["rows"] == 120 and state["points"] == 600
    assert len(state["runs"]) == 1 and state["runs"][0]["run"]["id"] == run_id
    assert [run["id"] for run in runs_of(server.url)] == [run_id]
    assert state["cursor"]["offset"] == log.stat().st_size
    output = watch.output()
    assert output.count("keel watch: following") == 4  # four watchers...
    # ...and the framework decided and the run described once, by the first: the others read on.
    assert output.count("framework verl") == 1 and output.count("(its run 1) as run") == 1


def test_a_step_back_to_one_starts_a_second_run_unless_resume(server_factory, sqlite_url: str, tmp_path: Path) -> None:
    server = server_factory(sqlite_url)
    first, second = loop_lines(range(1, 11), 10), loop_lines(range(1, 16), 15, offset=100.0)
    split, resumed = tmp_path / "split" / "train.log", tmp_path / "resumed" / "sweep.log"
    for log in (split, resumed):
        log.parent.mkdir()
        log.touch()
    watch = Watch(tmp_path / "split", server.url, [split], "--finish-after", "60").start()
    resume_watch = Watch(tmp_path / "resumed", server.url, [resumed], "--resume", "--project", "resumed").start()
    try:
        for log in (split, resumed):
            append(log, first, pause=0.01)
        ids = [run.run_id for run in read_console(split)]
        _wait(lambda: len(_series(server.url, ids[0], "loss")) == 10, 60, "the first run")
        for log in (split, resumed):
            append(log, second, pause=0.01)
        ids = [run.run_id for run in read_console(split)]
        assert len(ids) == 2
        _wait(lambda: len(_series(server.url, ids[1], "loss")) == 15, 60, "the second run")
        _wait(lambda: (_get(server.url, f"/runs/{ids[0]}") or {}).get("status") == "finished", 60, "the first run finished")
        (one,) = [run.run_id for run in read_console(resumed, resume=True)]
        _wait(lambda: len(_series(server.url, one, "loss")) == 15, 60, "the resumed run")
    finally:
        watch.stop()
        resume_watch.stop()
    assert _series(server.url, ids[0], "loss") == {step: 0.5 - step / 64 for step in range(1, 11)}
    assert _series(server.url, ids[1], "loss") == {step: 0.5 - step / 64 + 100.0 for step in range(1, 16)}
    assert _series(server.url, ids[1], "reward_avg") == {step: step / 3 + 100.0 for step in range(1, 16)}
    runs = runs_of(server.url)
    assert [(run["id"], run["name"]) for run in runs] == [(ids[0], "train"), (ids[1], "train (2)")]
    assert _get(server.url, f"/runs/{ids[1]}")["status"] == "running"  # the log's last run: until --finish-after
    assert "run 'train': the step went back to 1: the next run began; marking the run finished" in watch.output()

    # --resume: one run; a step read again keeps its first value, the steps after it are new.
    assert [run["id"] for run in runs_of(server.url, "resumed")] == [one]
    assert _series(server.url, one, "loss") == {step: 0.5 - step / 64 + (100.0 if step > 10 else 0.0) for step in range(1, 16)}
    assert _get(server.url, f"/runs/{one}")["name"] == "sweep"


def test_a_rotated_then_truncated_log_is_followed_in_the_same_run_and_said_once_each(server_factory, sqlite_url: str,
                                                                                      tmp_path: Path) -> None:  # fmt: skip
    server = server_factory(sqlite_url)
    log = tmp_path / "train.log"
    log.touch()
    watch = Watch(tmp_path, server.url, [log]).start()
    try:
        append(log, loop_lines(range(1, 11), 30))
        run_id = read_console(log)[0].run_id
        _wait(lambda: len(_series(server.url, run_id, "loss")) == 10, 60, "the first file")
        # logrotate's default: the file renamed away (after two more lines the watcher has not
        # read yet, perhaps), a new one under the name.
        append(log, loop_lines(range(11, 13), 30))
        log.rename(tmp_path / "train.log.1")
        append(log, loop_lines(range(13, 21), 30))
        _wait(lambda: len(_series(server.url, run_id, "loss")) == 20, 60, "the new file")
        # copytruncate: the file cut to nothing in place, then written on.
        with log.open("r+") as handle:
            handle.truncate(0)
        append(log, loop_lines(range(21, 31), 30))
        _wait(lambda: len(_series(server.url, run_id, "loss")) == 30, 60, "the truncated file")
    finally:
        watch.stop()
    assert _series(server.url, run_id, "loss") == {step: 0.5 - step / 64 for step in range(1, 31)}
    assert [run["id"] for run in runs_of(server.url)] == [run_id]
    output = watch.output()
    assert output.count("was replaced by a new file; reading it from its start") == 1
    assert output.count("was truncated") == 1 and "reading it from its start" in output


def test_the_reader_hands_out_whole_lines_from_a_saved_cursor_and_drops_a_line_too_long(tmp_path: Path) -> None:
    from keel.readers import ConsoleLogReader

    log = tmp_path / "train.log"
    log.write_bytes(b"step=1 loss=0.5\npart")
    reader = ConsoleLogReader(str(log))
    assert reader.read().data == b"step=1 loss=0.5\n" and reader.waiting == 4
    again = ConsoleLogReader(str(log), json.loads(json.dumps(reader.cursor)))  # as watch.json keeps it
    with log.open("ab") as handle:
        handle.write("ial é\r".encode())
    assert again.read().data == "partial é\r".encode()
    with log.open("ab") as handle:
        handle.write(b"\n" + b"x" * (1 << 21))
    read = again.read()
    assert read.data == b"\n" and read.too_long == 1 and again.long_line
    with log.open("ab") as handle:
        handle.write(b"xx tail of it\nstep=2 loss=0.25\n")
    assert again.read().data == b"step=2 loss=0.25\n" and not again.long_line
    log.write_bytes(b"step=3 loss=0.125\n")  # cut in place and written again: shorter than what was read
    read = again.read()
    assert read.restarted == "truncated to 18 bytes" and read.data == b"step=3 loss=0.125\n"

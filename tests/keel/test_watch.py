"""`keel watch` against real servers, following logs that wandb's and TensorBoard's own
writers write while it runs (wandb offline in a child process, torch's SummaryWriter)."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from keel.importers import run_id_for
from keel.readers import WandbReader, reads_to_the_end
from tests.support.monitor import wait_until as _wait
from tests.support.raw_client import hello, new_run, open_ingest, points, recv
from tests.support.server import keel_serve
from tests.support.watched import Watch
from tests.support.watched import api_get as _get
from tests.support.watched import stored_series as _series

WANDB_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off"}


def _steps(url: str, run_id: str, key: str) -> list[int]:
    return sorted(_series(url, run_id, key))


_VERL_WRITER = """
import math, os, sys, time, wandb
root, phases = sys.argv[1], [int(n) for n in sys.argv[2].split(",")]
run = wandb.init(mode="offline", dir=root, project="rl", name="verl-grpo", id="w1",
                 config={{"actor_rollout_ref": {{"actor": {{"ppo_epochs": 1}}}}, "algorithm": {{"adv_estimator": "grpo"}}}})
step = 0
for phase, count in enumerate(phases):
    for _ in range(count):
        run.log({{"rollout_corr/k3_kl": 0.001 * (step + 1), "actor/pg_loss": -0.5 + step / 1000,
                 "critic/score/mean": step / 100, "actor/pg_clipfrac": 0.125, "note": "text"}}, step=step)
        step += 1
    go = os.path.join(root, f"go{{phase}}")
    while phase < len(phases) - 1 and not os.path.exists(go):
        time.sleep(0.1)
run.finish()
"""


def _verl_writer(root: Path, phases: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _VERL_WRITER.format(), str(root), phases],
                            env={**os.environ, **WANDB_ENV}, text=True, stderr=subprocess.PIPE)  # fmt: skip


def _welcome_acked_seq(ws_base: str, run: dict[str, Any], writer: str) -> int:
    from websockets.sync.client import connect

    with connect(f"{ws_base}/api/v1/ingest", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "hello", "protocol": 1, "run": run, "writer": writer}))
        return int(json.loads(ws.recv(timeout=10))["acked_seq"])


@pytest.mark.slow
def test_a_live_wandb_run_streams_exactly_through_a_killed_watcher_and_a_restarted_server(tmp_path: Path) -> None:
    """Steps arrive while the trainer runs; SIGKILL of the watcher and of the server between
    phases loses and repeats nothing; the exit record finishes the run; verl's names map."""
    logs = tmp_path / "logs"
    logs.mkdir()
    server = keel_serve(f"sqlite:///{tmp_path / 'keel.db'}", tmp_path / "server.log")
    server.start()
    watch = Watch(tmp_path, server.url, [logs]).start()
    writer = _verl_writer(logs, "20,20,20")
    run_id = run_id_for("wandb/rl/w1")
    try:
        # Phase 0 reaches the server while the trainer is still running (it waits for go0);
        # wandb writes a step's row once the next step is logged, so 19 steps of its 20.
        _wait(lambda: len(_steps(server.url, run_id, "mismatch/kl")) == 19, 90, "phase 0 live")
        assert writer.poll() is None
        run = _get(server.url, f"/runs/{run_id}")
        assert run["name"] == "verl-grpo" and run["status"] == "running"
        assert run["config"]["algorithm"] == {"adv_estimator": "grpo"}
        assert run["config"]["keel_watch"]["framework"] == "verl"
        assert "framework verl (it logs rollout_corr/k3_kl" in watch.output()

        watch.kill()  # SIGKILL: no goodbye, whatever it held in memory is gone
        (logs / "go0").touch()
        time.sleep(1.0)
        watch.start()
        _wait(lambda: len(_steps(server.url, run_id, "mismatch/kl")) == 39, 90, "phase 1 after the restart")
        server.kill()  # the server dies under the watcher
        (logs / "go1").touch()
        time.sleep(1.0)
        server.start()
        assert writer.wait(120) == 0, writer.stderr.read() if writer.stderr else ""
        _wait(lambda: (_get(server.url, f"/runs/{run_id}") or {}).get("status") == "finished", 90, "finished")
    finally:
        watch.stop()
        server.stop()
        if writer.poll() is None:
            writer.kill()
    server.start()
    try:
        kl = _series(server.url, run_id, "mismatch/kl")
        assert kl == {step: pytest.approx(0.001 * (step + 1)) for step in range(60)}
        assert _series(server.url, run_id, "loss/pg")[59] == pytest.approx(-0.5 + 59 / 1000)
        assert _series(server.url, run_id, "reward/mean")[30] == pytest.approx(0.3)
        assert _series(server.url, run_id, "policy/clip_frac")[0] == 0.125
        keys = {entry["key"] for entry in _get(server.url, f"/runs/{run_id}/keys")}
        assert keys == {"mismatch/kl", "loss/pg", "reward/mean", "policy/clip_frac"}
        (state,) = watch.states()
        # Every step was read once (one row each), and no frame was sent twice: the server
        # holds exactly the frames the watcher cut, under its one writer id.
        assert state["rows"] == 60 and state["points"] == 240
        assert state["skipped"] == {"verl/note\ttext": 60, "_runtime\twandb's own bookkeeping column": 60}
        described = {**state["run"], "config": {}}
        assert _welcome_acked_seq(server.ws_url, described, state["writer"]) == state["frames"] - 1
    finally:
        server.stop()
    assert "values of 'verl/note' not stored: text (counted)" in watch.output()


_LATE_CONFIG_WRITER = """
import os, sys, time, wandb
root = sys.argv[1]
run = wandb.init(mode="offline", dir=root, project="rl", name="late-config", id="cfg1",
                 config={"algorithm": {"adv_estimator": "grpo"}, "lr": 1e-6, "seed": 3})

def wait(name):
    while not os.path.exists(os.path.join(root, name)):
        time.sleep(0.1)

for step in range(10):
    run.log({"loss": step + 0.5}, step=step)
wait("go0")
run.config.update({"trainer": {"total_steps": 100}, "lr": 2e-6}, allow_val_change=True)  # as verl/TRL do mid-run
for step in range(10, 20):
    run.log({"loss": step + 0.5}, step=step)
wait("go1")
run.config.update({"after_restart": [1, 2]})
for step in range(20, 25):
    run.log({"loss": step + 0.5}, step=step)
run.finish()
"""


@pytest.mark.slow
def test_config_the_trainer_sets_after_its_first_steps_reaches_the_run_through_a_killed_watcher_and_server(tmp_path: Path) -> None:
    """wandb config records written after steps were logged: new keys added and changed ones
    updated on the Keel run; one read while the server is down survives a SIGKILL of the
    watcher (it is kept in the watcher's state until the server acknowledges it)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    server = keel_serve(f"sqlite:///{tmp_path / 'keel.db'}", tmp_path / "server.log")
    server.start()
    watch = Watch(tmp_path, server.url, [logs]).start()
    writer = subprocess.Popen([sys.executable, "-c", _LATE_CONFIG_WRITER, str(logs)],
                              env={**os.environ, **WANDB_ENV}, text=True, stderr=subprocess.PIPE)  # fmt: skip
    run_id = run_id_for("wandb/rl/cfg1")

    def config() -> dict[str, Any]:
        run = _get(server.url, f"/runs/{run_id}") or {"config": {}}
        return {key: value for key, value in run["config"].items() if key != "keel_watch"}

    first = {"algorithm": {"adv_estimator": "grpo"}, "lr": 1e-6, "seed": 3}
    second = {**first, "trainer": {"total_steps": 100}, "lr": 2e-6}
    try:
        _wait(lambda: len(_steps(server.url, run_id, "loss")) == 9, 90, "the first steps")
        assert config() == first  # the hello's: wandb's config as of the first step, no _wandb
        (logs / "go0").touch()
        _wait(lambda: config() == second, 90, "the config set after step 9")
        _wait(lambda: "run 'late-config': config updated on the server ('lr', 'trainer')" in watch.output(), 30, "the ack")

        server.kill()  # the next config record is read while the server is down...
        (logs / "go1").touch()
        assert writer.wait(120) == 0, writer.stderr.read() if writer.stderr else ""
        _wait(lambda: "after_restart" in watch.states()[0]["config"], 60, "the last config record read")
        _wait(lambda: "new config is not on the server yet" in watch.output(), 60, "a PATCH refused by a dead server")
        (state,) = watch.states()
        assert "after_restart" not in state["config_acked"]
        watch.kill()  # ...and the watcher dies holding it, unacknowledged
        server.start()
        watch.start()
        _wait(lambda: (_get(server.url, f"/runs/{run_id}") or {}).get("status") == "finished", 90, "finished")
        _wait(lambda: "after_restart" in config(), 60, "the config read before the SIGKILL")
    finally:
        watch.stop()
        server.stop()
        if writer.poll() is None:
            writer.kill()
    server.start()
    try:
        run = _get(server.url, f"/runs/{run_id}")
        assert config() == {**second, "after_restart": [1, 2]}
        assert run["config"]["keel_watch"]["source"] == "wandb" and run["config"]["keel_watch"]["wandb_id"] == "cfg1"
        assert _series(server.url, run_id, "loss") == {step: step + 0.5 for step in range(25)}
        (state,) = watch.states()
        assert state["config_acked"] == run["config"]  # what the watcher holds as acknowledged is what is stored
    finally:
        server.stop()
    assert watch.output().count("config updated on the server ('after_restart')") == 1


def _finished_wandb_run(root: Path, steps: int) -> Path:
    """A whole offline run written by wandb (not watched): a real transaction log to cut."""
    script = textwrap.dedent(
        """
        import sys, wandb
        run = wandb.init(mode="offline", dir=sys.argv[1], project="cut", name="cut", id="c1")
        for step in range(int(sys.argv[2])):
            run.log({"loss": step + 0.125, "marker": 777000.5 + step}, step=step)
        run.finish()
        """
    )
    child = subprocess.run([sys.executable, "-c", script, str(root), str(steps)], env={**os.environ, **WANDB_ENV},
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert child.returncode == 0, child.stderr
    (log,) = (root / "wandb").glob("offline-run-*/run-*.wandb")
    return log


def _history_steps(data: bytes, tmp: Path) -> list[int]:
    """Steps of the whole history records in `data`, read to the end by the reader both
    `keel watch` and `keel import` read with."""
    log = tmp / "history-steps.wandb"
    log.write_bytes(data)
    return [row.step for read in reads_to_the_end(WandbReader(str(log))) for row in read.rows if row.step is not None]


def _history_record_of(data: bytes, step: int) -> int:
    """Offset of the (single-fragment) history record of `step`, found by walking the log's
    framing: 7-byte file header, 32 KiB blocks of `crc u32 | length u16 | type u8 | data`."""
    from wandb.proto import wandb_internal_pb2

    pos = 7
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if room < 7 or (length == 0 and kind == 0):
            pos += room
            continue
        if kind == 1:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data[pos + 7 : pos + 7 + length])
            if record.WhichOneof("record_type") == "history" and record.history.step.num == step:
                return pos
        pos += 7 + length
    raise AssertionError(f"no history record of step {step}")


def test_a_partly_written_record_is_waited_for_and_a_corrupt_one_counted_and_skipped(server_factory, sqlite_url: str, tmp_path: Path) -> None:
    server = server_factory(sqlite_url)
    data = _finished_wandb_run(tmp_path / "source", 40).read_bytes()
    at = _history_record_of(data, 7) + 7 + 4  # a byte inside step 7's record (past its head)
    cut = data.index(json.dumps(777000.5 + 20).encode())  # the middle of step 20's record
    corrupt = bytearray(data)
    corrupt[at + 2] ^= 0x01  # step 7's record: its checksum no longer matches
    run_dir = tmp_path / "logs" / "wandb" / "offline-run-20260101_000000-c1"
    run_dir.mkdir(parents=True)
    log = run_dir / "run-c1.wandb"
    log.write_bytes(bytes(corrupt[:cut]))
    watch = Watch(tmp_path, server.url, [tmp_path / "logs"]).start()
    run_id = run_id_for("wandb/cut/c1")
    try:
        before = _history_steps(data[:cut], tmp_path)
        assert 20 not in before and 19 in before
        _wait(lambda: _steps(server.url, run_id, "loss") == [s for s in before if s != 7], 60, "the whole records")
        time.sleep(1.0)  # the torn record is still not taken
        assert _steps(server.url, run_id, "loss") == [s for s in before if s != 7]
        with log.open("ab") as handle:
            handle.write(bytes(corrupt[cut:]))
        _wait(lambda: "run 'cut': finished;" in watch.output(), 60, "finished")
    finally:
        watch.stop()
    assert _get(server.url, f"/runs/{run_id}")["status"] == "finished"
    assert _steps(server.url, run_id, "loss") == [s for s in range(40) if s != 7]
    assert _series(server.url, run_id, "loss")[20] == 20.125
    (state,) = watch.states()
    assert state["corrupt"] == 1
    assert "1 corrupt record(s) skipped" in watch.output()
    assert "finished; 78 point(s) stored; 1 corrupt record(s) skipped" in watch.output()


def test_tensorboard_event_files_stream_live_rotate_and_finish_when_idle(server_factory, sqlite_url: str, tmp_path: Path) -> None:
    from torch.utils.tensorboard import SummaryWriter

    server = server_factory(sqlite_url)
    logdir = tmp_path / "tb"
    (logdir / "ppo-s0").mkdir(parents=True)
    watch = Watch(tmp_path, server.url, [logdir], "--finish-after", "3", "--framework", "openrlhf").start()
    try:
        writer = SummaryWriter(str(logdir / "ppo-s0"))
        for step in range(5):
            writer.add_scalar("vllm_kl", 0.01 * step, step)
            writer.add_scalar("policy_loss", math.nan if step == 3 else 0.5, step)
        writer.add_histogram("weights", np.arange(3.0), 0)
        writer.flush()
        first = sorted(path.name for path in (logdir / "ppo-s0").iterdir())[0]
        run_id = run_id_for(f"tensorboard/ppo-s0/{first}")
        _wait(lambda: _steps(server.url, run_id, "mismatch/kl_k1") == [0, 1, 2, 3, 4], 60, "the first file, live")
        assert (_get(server.url, f"/runs/{run_id}") or {})["status"] == "running"
        time.sleep(1.1)  # event files are named by the second they were opened in
        writer.close()
        rotated = SummaryWriter(str(logdir / "ppo-s0"))  # a second event file in the same directory
        for step in range(5, 8):
            rotated.add_scalar("vllm_kl", 0.01 * step, step)
        rotated.flush()
        _wait(lambda: _steps(server.url, run_id, "mismatch/kl_k1") == list(range(8)), 60, "the rotated file")
        rotated.close()
        _wait(lambda: (_get(server.url, f"/runs/{run_id}") or {}).get("status") == "finished", 60, "idle finish")
    finally:
        watch.stop()
    assert _get(server.url, f"/runs/{run_id}")["name"] == "tb/ppo-s0"
    loss = _series(server.url, run_id, "loss/pg")
    assert loss[0] == 0.5 and loss[3] == "nan"
    assert "not stored: histograms 'weights'" in watch.output()


def _verl_alert_rows() -> list[dict[str, Any]]:
    """verl's names: flat k3 noise for 80 steps then a climb; a NaN policy loss at step 40."""
    rng = random.Random(3)
    kl = [1e-3 * math.exp(rng.gauss(0, 0.2)) for _ in range(80)] + [1e-3 * math.exp(0.05 * i) for i in range(80)]
    return [{"rollout_corr/k3_kl": value, "actor/pg_loss": math.nan if step == 40 else 0.1} for step, value in enumerate(kl)]


def _alerts(url: str, run_id: str) -> list[tuple[Any, ...]]:
    alerts = httpx.get(f"{url}/api/v1/alerts", params={"run_id": run_id}).json()
    return sorted((a["rule"], a["severity"], a["started_step"], a["fired_step"]) for a in alerts)


def test_default_rules_fire_on_a_watched_run_at_the_steps_they_fire_on_keel_names(server_factory, sqlite_url: str, tmp_path: Path) -> None:
    """A NaN in verl's policy loss pages, its climbing k3 mismatch warns and (verl logging no
    largest ratio) pages as mismatch drift: at the same steps as the same numbers streamed
    under Keel's own names."""
    server = server_factory(sqlite_url)
    rows = _verl_alert_rows()
    reference = new_run("reference")
    keel_rows = [{"step": step, "values": {"mismatch/kl": row["rollout_corr/k3_kl"], "loss/pg": "nan" if step == 40 else 0.1}}
                 for step, row in enumerate(rows)]  # fmt: skip
    with open_ingest(server) as ws:
        hello(ws, reference)
        for seq, start in enumerate(range(0, len(keel_rows), 10)):
            ws.send(points(seq, keel_rows[start : start + 10]))
            assert recv(ws)["type"] == "ack"
    expected = _wait(lambda: (lambda a: a if len(a) == 3 else None)(_alerts(server.url, reference["id"])), 30, "reference alerts")
    assert [(rule, severity) for rule, severity, *_ in expected] == [
        ("mismatch climbing", "warning"), ("mismatch drift", "critical"), ("non-finite value", "critical")
    ]
    assert expected[2][2] == 40 and expected[0][2] > 80 and expected[1][2] > 110  # drift: 30 steps' settle after its baseline

    script = textwrap.dedent(
        """
        import json, sys, wandb
        run = wandb.init(mode="offline", dir=sys.argv[1], project="rl", name="verl-alerts", id="a1")
        for step, row in enumerate(json.loads(sys.argv[2])):
            run.log(row, step=step)
        run.finish()
        """
    )
    logs = tmp_path / "logs"
    logs.mkdir()
    watch = Watch(tmp_path, server.url, [logs]).start()
    try:
        child = subprocess.run([sys.executable, "-c", script, str(logs), json.dumps(rows)],
                               env={**os.environ, **WANDB_ENV}, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert child.returncode == 0, child.stderr
        run_id = run_id_for("wandb/rl/a1")
        watched = _wait(lambda: (lambda a: a if len(a) == 3 else None)(_alerts(server.url, run_id)), 60, "watched alerts")
    finally:
        watch.stop()
    assert watched == expected

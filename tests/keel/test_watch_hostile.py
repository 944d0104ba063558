"""`keel watch` on logs that real trainers write now and then, or that someone wrote to hurt
it: a record larger than a read, a NUL in a metric name, a run name longer than the server
takes, a run the server refuses whatever is sent, event files linked from outside the
watched folder; and `keel import` of the same logs, which reads them with the same readers
and names them the same way. The logs are written here byte by byte in the loggers' own formats (wandb's
LevelDB-framed transaction log, TensorBoard's TFRecords), the servers are real."""

from __future__ import annotations

import argparse
import json
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from keel.importers import run_id_for
from keel.readers import TensorboardReader, WandbReader, masked_crc32c
from keel.watch import Options, Watcher
from tests.support.monitor import wait_until as _wait
from tests.support.watched import api_get as _get
from tests.support.watched import stored_series as _series

BIG = 9 * 1024 * 1024
"""A record payload larger than a reader's read (8 MiB): an image or a tensor, say."""


# -- the loggers' formats, by hand --------------------------------------------------------


def _wandb_log(records: list[bytes]) -> bytes:
    """A `.wandb` transaction log: the 7-byte header, then LevelDB's log format: 32 KiB
    blocks of `crc32 u32 | length u16 | type u8 | data` fragments (1 full, 2 first, 3 middle,
    4 last), a block's last < 7 bytes zero-filled."""
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for payload in records:
        first = True
        while True:
            room = 32768 - len(out) % 32768
            if room < 7:
                out += bytes(room)
                continue
            chunk, payload = payload[: room - 7], payload[room - 7 :]
            kind = (1 if not payload else 2) if first else (4 if not payload else 3)
            out += struct.pack("<IHB", zlib.crc32(chunk, zlib.crc32(bytes([kind]))), len(chunk), kind) + chunk
            first = False
            if not payload:
                break
    return bytes(out)


def _wandb_run(run_id: str, name: str, project: str = "p", config: dict[str, Any] | None = None) -> bytes:
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()
    record.run.run_id, record.run.display_name, record.run.project = run_id, name, project
    for key, value in (config or {}).items():
        record.run.config.update.add(key=key, value_json=json.dumps(value))
    return bytes(record.SerializeToString())


def _wandb_row(step: int, items: dict[str, Any]) -> bytes:
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()
    record.history.step.num = step
    for key, value in {**items, "_step": step, "_timestamp": 1.7e9 + step}.items():
        record.history.item.add(key=key, value_json=json.dumps(value))
    return bytes(record.SerializeToString())


def _wandb_exit(code: int = 0) -> bytes:
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()
    record.exit.exit_code = code
    return bytes(record.SerializeToString())


def _tfrecords(events: list[bytes]) -> bytes:
    """TFRecords: `length u64 | masked crc32c of the length u32 | data | masked crc32c u32`."""
    out = bytearray()
    for data in events:
        head = struct.pack("<Q", len(data))
        out += head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data))
    return bytes(out)


def _tf_scalar(step: int, tag: str, value: float) -> bytes:
    from tensorboard.compat.proto import event_pb2, summary_pb2

    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    return bytes(event_pb2.Event(step=step, wall_time=1.7e9 + step, summary=summary).SerializeToString())


def _tf_image(step: int, tag: str, size: int) -> bytes:
    from tensorboard.compat.proto import event_pb2, summary_pb2

    image = summary_pb2.Summary.Image(height=1024, width=1024, colorspace=3, encoded_image_string=os.urandom(size))
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, image=image)])
    return bytes(event_pb2.Event(step=step, wall_time=1.7e9 + step, summary=summary).SerializeToString())


def _tf_version() -> bytes:
    from tensorboard.compat.proto import event_pb2

    return bytes(event_pb2.Event(wall_time=1.7e9, file_version="brain.Event:2").SerializeToString())


# -- a watcher in this process ------------------------------------------------------------


@contextmanager
def _watching(paths: list[Path], server_url: str, state: Path, project: str = "default",
              framework: str = "none") -> Iterator[list[str]]:  # fmt: skip
    """`keel watch PATHS` run in a thread; yields the lines it says, as it says them."""
    args = argparse.Namespace(server=server_url, token=None, project=project, group=None, tag=[], framework=framework,
                              state=state, finish_after=600.0, resume=False)  # fmt: skip
    said: list[str] = []
    watcher = Watcher(paths, Options(args), interval=0.05, scan_interval=0.2, say=said.append)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        yield said
    finally:
        watcher.stop()
        thread.join(30)
        assert not thread.is_alive()


def _said(said: list[str], text: str) -> list[str]:
    return [line for line in said if text in line]


# -- 1. a record larger than a read ---------------------------------------------------------


def test_a_wandb_record_larger_than_a_read_is_skipped_once_and_the_steps_after_it_are_read(tmp_path: Path) -> None:
    records = [_wandb_run("big1", "big")] + [_wandb_row(step, {"loss": step + 0.5}) for step in range(5)]
    records += [_wandb_row(5, {"loss": 5.5, "table": "x" * BIG})]
    records += [_wandb_row(step, {"loss": step + 0.5}) for step in range(6, 10)] + [_wandb_exit()]
    data = _wandb_log(records)
    big_end = len(_wandb_log(records[:7]))
    log = tmp_path / "run-big1.wandb"
    log.write_bytes(data[: big_end - 100])  # the large record is still being written
    reader = WandbReader(str(log))
    first = reader.read()
    assert [row.step for row in first.rows] == [0, 1, 2, 3, 4]
    at = reader.cursor
    for _ in range(3):  # waits for the rest of it
        assert reader.read().rows == [] and reader.cursor == at
    with log.open("ab") as handle:
        handle.write(data[big_end - 100 :])
    reads = [reader.read() for _ in range(4)]
    assert [row.step for read in reads for row in read.rows] == [6, 7, 8, 9]
    assert first.too_large == [] and [size for read in reads for size in read.too_large] == [len(records[6])]
    assert sum(read.corrupt for read in reads) == 0
    assert any(read.exit_code == 0 for read in reads)
    assert reader.cursor == len(data) > at


def test_a_tensorboard_record_larger_than_a_read_is_skipped_once_and_the_events_after_it_are_read(tmp_path: Path) -> None:
    events = [_tf_version()] + [_tf_scalar(step, "loss", step + 0.5) for step in range(5)]
    events += [_tf_image(5, "samples", BIG)] + [_tf_scalar(step, "loss", step + 0.5) for step in range(5, 10)]
    data = _tfrecords(events)
    big_end = len(_tfrecords(events[:7]))
    name = "events.out.tfevents.1700000000.host.1.0"
    (tmp_path / name).write_bytes(data[: big_end - 100])
    reader = TensorboardReader(str(tmp_path))
    first = reader.read()
    assert [s.step for s in first.scalars] == [0, 1, 2, 3, 4]
    for _ in range(3):
        assert reader.read().scalars == []
    with (tmp_path / name).open("ab") as handle:
        handle.write(data[big_end - 100 :])
    reads = [reader.read() for _ in range(3)]
    assert [s.step for read in reads for s in read.scalars] == [5, 6, 7, 8, 9]
    assert first.too_large == [] and [too_large for read in reads for too_large in read.too_large] == [(name, len(events[6]))]
    assert sum(read.corrupt for read in reads) == 0 and not any(read.broken for read in reads)
    assert reader.cursors[name] == len(data)


def test_watch_streams_past_a_record_larger_than_a_read_and_says_so_once(server_factory, sqlite_url: str, tmp_path: Path) -> None:
    server = server_factory(sqlite_url)
    run_dir = tmp_path / "logs" / "wandb" / "offline-run-20260101_000000-big2"
    run_dir.mkdir(parents=True)
    records = [_wandb_run("big2", "big", "rl")] + [_wandb_row(step, {"loss": step + 0.5}) for step in range(5)]
    records += [_wandb_row(5, {"loss": 5.5, "table": "x" * BIG})]
    records += [_wandb_row(step, {"loss": step + 0.5}) for step in range(6, 10)] + [_wandb_exit()]
    (run_dir / "run-big2.wandb").write_bytes(_wandb_log(records))
    run_id = run_id_for("wandb/rl/big2")
    with _watching([tmp_path / "logs"], server.url, tmp_path / "state") as said:
        _wait(lambda: _said(said, "run 'big': finished;"), 60, "finished")
        time.sleep(0.5)
    assert sorted(_series(server.url, run_id, "loss")) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    (warning,) = _said(said, "skipped a record of")
    assert str(run_dir / "run-big2.wandb") in warning and f"of {len(records[6])} bytes" in warning
    assert "1 record(s) larger than 8 MiB skipped" in _said(said, "finished;")[0]


# -- 2. a NUL in a metric key -----------------------------------------------------------------


def test_a_metric_key_with_a_nul_is_dropped_alone_with_one_warning(server_factory, sqlite_url: str, tmp_path: Path) -> None:
    server = server_factory(sqlite_url)
    run_dir = tmp_path / "logs" / "wandb" / "offline-run-20260101_000000-nul1"
    run_dir.mkdir(parents=True)
    rows = [_wandb_row(step, {"loss": step + 0.5, "bad\x00key": 1.0, "acc": 0.25, "deep": {"x\x00y": 2.0, "ok": 3.0}})
            for step in range(10)]  # fmt: skip
    (run_dir / "run-nul1.wandb").write_bytes(_wandb_log([_wandb_run("nul1", "nul", "rl"), *rows, _wandb_exit()]))
    tb = tmp_path / "logs" / "tb" / "ppo"
    tb.mkdir(parents=True)
    events = [_tf_version()] + [_tf_scalar(step, tag, 0.5) for step in range(10) for tag in ("loss", "t\x00ag")]
    (tb / "events.out.tfevents.1700000000.host.1.0").write_bytes(_tfrecords(events))
    wandb_id = run_id_for("wandb/rl/nul1")
    tb_id = run_id_for("tensorboard/ppo/events.out.tfevents.1700000000.host.1.0")
    with _watching([tmp_path / "logs"], server.url, tmp_path / "state") as said:
        _wait(lambda: _said(said, "run 'nul': finished;"), 60, "finished")
        _wait(lambda: len(_series(server.url, tb_id, "loss")) == 10, 60, "the TensorBoard run")
        time.sleep(0.5)
    for key in ("loss", "acc", "deep.ok"):
        assert sorted(_series(server.url, wandb_id, key)) == list(range(10)), key
    assert sorted(_series(server.url, tb_id, "loss")) == list(range(10))
    for key in ("bad\x00key", "deep.x\x00y", "t\x00ag"):
        assert len(_said(said, f"values of {key!r} not stored")) == 1, said
    assert "10 value(s) of 'bad\\x00key' not stored" in _said(said, "run 'nul': finished;")[0]


# -- 3. a run the server refuses --------------------------------------------------------------


def test_a_run_name_longer_than_the_server_takes_is_shortened_recognisably(server_factory, sqlite_url: str, tmp_path: Path) -> None:
    server = server_factory(sqlite_url)
    run_dir = tmp_path / "logs" / "wandb" / "offline-run-20260101_000000-long1"
    run_dir.mkdir(parents=True)
    long_name = "grpo-qwen3-" + "ablation-" * 40 + "seed7"
    records = [_wandb_run("long1", long_name, "rl"), *[_wandb_row(step, {"loss": 0.5}) for step in range(3)], _wandb_exit()]
    (run_dir / "run-long1.wandb").write_bytes(_wandb_log(records))
    run_id = run_id_for("wandb/rl/long1")
    with _watching([tmp_path / "logs"], server.url, tmp_path / "state") as said:
        _wait(lambda: _said(said, ": finished;"), 60, "finished")
    run = _get(server.url, f"/runs/{run_id}")
    assert run["status"] == "finished" and sorted(_series(server.url, run_id, "loss")) == [0, 1, 2]
    assert len(run["name"]) == 200 and run["name"].startswith(long_name[:150])
    (warning,) = _said(said, "shortened")
    assert run["name"] in warning
    again = tmp_path / "other" / "offline-run-20260101_000000-long2"  # another long name: another short one
    again.mkdir(parents=True)
    records = [_wandb_run("long2", long_name + "8", "rl"), _wandb_row(0, {"loss": 0.5}), _wandb_exit()]
    (again / "run-long2.wandb").write_bytes(_wandb_log(records))
    with _watching([tmp_path / "other"], server.url, tmp_path / "state") as said:
        _wait(lambda: _said(said, ": finished;"), 60, "finished")
    assert _get(server.url, f"/runs/{run_id_for('wandb/rl/long2')}")["name"] != run["name"]


def test_a_run_the_server_refuses_for_good_is_said_once_and_not_dialled_again(server_factory, sqlite_url: str, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from trainer_hooks.sender import Sender

    dials = []
    dial = Sender._dial
    monkeypatch.setattr(Sender, "_dial", lambda self: (dials.append(self._spool.run.id), dial(self))[1])
    server = server_factory(sqlite_url)
    deep: dict[str, Any] = {}
    for _ in range(40):  # config nested deeper than the server keeps (wire's MAX_CONFIG_DEPTH)
        deep = {"d": deep}
    run_dir = tmp_path / "logs" / "offline-run-20260101_000000-deep1"
    run_dir.mkdir(parents=True)
    records = [_wandb_run("deep1", "deep", "rl", {"model": deep}), *[_wandb_row(step, {"loss": 0.5}) for step in range(3)]]
    (run_dir / "run-deep1.wandb").write_bytes(_wandb_log(records))
    with _watching([tmp_path / "logs"], server.url, tmp_path / "state") as said:
        _wait(lambda: _said(said, "would refuse"), 30, "the refusal")
        time.sleep(6.0)  # the Sender's backoff after a refused hello is at most 5 s
    (refusal,) = _said(said, "would refuse")
    assert "nests deeper than 32 levels" in refusal
    assert dials == [] and _get(server.url, f"/runs/{run_id_for('wandb/rl/deep1')}") is None

    # A run of another project under the same id (4409 run_conflict): said once, not dialled again.
    shallow = tmp_path / "shallow" / "offline-run-20260101_000000-flat1"
    shallow.mkdir(parents=True)
    records = [_wandb_run("flat1", "flat", "rl"), *[_wandb_row(step, {"loss": 0.5}) for step in range(3)]]
    (shallow / "run-flat1.wandb").write_bytes(_wandb_log(records))
    run_id = run_id_for("wandb/rl/flat1")
    with _watching([tmp_path / "shallow"], server.url, tmp_path / "state") as said:
        _wait(lambda: len(_series(server.url, run_id, "loss")) == 3, 30, "the run in project default")
    dials.clear()
    with _watching([tmp_path / "shallow"], server.url, tmp_path / "state", project="other") as said:
        _wait(lambda: _said(said, "server refused it"), 30, "the conflict")
        time.sleep(6.0)
    (refusal,) = _said(said, "server refused it")
    assert "run_conflict" in refusal
    assert dials == [run_id]


# -- 4. event files linked from outside the watched folder ----------------------------------


def test_event_files_linked_from_outside_the_watched_folder_are_not_read(server_factory, sqlite_url: str, tmp_path: Path) -> None:
    outside = tmp_path / "secret"
    outside.mkdir()
    (outside / "events.out.tfevents.1700000000.other.9.0").write_bytes(
        _tfrecords([_tf_version(), *[_tf_scalar(step, "secret", 42.0) for step in range(3)]])
    )
    root = tmp_path / "tb"
    run, store = root / "ppo", root / "store"
    run.mkdir(parents=True)
    store.mkdir()
    own = "events.out.tfevents.1700000000.host.1.0"
    (run / own).write_bytes(_tfrecords([_tf_version(), *[_tf_scalar(step, "loss", 0.5) for step in range(3)]]))
    (store / "blob").write_bytes(_tfrecords([_tf_version(), *[_tf_scalar(step, "kept", 1.5) for step in range(3)]]))
    (run / "events.out.tfevents.1700000001.host.1.0").symlink_to(store / "blob")  # inside the watched folder: read
    (run / "events.out.tfevents.1700000002.host.1.0").symlink_to(outside / "events.out.tfevents.1700000000.other.9.0")
    (run / "events.out.tfevents.1700000003.host.1.0").symlink_to("../../secret/events.out.tfevents.1700000000.other.9.0")
    os.mkfifo(run / "events.out.tfevents.1700000004.host.1.0")  # not a file: opening it would wait forever

    reader = TensorboardReader(str(run), within=str(root))
    reads = [reader.read() for _ in range(3)]
    assert sorted({s.tag for read in reads for s in read.scalars}) == ["kept", "loss"]
    assert sorted(name for read in reads for name, _ in read.not_read) == [
        "events.out.tfevents.1700000002.host.1.0", "events.out.tfevents.1700000003.host.1.0", "events.out.tfevents.1700000004.host.1.0",
    ]  # fmt: skip

    # A wandb run directory whose transaction log is a link out of the watched folder.
    (outside / "run-out1.wandb").write_bytes(_wandb_log([_wandb_run("out1", "out", "rl"), _wandb_row(0, {"secret": 42.0})]))
    wandb_dir = tmp_path / "wandb" / "offline-run-20260101_000000-out1"
    wandb_dir.mkdir(parents=True)
    (wandb_dir / "run-out1.wandb").symlink_to(outside / "run-out1.wandb")

    server = server_factory(sqlite_url)
    run_id = run_id_for(f"tensorboard/ppo/{own}")
    with _watching([root, tmp_path / "wandb"], server.url, tmp_path / "state") as said:
        _wait(lambda: len(_series(server.url, run_id, "kept")) == 3, 30, "the linked file inside")
        time.sleep(1.0)
    assert _get(server.url, f"/runs/{run_id_for('wandb/rl/out1')}") is None
    (refused,) = _said(said, "not following")
    assert str(wandb_dir / "run-out1.wandb") in refused and f"outside the watched {(tmp_path / 'wandb').resolve()}" in refused
    assert sorted(_series(server.url, run_id, "loss")) == [0, 1, 2]
    assert _series(server.url, run_id, "secret") == {}
    assert len(_said(said, "not read")) == 3, said
    (linked,) = _said(said, "events.out.tfevents.1700000002.host.1.0")
    assert f"outside {root.resolve()}" in linked
    assert "not a regular file" in _said(said, "events.out.tfevents.1700000004.host.1.0")[0]


# -- 5. keel import reads and names as keel watch does ---------------------------------------


def _import(*argv: str | Path) -> int:
    """`keel import ...`, parsed as `keel` parses it."""
    from keel.transfer import COMMANDS

    parser = argparse.ArgumentParser(prog="keel")
    sub = parser.add_subparsers(dest="command", required=True)
    help_text, add_arguments, run = COMMANDS["import"]
    add_arguments(sub.add_parser("import", help=help_text))
    args = parser.parse_args(["import", *map(str, argv)])
    return int(run(args))


def _stored(url: str, run_id: str) -> dict[str, dict[int, float]]:
    """Every key of a run with its points."""
    keys = _get(url, f"/runs/{run_id}/keys") or []
    return {info["key"]: _series(url, run_id, info["key"]) for info in keys}


_VERL_ROW = {"rollout_corr/k3_kl": 0.001, "actor/pg_loss": -0.5, "actor/pg_clipfrac": 0.125, "note": "text"}


def _verl_logs(root: Path) -> tuple[Path, Path, str, str]:
    """A finished verl run's wandb log and TensorBoard directory under `root`; their run ids."""
    run_dir = root / "wandb" / "offline-run-20260101_000000-v1"
    run_dir.mkdir(parents=True)
    rows = [_wandb_row(step, {key: value * (step + 1) if isinstance(value, float) else value for key, value in _VERL_ROW.items()})
            for step in range(6)]  # fmt: skip
    config = {"actor_rollout_ref": {"actor": {"ppo_epochs": 1}}, "algorithm": {"adv_estimator": "grpo"}}
    (run_dir / "run-v1.wandb").write_bytes(_wandb_log([_wandb_run("v1", "verl-grpo", "rl", config), *rows, _wandb_exit()]))
    tb = root / "tb" / "grpo"
    tb.mkdir(parents=True)
    name = "events.out.tfevents.1700000000.host.1.0"
    events = [_tf_scalar(step, tag, value * (step + 1)) for step in range(6) for tag, value in _VERL_ROW.items() if isinstance(value, float)]
    (tb / name).write_bytes(_tfrecords([_tf_version(), *events]))
    return run_dir, tb, run_id_for("wandb/rl/v1"), run_id_for(f"tensorboard/grpo/{name}")


@pytest.mark.parametrize("framework", ["verl", "auto"])
def test_import_with_a_framework_lands_the_names_watch_lands(server_factory, tmp_path: Path, framework: str) -> None:
    """Watched, then imported into the same runs: not one metric under two names."""
    run_dir, tb, wandb_id, tb_id = _verl_logs(tmp_path / "logs")
    server = server_factory(f"sqlite:///{tmp_path / 'keel.db'}")
    with _watching([tmp_path / "logs"], server.url, tmp_path / "state", framework=framework):
        _wait(lambda: len(_series(server.url, wandb_id, "mismatch/kl")) == 6, 60, "the wandb run")
        _wait(lambda: len(_series(server.url, tb_id, "mismatch/kl")) == 6, 60, "the TensorBoard run")
        time.sleep(0.5)
    watched = {run_id: _stored(server.url, run_id) for run_id in (wandb_id, tb_id)}
    for run_id in (wandb_id, tb_id):
        assert set(watched[run_id]) == {"mismatch/kl", "loss/pg", "policy/clip_frac"}, run_id
        assert sorted(watched[run_id]["loss/pg"]) == list(range(6))

    assert _import("wandb", run_dir, "--server", server.url, "--framework", framework) == 0
    assert _import("tensorboard", tb, "--server", server.url, "--framework", framework) == 0
    assert {run_id: _stored(server.url, run_id) for run_id in (wandb_id, tb_id)} == watched

    # Imported alone (another server), the same runs hold the same points under the same names.
    alone = server_factory(f"sqlite:///{tmp_path / 'alone.db'}")
    assert _import("wandb", run_dir, "--server", alone.url, "--framework", framework) == 0
    assert _import("tensorboard", tb, "--server", alone.url, "--framework", framework) == 0
    assert {run_id: _stored(alone.url, run_id) for run_id in (wandb_id, tb_id)} == watched
    run = _get(alone.url, f"/runs/{wandb_id}")
    assert run["config"]["keel_import"]["framework"] == "verl" and run["config"]["algorithm"] == {"adv_estimator": "grpo"}


def test_a_corrupt_and_an_oversized_record_are_handled_alike_by_import_and_watch(server_factory, tmp_path: Path, capsys) -> None:
    """One corrupt record (a bad checksum) and one larger than a read (> 8 MiB), in a wandb log
    and in an event file: watch and import each skip exactly those and store the rest."""
    logs = tmp_path / "logs"
    run_dir = logs / "wandb" / "offline-run-20260101_000000-h1"
    run_dir.mkdir(parents=True)
    records = [_wandb_run("h1", "hostile", "rl")] + [_wandb_row(step, {"loss": step + 0.5}) for step in range(10)] + [_wandb_exit()]
    records[6] = _wandb_row(5, {"loss": 5.5, "table": "x" * BIG})
    data = bytearray(_wandb_log(records))
    at = len(_wandb_log(records[:3])) + 7 + 2  # inside step 2's payload: its checksum fails
    data[at] ^= 0x01
    (run_dir / "run-h1.wandb").write_bytes(bytes(data))
    tb = logs / "tb" / "ppo"
    tb.mkdir(parents=True)
    events = [_tf_version()] + [_tf_scalar(step, "loss", step + 0.5) for step in range(10)]
    events[6] = _tf_image(5, "samples", BIG)
    framed = bytearray(_tfrecords(events))
    at = len(_tfrecords(events[:3])) + 12 + 2  # inside step 2's event: its data checksum fails
    framed[at] ^= 0x01
    name = "events.out.tfevents.1700000000.host.1.0"
    (tb / name).write_bytes(bytes(framed))
    wandb_id, tb_id = run_id_for("wandb/rl/h1"), run_id_for(f"tensorboard/ppo/{name}")
    expected = {"loss": {step: step + 0.5 for step in range(10) if step not in (2, 5)}}

    watched = server_factory(f"sqlite:///{tmp_path / 'watched.db'}")
    with _watching([logs], watched.url, tmp_path / "state") as said:
        _wait(lambda: _said(said, "run 'hostile': finished;"), 60, "finished")
        _wait(lambda: len(_series(watched.url, tb_id, "loss")) == 8, 60, "the TensorBoard run")
        time.sleep(0.5)
    assert _stored(watched.url, wandb_id) == expected and _stored(watched.url, tb_id) == expected
    assert len(_said(said, "1 corrupt record(s) skipped in")) == 2 and len(_said(said, "skipped a record of")) == 2

    imported = server_factory(f"sqlite:///{tmp_path / 'imported.db'}")
    capsys.readouterr()
    assert _import("wandb", run_dir, "--server", imported.url) == 0
    assert _import("tensorboard", tb, "--server", imported.url) == 0
    out = capsys.readouterr().out
    assert _stored(imported.url, wandb_id) == expected and _stored(imported.url, tb_id) == expected
    assert "not imported: 1 corrupt record(s) in run-h1.wandb (skipped)" in out
    assert f"not imported: a record of {len(records[6])} bytes in run-h1.wandb" in out
    assert "not imported: 1 corrupt record(s) in ppo (skipped)" in out
    assert f"not imported: a record of {len(events[6])} bytes in {name}" in out

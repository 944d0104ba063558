"""The disk spool on its own: crash recovery, ack markers, seq anchoring, locking, compaction."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainer_hooks import spool as spool_module
from trainer_hooks.spool import Spool, SpoolBusyError, find_spools
from wire import RunInfo


def rows(step: int) -> str:
    return json.dumps([{"step": step, "values": {"x": step}}])


def all_frames(spool: Spool) -> list[tuple[int, str]]:
    frames, offset = [], spool.acked_offset
    while (frame := spool.read(offset)) is not None:
        frames.append((frame.n, frame.rows_json))
        offset = frame.end_offset
    return frames


@pytest.fixture
def run() -> RunInfo:
    return RunInfo(
        id="8b1f6f43-0000-4000-8000-000000000001", name="spooled", group="g", config={"lr": 2.0}
    )


def test_frames_survive_reopen_with_metadata(tmp_path: Path, run: RunInfo) -> None:
    spool = Spool.open(tmp_path / run.id, run=run, server_url="http://h:1")
    assert [spool.append(rows(step)) for step in range(3)] == [0, 1, 2]
    spool.close()
    reopened = Spool.open(tmp_path / run.id)
    assert reopened.run == run
    assert reopened.server_url == "http://h:1"
    assert (reopened.seq_base, reopened.status, reopened.next_n, reopened.unacked) == (
        None,
        None,
        3,
        3,
    )
    assert all_frames(reopened) == [(0, rows(0)), (1, rows(1)), (2, rows(2))]
    reopened.close()


def test_torn_last_line_is_dropped_and_numbering_continues(tmp_path: Path, run: RunInfo) -> None:
    spool = Spool.open(tmp_path / run.id, run=run)
    spool.append(rows(0))
    spool.append(rows(1))
    spool.close()
    frames_file = tmp_path / run.id / "frames.jsonl"
    intact = frames_file.stat().st_size
    with open(frames_file, "ab") as handle:  # a crash in the middle of write(2)
        handle.write(b'{"n":2,"rows":[{"step":2,"val')
    reopened = Spool.open(tmp_path / run.id)
    assert frames_file.stat().st_size == intact
    assert reopened.next_n == 2
    assert reopened.append(rows(2)) == 2
    assert all_frames(reopened) == [(0, rows(0)), (1, rows(1)), (2, rows(2))]
    reopened.close()


def test_corrupt_middle_line_is_skipped_not_fatal(tmp_path: Path, run: RunInfo) -> None:
    spool = Spool.open(tmp_path / run.id, run=run)
    spool.append(rows(0))
    spool.append(rows(1))
    spool.close()
    frames_file = tmp_path / run.id / "frames.jsonl"
    first, second = frames_file.read_bytes().splitlines(keepends=True)
    frames_file.write_bytes(first + b"garbage from a bad disk\n" + second)
    reopened = Spool.open(tmp_path / run.id)
    assert [n for n, _ in all_frames(reopened)] == [0, -1, 1]
    assert reopened.next_n == 2
    reopened.close()


def test_acks_persist_and_anchor_sets_the_wire_base(tmp_path: Path, run: RunInfo) -> None:
    spool = Spool.open(tmp_path / run.id, run=run)
    for step in range(5):
        spool.append(rows(step))
    # The server already holds seqs 0..9 of this run (resumed elsewhere): ours go after.
    spool.anchor(9)
    assert spool.seq_base == 10
    spool.anchor(11)  # later welcome: our n 0..1 (seq 10, 11) are stored
    assert (spool.acked_n, spool.unacked) == (1, 3)
    spool.close()
    reopened = Spool.open(tmp_path / run.id)
    assert (reopened.seq_base, reopened.acked_n, reopened.unacked) == (10, 1, 3)
    assert [n for n, _ in all_frames(reopened)] == [2, 3, 4]
    reopened.close()


def test_anchor_renumbers_when_the_server_is_ahead_of_everything_spooled(
    tmp_path: Path, run: RunInfo
) -> None:
    spool = Spool.open(tmp_path / run.id, run=run)
    for step in range(4):
        spool.append(rows(step))
    spool.anchor(-1)
    spool.anchor(1)  # n 0, 1 acked
    assert (spool.seq_base, spool.acked_n) == (0, 1)
    # Someone else took the run to seq 50: our unacked n = 2 must go out as seq 51.
    spool.anchor(50)
    assert spool.seq_base + 2 == 51
    assert spool.acked_n == 1
    spool.close()


def test_second_owner_is_refused_until_the_first_lets_go(tmp_path: Path, run: RunInfo) -> None:
    first = Spool.open(tmp_path / run.id, run=run)
    with pytest.raises(SpoolBusyError):
        Spool.open(tmp_path / run.id)
    first.close()
    Spool.open(tmp_path / run.id).close()


def test_log_is_compacted_once_everything_is_acked(
    tmp_path: Path, run: RunInfo, monkeypatch
) -> None:
    monkeypatch.setattr(spool_module, "_COMPACT_BYTES", 100)
    spool = Spool.open(tmp_path / run.id, run=run)
    spool.anchor(-1)
    last = None
    for step in range(10):
        spool.append(rows(step))
    offset = 0
    while (frame := spool.read(offset)) is not None:
        last, offset = frame, frame.end_offset
    assert last is not None
    spool.mark_acked(last.n, last.end_offset)
    assert os.path.getsize(tmp_path / run.id / "frames.jsonl") == 0
    assert spool.append(rows(10)) == 10
    # The same offset now holds a new frame; reading it must not return the old bytes.
    frame = spool.read(0)
    assert frame is not None and (frame.n, frame.rows_json) == (10, rows(10))
    spool.close()
    reopened = Spool.open(tmp_path / run.id)
    assert (reopened.acked_n, reopened.next_n) == (9, 11)
    assert all_frames(reopened) == [(10, rows(10))]
    reopened.close()


def test_remove_on_close_and_find_spools(tmp_path: Path, run: RunInfo) -> None:
    other = RunInfo(id="other", name="other")
    Spool.open(tmp_path / run.id, run=run).close()
    Spool.open(tmp_path / other.id, run=other).close()
    assert find_spools(tmp_path) == sorted([tmp_path / run.id, tmp_path / other.id])
    assert find_spools(tmp_path / run.id) == [tmp_path / run.id]
    Spool.open(tmp_path / run.id).close(remove=True)
    assert find_spools(tmp_path) == [tmp_path / other.id]
    with pytest.raises(FileNotFoundError):
        Spool.open(tmp_path / "missing")


def test_frames_larger_than_one_read_come_back_whole(tmp_path: Path, run: RunInfo) -> None:
    big = json.dumps(
        [{"step": step, "values": {f"k{i}": i * 0.5 for i in range(50)}} for step in range(500)]
    )
    assert len(big) > 300_000  # many times the first read
    spool = Spool.open(tmp_path / run.id, run=run)
    spool.append(rows(0))
    spool.append(big)
    spool.append(rows(2))
    assert all_frames(spool) == [(0, rows(0)), (1, big), (2, rows(2))]
    spool.close()

"""A slow database pushes back on the trainers instead of filling the server's memory.

The points table is locked (`LOCK TABLE points IN ACCESS EXCLUSIVE MODE` from another
connection) for `LOCK_S` while a real Monitor streams 20 metrics per step at a few hundred
steps a second, a raw protocol client times one ack, and a client that ignores the ack
window floods big frames. What bounds the server meanwhile: each ingest socket is handled
one frame at a time (server/ingest.py), uvicorn stops reading a websocket while a received
message waits for the app (so one queued frame at most, plus one read), and TCP holds the
rest in the kernel's buffers and then stalls the sender; a Monitor never has more than
`SenderConfig.window` frames in flight and spools the rest on disk.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from websockets.sync.client import ClientConnection, connect

from tests.support.monitor import (
    FAST,
    headline,
    python_process,
    servers,
    spooled_steps,
    wait_until,
)
from tests.support.raw_client import hello, new_run, points
from tests.support.server import ServerProcess
from trainer_hooks.monitor import Monitor

make_server = pytest.fixture(name="make_server")(servers)

LOCK_S = 12.0
"""How long the points table stays locked (the test takes about 2.5x this)."""
STEP_S = 0.005
"""Pause between the Monitor's steps: ~200 steps/s, 4 000 values/s."""
FILLER = [f"backpressure/metric_{i:02d}" for i in range(15)]
RSS_BOUND_MIB = 100.0
"""Growth of the server's resident memory allowed while the table is locked."""
FLOOD_FRAMES = 500
"""Frames the window-ignoring client tries to send (~0.85 MB each: ~400 MB in all). What
gets through is one frame being handled, one queued, and what the kernel's socket buffers
hold (tcp_rmem's maximum on the server's side, 32 MiB here: ~60 frames)."""

FLOOD = """
import json, os, sys
from websockets.sync.client import ClientConnection, connect
from wire import Row, RunInfo, encode_rows, Hello, points_frame

rows = json.dumps(encode_rows([
    Row(step=s, time=None, values={f"flood/{k:02d}": s + k / 20 for k in range(20)})
    for s in range(2000)
]))
with connect(os.environ["INGEST_URL"], max_size=None) as ws:
    ws.send(json.dumps(Hello(RunInfo(id=os.environ["RUN_ID"], name="flood")).to_json()))
    ws.recv(timeout=10)
    for seq in range(int(os.environ["FRAMES"])):
        ws.send(points_frame(seq, rows))  # never reads an ack: only TCP can stop it
        print(seq + 1, len(rows), flush=True)
"""


def ingest_url(server: ServerProcess) -> str:
    return server.url.replace("http", "ws", 1) + "/api/v1/ingest"


def metrics(step: int) -> dict[str, float]:
    return {**headline(step), **{key: step + i / 16 for i, key in enumerate(FILLER)}}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@contextmanager
def points_locked(database_url: str) -> Iterator[None]:
    """The points table locked against every read and write until the block exits."""
    with psycopg.connect(database_url) as conn:
        conn.execute("SET lock_timeout = '20s'")
        conn.execute("LOCK TABLE points IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            conn.rollback()


class RssPeak(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            self.peak = max(self.peak, rss_mib(self.pid))


class AckProbe(threading.Thread):
    """A raw protocol client: one small frame, and when its ack came back."""

    def __init__(self, ws: ClientConnection):
        super().__init__(daemon=True)
        self.ws = ws
        run = new_run("probe")
        assert hello(self.ws, run)["type"] == "welcome"
        self.seq = 0
        self.sent_at = self.acked_at = 0.0

    def ack_latency(self, timeout: float) -> float:
        self.sent_at = time.monotonic()
        self.ws.send(points(self.seq, [{"step": self.seq, "values": {"probe": 1.0}}]))
        reply = json.loads(self.ws.recv(timeout=timeout))
        self.acked_at = time.monotonic()
        assert reply == {"type": "ack", "seq": self.seq}
        self.seq += 1
        return self.acked_at - self.sent_at

    def run(self) -> None:
        self.ack_latency(timeout=LOCK_S + 30)


def all_acked(spool_path: Path) -> bool:
    """The spool's acked marker stands at the end of its frames log."""
    acked, frames = spool_path / "acked.json", spool_path / "frames.jsonl"
    if not acked.exists():
        return False
    return bool(json.loads(acked.read_text())["offset"] == frames.stat().st_size)


def read_progress(flood: subprocess.Popen[str], sent: list[tuple[int, int]]) -> None:
    """The flooding client's "frames sent, bytes per frame" lines, as it prints them."""
    for line in flood.stdout or ():
        frames, size = line.split()
        sent.append((int(frames), int(size)))


def assert_every_metric_once(server: ServerProcess, run_id: str, steps: int) -> None:
    """Each of the 20 metrics holds steps 0..steps-1 exactly once, with its exact value."""
    assert server.keys(run_id) == dict.fromkeys(sorted(metrics(0)), steps)
    for key in metrics(0):
        stored_steps, values = server.series(run_id, key)
        assert stored_steps == list(range(steps)), key
        assert values == [metrics(step)[key] for step in range(steps)], key


@pytest.mark.slow
@pytest.mark.postgres
def test_a_locked_points_table_slows_acks_bounds_memory_and_loses_nothing(
    make_server, postgres_url, tmp_path
) -> None:
    server = make_server(postgres_url)
    assert server.process is not None
    pid = server.process.pid
    monitor = Monitor(server.url, run_name="backpressure", spool_dir=tmp_path, sender_config=FAST)
    spool_path = monitor.spool_path
    assert spool_path is not None
    acked_file = spool_path / "acked.json"
    step = 0
    for step in range(100):
        monitor.log(step, metrics(step))
        time.sleep(STEP_S)
    wait_until(lambda: server.last_step(monitor.run_id) == 99, 30, "the first 100 steps stored")
    with connect(ingest_url(server), max_size=None, open_timeout=10) as probe_ws:
        probe = AckProbe(probe_ws)
        unlocked_ack_s = probe.ack_latency(timeout=30)
        # Settle: every frame acked, so any ack seen from here on would be a frame stored
        # under the lock.
        wait_until(lambda: all_acked(spool_path), 10, "every spooled frame acked")
        acked_before = acked_file.read_text()
        rss_before = rss_mib(pid)
        peak = RssPeak(pid)
        peak.start()

        log_s: list[float] = []
        flood_sent: list[tuple[int, int]] = []  # (frames sent, bytes per frame), as it reports
        with points_locked(postgres_url):
            locked_at = time.monotonic()
            probe.start()
            with python_process(
                FLOOD,
                env={
                    "INGEST_URL": ingest_url(server),
                    "RUN_ID": new_run()["id"],
                    "FRAMES": str(FLOOD_FRAMES),
                },
            ) as flood:
                threading.Thread(target=read_progress, args=(flood, flood_sent), daemon=True).start()
                spooled_at_lock = len(spooled_steps(spool_path))
                while time.monotonic() - locked_at < LOCK_S:
                    step += 1
                    started = time.perf_counter()
                    monitor.log(step, metrics(step))
                    log_s.append(time.perf_counter() - started)
                    time.sleep(STEP_S)
                time.sleep(2 * FAST.flush_interval)  # the last rows cut into a frame and spooled
                spooled_at_release = spooled_steps(spool_path)
                acked_at_release = acked_file.read_text()
                probe_waiting = probe.is_alive()
                rss_locked = peak.peak
                # Killed before the release: the frames it got into the server are stored
                # or not, as the server finds its socket gone; none is the Monitor's.
            releasing_at = time.monotonic()  # no ack can be sent before this
        logged_steps = step + 1

        # Under the lock: training went on at full speed, the spool took the steps, no ack came.
        assert max(log_s) < 1.0, f"log() blocked for {max(log_s):.3f} s under a {LOCK_S:g} s lock"
        assert statistics.median(log_s) < 1e-3
        assert len(log_s) > 500  # the loop really ran (~200 steps/s)
        assert acked_at_release == acked_before  # no frame of the Monitor was acked
        assert len(spooled_at_release) >= spooled_at_lock + len(log_s) - 50  # all but the last rows
        assert set(range(100, logged_steps - 50)) <= set(spooled_at_release)
        assert probe_waiting  # its ack is still outstanding at the release
        # The flood stalled on TCP backpressure well short of what it tried to send.
        assert flood_sent, "the flooding client sent nothing"
        sent_frames, frame_bytes = flood_sent[-1]
        assert sent_frames < FLOOD_FRAMES / 2, f"{sent_frames} frames of {frame_bytes} B got through"
        growth = rss_locked - rss_before
        assert growth < RSS_BOUND_MIB, f"server RSS grew {growth:.0f} MiB under the lock"

        # The probe's ack came only once the lock was gone; acks are fast again afterwards.
        probe.join(timeout=30)
        assert not probe.is_alive()
        locked_ack_s = probe.acked_at - probe.sent_at
        assert probe.acked_at >= releasing_at
        assert locked_ack_s > LOCK_S - 1.0 > unlocked_ack_s

        # After the release: every step the Monitor logged is stored exactly once.
        finishing = time.monotonic()
        assert monitor.finish(timeout=60)
        caught_up_s = time.monotonic() - finishing
        peak.stop.set()
        peak.join()
        growth = peak.peak - rss_before  # the backlog's catch-up included
        assert growth < RSS_BOUND_MIB, f"server RSS grew {growth:.0f} MiB catching up"
        assert monitor.dropped == {}
        assert_every_metric_once(server, monitor.run_id, logged_steps)
        assert probe.ack_latency(timeout=30) < 5.0
        assert server.process is not None and server.process.poll() is None
        print(  # the figures, for `pytest -s`
            f"backpressure: {len(log_s)} log() calls under a {LOCK_S:g} s lock, max "
            f"{1000 * max(log_s):.1f} ms; spool {spooled_at_lock} -> {len(spooled_at_release)} rows; "
            f"ack {1000 * unlocked_ack_s:.0f} ms unlocked, {locked_ack_s:.1f} s "
            f"locked; flood {sent_frames} x {frame_bytes} B sent of {FLOOD_FRAMES}; RSS "
            f"{rss_before:.0f} MiB +{rss_locked - rss_before:.1f} locked, +{growth:.1f} catching up; "
            f"{logged_steps} steps x {len(metrics(0))} metrics stored once; "
            f"catch-up {caught_up_s:.1f} s"
        )

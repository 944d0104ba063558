"""The page benchmarks' runs, sent to a `keel serve` with the Monitor's own client.

Every run's rows go through a spool and a `Sender` (trainer_hooks/spool.py, sender.py), as
a trainer's do: `ingest` uploads each run's history (frames of many rows, a few frames in
flight), `Streamer` then sends every run one frame per step at a steady rate from one
thread, reconnecting after a drop and resending what was not acked, as the Monitor does.
The values are bench/page_data.py's, the same for Keel and its peers.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.page_data import step_values
from trainer_hooks.sender import ConnState, Sender, SenderConfig
from trainer_hooks.spool import Spool
from wire import Row, RunInfo, encode_rows

__all__ = ["BenchRun", "Streamer", "ingest", "make_runs"]

GROUPS = ("cispo", "is", "gspo", "grpo", "dapo", "ppo", "rloo", "vapo")
PROJECT = "pagebench"
HISTORY_WINDOW = 4
"""History frames in flight per run: four runs at a time each keep a few frames queued."""
HISTORY_TIMEOUT_S = 1800.0


@dataclass
class BenchRun:
    index: int
    """Its number in bench/page_data.py's step_values (the same values everywhere)."""
    id: str
    name: str
    group: str

    def info(self) -> RunInfo:
        return RunInfo(id=self.id, name=self.name, project=PROJECT, group=self.group, tags=["bench"])


def make_runs(count: int, prefix: str = "") -> list[BenchRun]:
    per_group = max(1, math.ceil(count / len(GROUPS)))
    return [BenchRun(i, str(uuid.uuid4()), f"{prefix}{GROUPS[i // per_group % len(GROUPS)]}-s{i % per_group}",
                     GROUPS[i // per_group % len(GROUPS)]) for i in range(count)]  # fmt: skip


def _frame(rows: list[Row]) -> str:
    return json.dumps(encode_rows(rows), separators=(",", ":"))


def ingest_run(url: str, run: BenchRun, steps: int, keys: list[str], batch: int, spools: Path) -> None:
    """`steps` steps of the run, `batch` rows a frame, spooled under `spools` and sent, the
    run left running (its live steps follow, from another writer)."""
    spool = Spool.open(spools / f"history-{run.id}", run=run.info(), server_url=url)
    try:
        for start in range(0, steps, batch):
            spool.append(_frame([Row(step=s, time=None, values=step_values(run.index, s, keys))
                                 for s in range(start, min(steps, start + batch))]))  # fmt: skip
        sender = Sender(spool, url, config=SenderConfig(window=HISTORY_WINDOW, backoff_max=2.0))
        deadline = time.monotonic() + HISTORY_TIMEOUT_S
        try:
            while spool.unacked > 0:
                if sender.state is ConnState.REJECTED or time.monotonic() > deadline:
                    raise RuntimeError(f"run {run.name}'s history not stored: {sender.last_error}")
                sender.step(0.05)
        finally:
            sender.close()
    finally:
        spool.close(remove=True)


def ingest(url: str, runs: list[BenchRun], steps: int, keys: list[str], spools: Path, *, batch: int | None = None) -> float:
    """Every run's history, four runs at a time; returns the seconds it took."""
    rows_per_frame = batch or max(1, min(10_000, 20_000 // len(keys)))
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda run: ingest_run(url, run, steps, keys, rows_per_frame, spools), runs))
    return time.monotonic() - began


class Streamer:
    """Every run sends one points frame per step at `rate` steps/s (phases spread over the
    period), from step `first_step` on, in a background thread: one spool and Sender per
    run, all driven from that thread."""

    def __init__(self, url: str, runs: list[BenchRun], keys: list[str], rate: float, first_step: int, spools: Path):
        self.runs, self.keys, self.rate = runs, keys, rate
        self.spools = [Spool.open(spools / f"live-{uuid.uuid4().hex[:8]}-{run.id}", run=run.info(), server_url=url)
                       for run in runs]  # fmt: skip
        self.senders = [Sender(spool, url, config=SenderConfig(backoff_max=5.0)) for spool in self.spools]
        self.dropped: list[str] = []
        """Each time a live socket was lost (the Sender dialed again): why."""
        self.step = first_step
        """The step being sent now (every run has sent the steps before it)."""
        self.sent = 0
        self.late_s = 0.0
        """The most the schedule fell behind (the sender itself could not keep up)."""
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Streamer:
        self._connect()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for sender, spool in zip(self.senders, self.spools, strict=True):
            sender.close()
            spool.close(remove=True)

    def _connect(self, timeout: float = 60.0) -> None:
        """Every run welcomed before the first step is due."""
        deadline = time.monotonic() + timeout
        while any(s.state is not ConnState.STREAMING for s in self.senders):
            if time.monotonic() > deadline:
                errors = {s.last_error for s in self.senders if s.state is not ConnState.STREAMING}
                raise RuntimeError(f"the live streams did not connect: {errors}")
            for sender in self.senders:
                sender.step(0.0 if sender.state is ConnState.STREAMING else 0.05)

    def check(self) -> None:
        """Raises if the streaming stopped: a busy figure measured without it would be wrong."""
        if self.error is not None:
            raise RuntimeError(f"the live streamer stopped: {self.error!r}") from self.error

    def _loop(self) -> None:
        try:
            self._send_steps()
        except Exception as exc:  # reported by check(), not lost in the thread
            self.error = exc

    def _pump(self, i: int) -> None:
        """Send run i's spooled frames and take its acks, without waiting."""
        sender = self.senders[i]
        streaming = sender.state is ConnState.STREAMING
        sender.step(0.0)
        if streaming and sender.state is not ConnState.STREAMING:
            self.dropped.append(sender.last_error or "closed")
        if sender.state is ConnState.REJECTED:
            raise RuntimeError(f"run {self.runs[i].name} refused: {sender.last_error}")

    def _send_steps(self) -> None:
        period = 1.0 / self.rate
        began = time.monotonic()
        k = 0
        while not self._stop.is_set():
            for i, run in enumerate(self.runs):
                due = began + k * period + i * period / len(self.runs)
                # Meanwhile, every run's acks are taken as they come.
                while (delay := due - time.monotonic()) > 0:
                    if self._stop.wait(min(delay, 0.05)):
                        return
                    for j in range(len(self.runs)):
                        self._pump(j)
                self.late_s = max(self.late_s, -delay)
                row = Row(step=self.step, time=time.time(), values=step_values(run.index, self.step, self.keys))
                self.spools[i].append(_frame([row]))
                self.sent += 1
                self._pump(i)
            self.step += 1
            k += 1

"""`keel watch` keeping up: one watcher follows many live wandb runs, and its CPU is measured.

RUNS writers (threads of this process) each append one history record of METRICS values per
step to a wandb transaction log, at STEP_S seconds per step, in wandb's own format (the
LevelDB framing of keel/importers.py, records built with wandb's protobuf classes; wandb's
own writer is one process per run, which 64 of would measure the machine, not the watcher).
One `keel watch` process follows them into a real `keel serve` (SQLite). Printed: the
watcher's CPU time over the wall time it ran (its share of one core, from the kernel's
rusage of the child), and how far behind the server was at the end.

    python -m bench.watch [--runs 64] [--metrics 200] [--step-s 1.0] [--seconds 90]
"""

from __future__ import annotations

import argparse
import os
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import httpx

from bench.support import ROOT, keel_server
from keel.importers import run_id_for

_BLOCK = 32 * 1024
_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)


class WandbLog:
    """A .wandb file written the way wandb's core writes it (FULL/FIRST/MIDDLE/LAST fragments)."""

    def __init__(self, path: Path) -> None:
        self.handle = open(path, "wb")
        self.handle.write(_HEADER)
        self.pos = len(_HEADER)

    def record(self, payload: bytes) -> None:
        first = True
        while True:
            room = _BLOCK - self.pos % _BLOCK
            if room < 7:
                self.handle.write(b"\0" * room)
                self.pos += room
                continue
            chunk, payload = payload[: room - 7], payload[room - 7 :]
            kind = (1 if not payload else 2) if first else (4 if not payload else 3)
            self.handle.write(struct.pack("<IHB", zlib.crc32(chunk, zlib.crc32(bytes([kind]))), len(chunk), kind) + chunk)
            self.pos += 7 + len(chunk)
            first = False
            if not payload:
                break
        self.handle.flush()


def writer(root: Path, index: int, metrics: int, step_s: float, steps: int, stop: threading.Event) -> None:
    from wandb.proto import wandb_internal_pb2 as pb

    run_dir = root / f"offline-run-20260101_000000-r{index}"
    run_dir.mkdir(parents=True)
    log = WandbLog(run_dir / f"run-r{index}.wandb")
    run = pb.Record()
    run.run.run_id, run.run.display_name, run.run.project = f"r{index}", f"bench-{index}", "bench"
    log.record(run.SerializeToString())
    started = time.monotonic()
    for step in range(steps):
        record = pb.Record()
        record.history.step.num = step
        record.history.item.add(key="_step", value_json=str(step))
        record.history.item.add(key="_timestamp", value_json=repr(time.time()))
        for m in range(metrics):
            record.history.item.add(key=f"actor/m{m}", value_json=repr(0.001 * step + m))
        log.record(record.SerializeToString())
        if stop.wait(max(0.0, started + (step + 1) * step_s - time.monotonic())):
            break
    exit_record = pb.Record()
    exit_record.exit.exit_code = 0
    log.record(exit_record.SerializeToString())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--metrics", type=int, default=200)
    parser.add_argument("--step-s", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=90.0, help="how long the writers write (default 90)")
    args = parser.parse_args()
    steps = int(args.seconds / args.step_s)
    with tempfile.TemporaryDirectory(prefix="keel-bench-watch-") as tmp, keel_server(f"sqlite:///{tmp}/keel.db") as server:
        logs = Path(tmp) / "wandb"
        logs.mkdir()
        watcher = subprocess.Popen(
            [sys.executable, "-m", "keel", "watch", str(logs), "--server", server.url, "--state", f"{tmp}/state", "--framework", "none"],
            cwd=ROOT, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        stop = threading.Event()
        threads = [threading.Thread(target=writer, args=(logs, i, args.metrics, args.step_s, steps, stop)) for i in range(args.runs)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        written = time.monotonic() - started
        time.sleep(3.0)  # the last reads and acks
        ids = [run_id_for(f"wandb/bench/r{i}") for i in range(args.runs)]
        last = [httpx.get(f"{server.url}/api/v1/runs/{run_id}", timeout=30).json().get("last_step") for run_id in ids]
        wall = time.monotonic() - started
        watcher.send_signal(signal.SIGTERM)
        _, status, usage = os.wait4(watcher.pid, 0)
        cpu = usage.ru_utime + usage.ru_stime
        behind = sum(1 for step in last if step != steps - 1)
        print(f"{args.runs} runs x {args.metrics} metrics x 1 step / {args.step_s:g} s, {steps} steps each, written in {written:.0f} s")
        print(f"watcher CPU: {cpu:.1f} s over {wall:.0f} s wall = {100 * cpu / wall:.1f} % of one core (target <= 10 %)")
        print(f"runs with every step on the server 3 s after the last write: {args.runs - behind} of {args.runs}; "
              f"points: {args.runs * steps * args.metrics}")  # fmt: skip


if __name__ == "__main__":
    main()

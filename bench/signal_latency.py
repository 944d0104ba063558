"""From a firing to the trainer's handler: how soon a run can act on its own alert.

A real `keel serve` process, a real `Monitor` (its worker process, default settings) and a
rule with an action (`m > 1`, critical, `"action": "ping"`). Each trial logs a step with
`m = 5`; the clock starts at that `monitor.log` call and stops when the handler registered
with `monitor.on_command` is called with the command the firing sent. In the same trial a
local webhook receiver gets the same firing: the baseline, what a person's pager would get,
measured from the same call. The next step logs `m = 0`, which resolves the alert, so every
trial fires afresh.

    python -m bench.signal_latency [--trials 40] [--database sqlite|postgres]

The Monitor cuts a frame every `flush_interval` (0.25 s): half of it, on average, is in both
figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
import uuid
from functools import partial

import httpx

from bench.alert_latency import Receiver
from bench.support import fresh_database, keel_server, percentile
from trainer_hooks import Command, Monitor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()

    os.environ["KEEL_ALLOW_PRIVATE_WEBHOOKS"] = "true"
    tmp = tempfile.mkdtemp(prefix="keel-bench-")
    receiver = Receiver()
    handled: dict[int, float] = {}
    cond = threading.Condition()

    def handler(command: Command) -> None:
        now = time.perf_counter()
        with cond:
            handled.setdefault(int(command.payload["step"]), now)
            cond.notify_all()

    handler_ms, webhook_ms = [], []
    with fresh_database(args.database, tmp, "keel_bench") as url, keel_server(url) as server:
        hook = f"http://127.0.0.1:{receiver.server.server_address[1]}/hook"
        httpx.post(f"{server.url}/api/v1/webhooks", json={"url": hook}).raise_for_status()
        rule = {"name": "m high", "metric": "m", "detector": "threshold", "params": {"op": ">", "threshold": 1.0},
                "severity": "critical", "keep_firing_for": 1, "action": "ping"}  # fmt: skip
        httpx.post(f"{server.url}/api/v1/rules", json=rule).raise_for_status()
        monitor = Monitor(server.url, run_name=f"signal-latency-{uuid.uuid4().hex[:6]}", spool_dir=tmp)
        monitor.on_command(handler)
        step = 0
        for _ in range(10):  # warm up: the run exists, the socket listens
            monitor.log(step, {"m": 0.0})
            step += 1
        time.sleep(1.0)
        for _ in range(args.trials):
            receiver.arrivals.pop(monitor.run_id, None)
            started = time.perf_counter()
            monitor.log(step, {"m": 5.0})
            with cond:
                if not cond.wait_for(partial(dict.__contains__, handled, step), timeout=30):
                    raise TimeoutError(f"no command for step {step}")
            handler_ms.append(1000 * (handled[step] - started))
            webhook_ms.append(1000 * (receiver.wait(monitor.run_id) - started))
            step += 1
            monitor.log(step, {"m": 0.0})  # resolves it
            step += 1
            time.sleep(0.3)
        monitor.finish()
    for label, ms in (("to the trainer's handler", handler_ms), ("to a webhook receiver (baseline)", webhook_ms)):
        ms = sorted(ms)
        print(f"firing {label}, from monitor.log ({args.database}, {len(ms)} trials): "
              f"p50 {statistics.median(ms):.0f} ms, p95 {percentile(ms, 95):.0f} ms, max {ms[-1]:.0f} ms")  # fmt: skip
    print(f"handler / webhook: p50 {statistics.median(handler_ms) / statistics.median(webhook_ms):.2f}, "
          f"p95 {percentile(sorted(handler_ms), 95) / percentile(sorted(webhook_ms), 95):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

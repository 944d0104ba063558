"""Alert latency: from the ingest ack of the triggering step to the webhook at a local receiver.

A real `keel serve` process (SQLite or PostgreSQL) and a real HTTP receiver in
this process. Each trial opens a run, streams 20 healthy steps, then a frame
whose step carries a NaN gradient norm (the default critical "non-finite" rule
fires on it); the clock starts when that frame's ack arrives and stops when the
signed firing webhook for that run reaches the receiver. Optional background
load streams other runs at the same time.

    python -m bench.alert_latency [--trials 50] [--database sqlite|postgres] [--load-runs 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from websockets.asyncio.client import connect

from bench.support import fresh_database, keel_server, percentile
from wire import Hello, Points, Row, RunInfo


class Receiver:
    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.event = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                now = time.perf_counter()
                self.send_response(204)
                self.end_headers()
                payload = json.loads(body)
                if payload.get("type") == "alert.firing":
                    with receiver.event:
                        receiver.arrivals.setdefault(payload["alert"]["run_id"], now)
                        receiver.event.notify_all()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, run_id: str, timeout: float = 30.0) -> float:
        with self.event:
            if not self.event.wait_for(lambda: run_id in self.arrivals, timeout=timeout):
                raise TimeoutError(f"no webhook for {run_id}")
            return self.arrivals[run_id]


async def trial(ws_url: str, receiver: Receiver) -> float:
    run_id = str(uuid.uuid4())
    async with connect(f"{ws_url}/api/v1/ingest") as ws:
        await ws.send(json.dumps(Hello(RunInfo(id=run_id, name=f"lat-{run_id[:6]}")).to_json()))
        await ws.recv()
        healthy = [Row(step=s, time=None, values={"grad/norm": 1.0, "reward/mean": 0.5}) for s in range(20)]
        await ws.send(json.dumps(Points(0, healthy).to_json()))
        await ws.recv()
        spike = [Row(step=20, time=None, values={"grad/norm": math.nan, "reward/mean": 0.5})]
        await ws.send(json.dumps(Points(1, spike).to_json()))
        await ws.recv()
        acked = time.perf_counter()
    arrived = await asyncio.to_thread(receiver.wait, run_id)
    return arrived - acked


async def background_load(ws_url: str, stop: asyncio.Event) -> None:
    run_id = str(uuid.uuid4())
    async with connect(f"{ws_url}/api/v1/ingest") as ws:
        await ws.send(json.dumps(Hello(RunInfo(id=run_id, name=f"load-{run_id[:6]}")).to_json()))
        await ws.recv()
        seq = 0
        while not stop.is_set():
            rows = [Row(step=seq * 10 + i, time=None, values={f"m/{k}": 0.1 * k for k in range(20)}) for i in range(10)]
            await ws.send(json.dumps(Points(seq, rows).to_json()))
            await ws.recv()
            seq += 1
            await asyncio.sleep(0.01)


async def measure(base: str, receiver: Receiver, trials: int, load_runs: int) -> list[float]:
    ws_url = base.replace("http://", "ws://")
    stop = asyncio.Event()
    loaders = [asyncio.create_task(background_load(ws_url, stop)) for _ in range(load_runs)]
    try:
        return [await trial(ws_url, receiver) for _ in range(trials)]
    finally:
        stop.set()
        await asyncio.gather(*loaders, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--database", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--load-runs", type=int, default=4)
    args = parser.parse_args()

    os.environ["KEEL_ALLOW_PRIVATE_WEBHOOKS"] = "true"
    tmp = tempfile.mkdtemp(prefix="keel-bench-")
    receiver = Receiver()
    with fresh_database(args.database, tmp, "keel_bench") as url, keel_server(url) as server:
        hook = f"http://127.0.0.1:{receiver.server.server_address[1]}/hook"
        httpx.post(f"{server.url}/api/v1/webhooks", json={"url": hook}).raise_for_status()
        latencies = asyncio.run(measure(server.url, receiver, args.trials, args.load_runs))
    ms = sorted(1000 * x for x in latencies)
    p95 = percentile(ms, 95)
    print(f"alert latency, ingest ack -> webhook received ({args.database}, {args.load_runs} runs streaming alongside, {len(ms)} trials): "
          f"p50 {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, max {ms[-1]:.1f} ms  (target p95 <= 500 ms)")


if __name__ == "__main__":
    main()

"""Fairness: another trainer's ack latency while one client ingests a 7 MiB frame.

A "small" trainer streams 10-row frames (20 metrics) with one frame in flight and times
each ack; meanwhile a "big" client sends frames of ~600k points (~7 MiB, the size an
outside tester used). Printed last: the small trainer's ack p50/p99 with the big client
running, against the same figures measured alone in the same invocation.

    python -m bench.fairness [--database sqlite|postgres|both] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid

from websockets.asyncio.client import connect

from bench.support import fresh_database, keel_server, percentile
from wire import Hello, Points, Row, RunInfo

BIG_ROWS, BIG_KEYS = 10_000, 60  # 600k points, about 7 MiB of JSON


async def _open(ws_url: str, name: str, local_host: str = "127.0.0.1"):  # type: ignore[no-untyped-def]
    # Each client from its own loopback address: two hosts, two rate-limit buckets (the
    # server limits per address when auth is off), as two trainers would be.
    ws = await connect(f"{ws_url}/api/v1/ingest", max_size=None, local_addr=(local_host, 0))
    await ws.send(json.dumps(Hello(RunInfo(id=str(uuid.uuid4()), name=name)).to_json()))
    await ws.recv()
    return ws


async def small_trainer(ws_url: str, stop: asyncio.Event, latencies: list[float]) -> None:
    ws = await _open(ws_url, "small")
    seq = 0
    while not stop.is_set():
        rows = [Row(step=seq * 10 + i, time=None, values={f"m/{k}": 0.1 * k for k in range(20)}) for i in range(10)]
        frame = json.dumps(Points(seq, rows).to_json(), separators=(",", ":"))
        started = time.perf_counter()
        await ws.send(frame)
        reply = json.loads(await ws.recv())
        assert reply == {"type": "ack", "seq": seq}, reply
        latencies.append((time.perf_counter() - started) * 1000)
        seq += 1
        await asyncio.sleep(0.02)
    await ws.close()


def big_frames(count: int) -> list[str]:
    """The big client's frames, built before a trial: building one takes about a second of
    this process's CPU, which would otherwise stall the small trainer's own loop and be
    counted as the server's latency."""
    frames = []
    for seq in range(count):
        rows = [
            Row(step=seq * BIG_ROWS + i, time=None, values={f"b{k}": float(i + k) for k in range(BIG_KEYS)})
            for i in range(BIG_ROWS)
        ]
        frames.append(json.dumps(Points(seq, rows).to_json(), separators=(",", ":")))
    return frames


async def big_client(ws_url: str, stop: asyncio.Event, sent: list[int], frames: list[str]) -> None:
    ws = await _open(ws_url, "big", local_host="127.0.0.2")
    for frame in frames:
        if stop.is_set():
            break
        await ws.send(frame)
        reply = json.loads(await ws.recv())
        assert reply["type"] == "ack", reply
        sent.append(len(frame))
    await ws.close()


async def rest_flood(ws_url: str, stop: asyncio.Event, sent: list[int], connections: int = 16) -> None:
    """`connections` clients POSTing 100-row point bodies to one run as fast as they are answered."""
    import httpx

    ws = await _open(ws_url, "rest-flood", local_host="127.0.0.3")  # creates the run
    base = ws_url.replace("ws://", "http://")
    runs = (await httpx.AsyncClient().get(f"{base}/api/v1/runs")).json()
    target = next(r["id"] for r in runs if r["name"] == "rest-flood")
    async def one(index: int) -> None:
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.3")
        async with httpx.AsyncClient(transport=transport, timeout=60) as client:
            step = index * 10**9
            while not stop.is_set():
                rows = [{"step": step + i, "values": {f"m/{k}": 0.5 for k in range(20)}} for i in range(100)]
                try:
                    response = await client.post(f"{base}/api/v1/runs/{target}/points", json={"rows": rows})
                except httpx.HTTPError:
                    sent.append(0)  # dropped by the server (a deadline): counted, the flood goes on
                    continue
                sent.append(response.status_code)
                step += 100
                if response.status_code == 429:
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")))

    await asyncio.gather(*(one(i) for i in range(connections)))
    await ws.close()


async def trial(
    ws_url: str, seconds: float, big: list[str] | None = None, flood: bool = False
) -> tuple[list[float], list[int]]:
    stop = asyncio.Event()
    latencies: list[float] = []
    sent: list[int] = []
    tasks = [asyncio.create_task(small_trainer(ws_url, stop, latencies))]
    if big:
        tasks.append(asyncio.create_task(big_client(ws_url, stop, sent, big)))
    if flood:
        tasks.append(asyncio.create_task(rest_flood(ws_url, stop, sent)))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.gather(*tasks)
    return latencies, sent


def measure(database_url: str, seconds: float) -> dict[str, float]:
    with keel_server(database_url) as server:
        ws_url = server.ws_url
        alone, _ = asyncio.run(trial(ws_url, seconds))
        # More frames than the server can take in the trial: the big client never pauses.
        loaded, big = asyncio.run(trial(ws_url, seconds, big=big_frames(max(4, int(seconds / 2)))))
        flooded, posts = asyncio.run(trial(ws_url, seconds, flood=True))
    return {
        "alone_p50": statistics.median(alone), "alone_p99": percentile(alone, 99),
        "loaded_p50": statistics.median(loaded), "loaded_p99": percentile(loaded, 99),
        "big_frames": len(big), "big_mib": (statistics.median(big) / 2**20) if big else 0.0,
        "flood_p50": statistics.median(flooded), "flood_p99": percentile(flooded, 99),
        "flood_posts": len(posts), "flood_429": sum(1 for status in posts if status == 429),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--seconds", type=float, default=20.0, help="per trial (alone, then with the big client)")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    kinds = ["sqlite", "postgres"] if args.database == "both" else [args.database]
    with tempfile.TemporaryDirectory(prefix="keel-fairness-") as tmp:
        for kind in kinds:
            with fresh_database(kind, tmp, "keel_fair") as url:
                results[kind] = measure(url, args.seconds)
    for label, r in results.items():
        print(
            f"{label:8s} small trainer's ack: alone p50 {r['alone_p50']:6.1f} ms, p99 {r['alone_p99']:6.1f} ms | "
            f"beside {r['big_frames']:.0f} frames of {r['big_mib']:.1f} MiB: p50 {r['loaded_p50']:6.1f} ms, "
            f"p99 {r['loaded_p99']:6.1f} ms  (p99 x{r['loaded_p99'] / r['alone_p99']:.1f} of alone; target <= 250 ms)"
        )
        print(
            f"{label:8s} beside a 16-connection REST write flood ({r['flood_posts']:.0f} POSTs, "
            f"{r['flood_429']:.0f} answered 429): p50 {r['flood_p50']:6.1f} ms, p99 {r['flood_p99']:6.1f} ms "
            f"(p50 x{r['flood_p50'] / r['alone_p50']:.1f} of alone)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

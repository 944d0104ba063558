"""End-to-end ingest throughput: acknowledged points/s over the websocket.

8 concurrent runs x 20 metrics stream into a real `keel serve` process (one
PostgreSQL database, one SQLite file), each client keeping several frames in
flight. Beside it, in the same invocation, a raw bulk insert of the same rows
into the same database (COPY on PostgreSQL, executemany on SQLite) into a durable
table with the points' primary key gives the ceiling the ingest path is measured
against: what the database itself can store, with nothing of Keel around it.

    python -m bench.ingest [--steps 5000] [--runs 8] [--metrics 20] [--rows-per-frame 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
import uuid

import psycopg
from websockets.asyncio.client import connect

from bench.support import fresh_database, keel_server
from wire import Finish, Hello, Points, Row, RunInfo


def frames(steps: int, metrics: int, rows_per_frame: int) -> list[str]:
    keys = [f"bench/metric_{i:02d}" for i in range(metrics)]
    out = []
    for seq, start in enumerate(range(0, steps, rows_per_frame)):
        rows = [
            Row(step=s, time=1.7e9 + s, values={k: (s * 0.001 + i) for i, k in enumerate(keys)})
            for s in range(start, min(steps, start + rows_per_frame))
        ]
        out.append(json.dumps(Points(seq, rows).to_json()))
    return out


async def stream_run(ws_url: str, payload: list[str], window: int) -> None:
    run_id = str(uuid.uuid4())
    async with connect(f"{ws_url}/api/v1/ingest", max_size=None) as ws:
        await ws.send(json.dumps(Hello(RunInfo(id=run_id, name=run_id[:8])).to_json()))
        json.loads(await ws.recv())
        in_flight = 0
        for frame in payload:
            if in_flight == window:
                assert json.loads(await ws.recv())["type"] == "ack"
                in_flight -= 1
            await ws.send(frame)
            in_flight += 1
        for _ in range(in_flight):
            assert json.loads(await ws.recv())["type"] == "ack"
        await ws.send(json.dumps(Finish("finished").to_json()))
        await ws.recv()


async def ingest_rate(base: str, runs: int, payload: list[str], points_per_run: int, window: int) -> float:
    ws_url = base.replace("http://", "ws://")
    started = time.perf_counter()
    await asyncio.gather(*(stream_run(ws_url, payload, window) for _ in range(runs)))
    return runs * points_per_run / (time.perf_counter() - started)


def raw_rows(runs: int, steps: int, metrics: int) -> list[tuple[int, int, float, float]]:
    return [(r * metrics + m + 1, s, s * 0.001 + m, 1.7e9 + s) for r in range(runs) for m in range(metrics) for s in range(steps)]


def raw_postgres(url: str, rows: list[tuple[int, int, float, float]]) -> float:
    table = f"raw_points_{uuid.uuid4().hex[:8]}"  # logged, like points: WAL and fsync counted
    with psycopg.connect(url) as conn:
        conn.execute(f"CREATE TABLE {table} (series_id integer, step bigint, value double precision, wall_time double precision, PRIMARY KEY (series_id, step))")
        conn.commit()
        started = time.perf_counter()
        with conn.cursor().copy(f"COPY {table} (series_id, step, value, wall_time) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
        conn.commit()
        rate = len(rows) / (time.perf_counter() - started)
        conn.execute(f"DROP TABLE {table}")
        conn.commit()
        return rate


def raw_sqlite(path: str, rows: list[tuple[int, int, float, float]]) -> float:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("DROP TABLE IF EXISTS raw_points")
    conn.execute("CREATE TABLE raw_points (series_id integer, step bigint, value real, wall_time real, PRIMARY KEY (series_id, step)) WITHOUT ROWID")
    started = time.perf_counter()
    conn.executemany("INSERT INTO raw_points VALUES (?, ?, ?, ?)", rows)
    conn.commit()
    rate = len(rows) / (time.perf_counter() - started)
    conn.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--rows-per-frame", type=int, default=100)
    parser.add_argument("--window", type=int, default=8, help="frames in flight per client")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    payload = frames(args.steps, args.metrics, args.rows_per_frame)
    points_per_run = args.steps * args.metrics
    rows = raw_rows(args.runs, args.steps, args.metrics)
    print(f"{args.runs} runs x {args.metrics} metrics x {args.steps} steps = {args.runs * points_per_run:,} points per repeat; "
          f"{args.rows_per_frame} rows/frame, {args.window} frames in flight")

    tmp = tempfile.mkdtemp(prefix="keel-bench-")
    for label in ("postgres", "sqlite"):
        with fresh_database(label, tmp, "keel_bench") as url, keel_server(url) as server:
            ingest, bulk = [], []
            for _ in range(args.repeats):
                ingest.append(asyncio.run(ingest_rate(server.url, args.runs, payload, points_per_run, args.window)))
                # COPY into the server's own database; executemany into a SQLite file beside its.
                bulk.append(raw_postgres(url, rows) if label == "postgres" else raw_sqlite(f"{tmp}/raw.db", rows))
        ingest_med, bulk_med = statistics.median(ingest), statistics.median(bulk)
        print(f"{label:8s}  websocket ingest, acked: {ingest_med:>10,.0f} points/s   "
              f"raw bulk insert: {bulk_med:>10,.0f} rows/s   ratio {ingest_med / bulk_med:.2f}   "
              f"(medians of {args.repeats}; ingest runs {[f'{x:,.0f}' for x in ingest]})")


if __name__ == "__main__":
    main()

"""Bucketed series reads: rollup-served (the server's) against the full scan the old code ran.

Loads, through the storage path ingest uses (`Store.write_points`), one run with a
1,000,000-step series (a +Inf, a NaN and a dip in it) and 4 runs x 5 metrics x 100,000
steps, into a fresh PostgreSQL database and a fresh SQLite file. Then times, medians over
repeats, interleaved:

- a 1,000-bucket read of the 1M-step series, and of one 100k-step series;
- the compare page's reads: 20 series (4 runs x 5 metrics, 100k steps) read concurrently;
- zoomed reads of the 1M-step series (random ranges of 1 %..50 % of it, 1,000 buckets).

The baseline is the old read, kept here: count/min/max of the range, then one query
bucketing every point of it. Each figure is checked equal to the baseline's answer before it
is timed. The ratios (rollup / full scan) are printed last.

    python -m bench.reads [--repeats 7] [--long-steps 1000000] [--short-steps 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import func, select, text

from bench.support import fresh_database
from server import db
from server.models import Point, Series
from server.storage import SeriesData, Store
from server.storage.reads import bucketed, loaded
from wire import Row, RunInfo

FULL_SCAN_BUCKETS = text(
    "WITH b AS ("
    "  SELECT step, value, (step - CAST(:lo AS BIGINT)) / CAST(:width AS BIGINT) AS bucket"
    "  FROM points WHERE series_id = :sid AND step >= :lo AND step <= :hi),"
    " agg AS ("
    "  SELECT bucket, MAX(step) AS last_step, MIN(value) AS vmin, MAX(value) AS vmax,"
    "         SUM(CASE WHEN value IS NULL THEN 1 ELSE 0 END) AS nans"
    "  FROM b GROUP BY bucket)"
    " SELECT agg.last_step, p.value, agg.vmin, agg.vmax, agg.nans"
    " FROM agg JOIN points p ON p.series_id = :sid AND p.step = agg.last_step"
    " ORDER BY agg.last_step"
)
"""The bucket query of the code before rollups (migration 0005): it visits every point."""

METRICS = [f"bench/metric_{i}" for i in range(5)]


async def full_scan_series(
    store: Store, run_id: str, key: str, *, max_points: int, start: int | None = None, end: int | None = None
) -> SeriesData:
    """`Store.series` as it was before rollups."""
    async with store.sessions() as session:
        series_id = await session.scalar(select(Series.id).where(Series.run_id == run_id, Series.key == key))
        where = [Point.series_id == series_id]
        if start is not None:
            where.append(Point.step >= start)
        if end is not None:
            where.append(Point.step <= end)
        count, lo, hi = (
            await session.execute(select(func.count(), func.min(Point.step), func.max(Point.step)).where(*where))
        ).one()
        if count <= max_points:
            result = await session.execute(select(Point.step, Point.value).where(*where).order_by(Point.step))
            steps, values = zip(*((step, loaded(value)) for step, value in result), strict=True) if count else ((), ())
            return SeriesData(key=key, downsampled=False, steps=list(steps), values=list(values))
        result = await session.execute(
            FULL_SCAN_BUCKETS, {"sid": series_id, "lo": lo, "hi": hi, "width": -(-(hi - lo + 1) // max_points)}
        )
        return bucketed(key, result)


def _same(a: SeriesData, b: SeriesData) -> bool:
    def norm(xs: list[float] | None) -> list[Any] | None:
        return None if xs is None else [("nan" if math.isnan(x) else x) for x in xs]

    return (a.downsampled, a.steps, norm(a.values), norm(a.mins), norm(a.maxs)) == (
        b.downsampled, b.steps, norm(b.values), norm(b.mins), norm(b.maxs)
    )


async def load(store: Store, long_steps: int, short_steps: int) -> tuple[str, list[str]]:
    now = time.time()
    long_run = str(uuid.uuid4())
    await store.open_run(RunInfo(id=long_run, name="long"), now)
    special = {long_steps * 2 // 3: math.inf, long_steps // 8: -5.0, long_steps * 9 // 10: math.nan}
    chunk = 20_000
    for first in range(0, long_steps, chunk):
        rows = [
            Row(step=s, time=now, values={"x": special.get(s, math.sin(s / 1000))})
            for s in range(first, min(long_steps, first + chunk))
        ]
        await store.write_points(long_run, rows, now)
    short_runs = [str(uuid.uuid4()) for _ in range(4)]
    for index, run_id in enumerate(short_runs):
        await store.open_run(RunInfo(id=run_id, name=f"short-{index}"), now)
        for first in range(0, short_steps, chunk // len(METRICS)):
            rows = [
                Row(step=s, time=now, values={k: math.cos(s / 700 + m + index) for m, k in enumerate(METRICS)})
                for s in range(first, min(short_steps, first + chunk // len(METRICS)))
            ]
            await store.write_points(run_id, rows, now)
    return long_run, short_runs


Read = Callable[..., Awaitable[SeriesData]]


async def timed(call: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    started = time.perf_counter()
    answer = await call()
    return (time.perf_counter() - started) * 1000, answer


async def measure(url: str, long_steps: int, short_steps: int, repeats: int) -> dict[str, tuple[float, float]]:
    """{figure: (rollup ms, full-scan ms)}, medians of `repeats`."""
    await db.upgrade_async(url)
    store = Store(db.create_engine(url))
    try:
        started = time.perf_counter()
        long_run, short_runs = await load(store, long_steps, short_steps)
        loaded = long_steps + 4 * len(METRICS) * short_steps
        print(f"  loaded {loaded:,} points through Store.write_points in {time.perf_counter() - started:.1f} s", flush=True)
        rng = random.Random(1)
        zooms = []
        for _ in range(repeats):
            length = rng.randint(long_steps // 100, long_steps // 2)
            first = rng.randint(0, long_steps - length)
            zooms.append((first, first + length))

        def cases(read: Read, repeat: int) -> dict[str, Callable[[], Awaitable[Any]]]:
            start, end = zooms[repeat]
            return {
                "1M-step series, 1,000 buckets": lambda: read(store, long_run, "x", max_points=1000),
                "100k-step series, 1,000 buckets": lambda: read(store, short_runs[0], METRICS[0], max_points=1000),
                "compare page: 20 x 100k concurrently": lambda: asyncio.gather(
                    *(read(store, run_id, key, max_points=1000) for run_id in short_runs for key in METRICS)
                ),
                "zoomed 1M-step series, 1,000 buckets": lambda: read(
                    store, long_run, "x", max_points=1000, start=start, end=end
                ),
            }

        async def rollup_read(store: Store, run_id: str, key: str, **kwargs: Any) -> SeriesData:
            return await store.series(run_id, key, **kwargs)

        times: dict[str, tuple[list[float], list[float]]] = {}
        for repeat in range(repeats):
            new_cases, old_cases = cases(rollup_read, repeat), cases(full_scan_series, repeat)
            for name in new_cases:
                # Alternate which goes first, so neither always meets a warmer cache.
                order = [(0, new_cases[name]), (1, old_cases[name])]
                if repeat % 2:
                    order.reverse()
                answers: list[Any] = [None, None]
                for slot, call in order:
                    ms, answers[slot] = await timed(call)
                    times.setdefault(name, ([], []))[slot].append(ms)
                new, old = answers
                pairs = zip(new, old, strict=True) if isinstance(new, list) else [(new, old)]
                assert all(_same(a, b) for a, b in pairs), f"{name}: rollup read differs from the full scan"
        return {name: (statistics.median(new), statistics.median(old)) for name, (new, old) in times.items()}
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--long-steps", type=int, default=1_000_000)
    parser.add_argument("--short-steps", type=int, default=100_000)
    parser.add_argument("--databases", default="postgres,sqlite")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="keel-bench-")
    results: dict[str, dict[str, tuple[float, float]]] = {}
    for label in args.databases.split(","):
        print(f"{label}:", flush=True)
        with fresh_database(label, tmp, "keel_bench_reads") as url:
            results[label] = asyncio.run(measure(url, args.long_steps, args.short_steps, args.repeats))
        for name, (new, old) in results[label].items():
            print(f"  {name}: {new:.1f} ms (full scan {old:.1f} ms)", flush=True)
    print(f"\nmedians of {args.repeats}; every rollup answer equal to the full scan's")
    print(f"{'database':9s}  {'read':40s} {'rollups':>10s} {'full scan':>10s} {'ratio':>7s}")
    for label, figures in results.items():
        for name, (new, old) in figures.items():
            print(f"{label:9s}  {name:40s} {new:8.1f}ms {old:8.1f}ms {new / old:7.3f}")


if __name__ == "__main__":
    main()

"""Load: many live runs at once, a browser watching some of them, the server's cost over time.

`--runs` runs (default 64) stream `--rate` steps/s (10) x `--metrics` metrics (20) each
into a real `keel serve` process, for `--seconds` (60). The runs live in `--clients`
separate processes (4), so the load generator does not share the server's interpreter:
raw protocol clients (the `wire` encoders), one socket per run, one frame per
step (or, with `--flush-interval`, one per that many seconds, as the Monitor batches), at
most `--window` frames in flight like the Monitor (`SenderConfig.window`); a run whose
window is full sends the steps that fell due meanwhile in one frame, as the Monitor would.
A headless Chromium keeps the compare page of 4 of the runs open and records when each
point is painted (`window.keelLive.drawn`, as bench/live_latency.py reads it).

Sampled every second, written to artifacts/load/<database>-<runs>.csv and plotted to
artifacts/load/load-<database>.png (matplotlib):

- server CPU: utime+stime of the `keel serve` process from /proc/<pid>/stat, % of one core
  (and the same for the PostgreSQL backends of its database and for the browser, for context);
- ack latency p50/p95 of the acks that arrived in that second (frame sent -> ack received);
- live p95 of the points painted in that second (frame sent -> painted in the page);
- backlog: steps due by then (each run's schedule) minus steps acknowledged by then.

Targets (the issue "Fast at any length and any load"): server CPU < 50 % of one core,
ack p95 and live p95 <= 250 ms, no growing backlog. The same measurement with
`--baseline-runs` (8) runs is taken first, in the same invocation; the figures are printed
last, as ratios against the targets and against that baseline. The first `--warmup`
seconds (5) are plotted but left out of the figures.

    python -m bench.load [--runs 64] [--seconds 60] [--database postgres|sqlite|both]

Needs /usr/bin/chromium and /usr/bin/chromedriver, and matplotlib for the plot (without
it the CSV is still written). Measure on a quiet machine: the clients and the browser
share its cores with the server.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from websockets.asyncio.client import connect

from bench.live_latency import KEYS, browser, wait
from bench.support import ROOT, KeelServer, fresh_database, keel_server, percentile
from wire import Hello, Points, Row, RunInfo

TARGET_CPU_PCT = 50.0
TARGET_ACK_P95_MS = 250.0
TARGET_LIVE_P95_MS = 250.0
WATCHED = 4
"""Runs on the compare page (its five headline charts, one line per run)."""
HISTORY_STEPS = 50
"""Steps each run holds before the page opens, so its charts have something to extend."""
DRAIN_S = 20.0
"""After the schedule ends, how long the clients wait for their last acks."""
CLK_TCK = os.sysconf("SC_CLK_TCK")


def metric_keys(metrics: int) -> list[str]:
    """The page's five headline keys first (what the browser paints), then filler."""
    return [*KEYS, *(f"load/metric_{i:02d}" for i in range(max(0, metrics - len(KEYS))))][:metrics]


def row(step: int, keys: list[str], seed: int) -> Row:
    wobble = math.sin(step * 0.3 + seed)
    return Row(step=step, time=time.time(), values={k: 1.0 + i + 0.1 * wobble for i, k in enumerate(keys)})


# -- the load clients (separate processes) ------------------------------------------------


@dataclass
class ClientPlan:
    """What one client process streams: its runs, the schedule and where to write frames."""

    ws_url: str
    run_ids: list[str]
    seconds: float
    rate: float
    metrics: int
    window: int
    flush_interval: float
    out_path: str
    seed: int


async def stream_run(
    plan: ClientPlan, run_id: str, seed: int, go: Any, go_at: Any, ready: Any, records: list[list[Any]]
) -> None:
    keys = metric_keys(plan.metrics)
    period = 1.0 / plan.rate
    # As the Monitor connects: no per-message compression (metric frames are small).
    async with connect(f"{plan.ws_url}/api/v1/ingest", max_size=None, compression=None) as ws:
        run = RunInfo(id=run_id, name=f"load-{run_id[:6]}", project="load", group=f"g{seed % 4}")
        await ws.send(json.dumps(Hello(run).to_json()))
        assert json.loads(await ws.recv())["type"] == "welcome"
        history = [row(s, keys, seed) for s in range(HISTORY_STEPS)]
        await ws.send(json.dumps(Points(0, history).to_json()))
        assert json.loads(await ws.recv())["type"] == "ack"
        ready.put(run_id)
        await asyncio.to_thread(go.wait)

        slots = asyncio.Semaphore(plan.window)
        # seq -> [run, seq, first step, steps, first step due, sent, acked] (wall-clock seconds)
        frames: dict[int, list[Any]] = {}
        unacked = 0
        schedule_done, all_acked = asyncio.Event(), asyncio.Event()

        async def read_acks() -> None:
            nonlocal unacked
            async for message in ws:
                reply = json.loads(message)
                assert reply["type"] == "ack", reply
                frames[reply["seq"]][6] = time.time()
                unacked -= 1
                slots.release()
                if schedule_done.is_set() and unacked == 0:
                    all_acked.set()

        reader = asyncio.create_task(read_acks())
        # Independent trainers: each run's phase is random within a step.
        start = go_at.value + random.Random(seed).uniform(0, period)
        total = int(plan.seconds * plan.rate)
        k, seq = 0, 1
        while k < total:
            # A frame is cut when its oldest step has waited `flush_interval` (the Monitor's).
            await asyncio.sleep(max(0.0, start + k * period + plan.flush_interval - time.time()))
            await slots.acquire()
            now = time.time()
            due = min(total, max(k + 1, int((now - start) / period) + 1))  # steps due by now
            rows = [row(HISTORY_STEPS + s, keys, seed) for s in range(k, due)]
            frames[seq] = [run_id, seq, HISTORY_STEPS + k, due - k, start + k * period, now, math.nan]
            unacked += 1
            await ws.send(json.dumps(Points(seq, rows).to_json()))
            seq, k = seq + 1, due
        schedule_done.set()
        if unacked == 0:
            all_acked.set()
        try:
            await asyncio.wait_for(all_acked.wait(), DRAIN_S)
        except TimeoutError:
            pass
        reader.cancel()
        records.extend(frames.values())


async def run_client(plan: ClientPlan, go: Any, go_at: Any, ready: Any) -> list[list[Any]]:
    records: list[list[Any]] = []
    await asyncio.gather(
        *(
            stream_run(plan, run_id, plan.seed * 1000 + i, go, go_at, ready, records)
            for i, run_id in enumerate(plan.run_ids)
        )
    )
    return records


def client_main(plan: ClientPlan, go: Any, go_at: Any, ready: Any) -> None:
    records = asyncio.run(run_client(plan, go, go_at, ready))
    with open(plan.out_path, "w", newline="") as out:
        csv.writer(out).writerows(records)


# -- sampling the server ------------------------------------------------------------------


def cpu_seconds(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def runqueue_wait_s(pid: int) -> float:
    """Seconds the server's main thread (its event loop) has waited for a CPU, runnable."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (FileNotFoundError, IndexError):
        return math.nan


def browser_cpu_seconds() -> dict[int, float]:
    """CPU seconds of every Chromium process on the machine (the page's browser), by pid."""
    found = {}
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            browser = comm.read_text().strip() in ("chromium", "chrome")
        except OSError:
            continue
        if browser and (seconds := cpu_seconds(int(comm.parent.name))) is not None:
            found[int(comm.parent.name)] = seconds
    return found


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class Sampler(threading.Thread):
    """Every second: the server's and its PostgreSQL backends' CPU (% of one core), its RSS,
    and how busy the whole machine was."""

    def __init__(self, pid: int, pg_url: str | None):
        super().__init__(daemon=True)
        self.pid = pid
        self.pg_url = pg_url
        self.samples: list[dict[str, float]] = []
        self.stop = threading.Event()

    def _backends(self, conn: Any) -> dict[int, float]:
        if conn is None:
            return {}
        pids = [p for (p,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()]
        return {p: c for p in pids if (c := cpu_seconds(p)) is not None}

    def run(self) -> None:
        conn = psycopg.connect(self.pg_url, autocommit=True) if self.pg_url else None
        try:
            wall, cpu, runq = time.time(), cpu_seconds(self.pid) or 0.0, runqueue_wait_s(self.pid)
            backends, machine, browser_cpu = self._backends(conn), machine_busy(), browser_cpu_seconds()
            while not self.stop.wait(max(0.0, wall + 1.0 - time.time())):
                now_wall, now_cpu = time.time(), cpu_seconds(self.pid)
                if now_cpu is None:
                    return
                now_backends, now_machine = self._backends(conn), machine_busy()
                now_runq, now_browser = runqueue_wait_s(self.pid), browser_cpu_seconds()
                elapsed = now_wall - wall
                pg = sum(c - backends[p] for p, c in now_backends.items() if p in backends)
                page = sum(c - browser_cpu.get(p, 0.0) for p, c in now_browser.items())
                self.samples.append({
                    "t": now_wall,
                    "server_cpu_pct": 100 * (now_cpu - cpu) / elapsed,
                    "pg_cpu_pct": 100 * pg / elapsed,
                    "browser_cpu_pct": 100 * page / elapsed,
                    "machine_busy_pct": 100 * (now_machine[0] - machine[0]) / max(1, now_machine[1] - machine[1]),
                    "server_rss_mib": rss_mib(self.pid),
                    "server_runq_wait_pct": 100 * (now_runq - runq) / elapsed,
                })
                wall, cpu, runq = now_wall, now_cpu, now_runq
                backends, machine, browser_cpu = now_backends, now_machine, now_browser
        finally:
            if conn is not None:
                conn.close()


# -- the browser --------------------------------------------------------------------------


class Page:
    """The compare page of the watched runs; collects the first paint of each (run, step)."""

    DRAWN_JS = (
        "var key = arguments[0], since = arguments[1]; return window.keelLive.drawn"
        ".filter(function (d) { return d.key === key && d.t > since; })"
    )

    def __init__(self, base: str, run_ids: list[str]):
        self.driver = browser()
        self.painted_ms: dict[tuple[str, int], float] = {}
        self._since = 0.0
        self.driver.get(f"{base}/compare?runs={','.join(run_ids)}")
        charts_js = (
            "return Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot'))"
            ".filter(g => g.layout && g.layout.meta && g.layout.meta.render_id).length"
        )
        wait(lambda: self.driver.execute_script(charts_js) == len(KEYS), 120, "five charts")
        state_js = "return document.getElementById('live-indicator').getAttribute('data-state')"
        wait(lambda: self.driver.execute_script(state_js) == "live", 60, "live websocket")

    def collect(self) -> None:
        """Read what was painted since the last call (the page keeps the last 20 000 paints)."""
        for d in self.driver.execute_script(self.DRAWN_JS, KEYS[0], self._since):
            self.painted_ms.setdefault((d["run"], int(d["step"])), float(d["t"]))
            self._since = max(self._since, float(d["t"]))

    def console_errors(self) -> int:
        return sum(1 for e in self.driver.get_log("browser") if e["level"] == "SEVERE")

    def quit(self) -> None:
        self.driver.quit()


# -- one scenario -------------------------------------------------------------------------


@dataclass
class Scenario:
    database: str
    runs: int
    per_second: list[dict[str, float]] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)


def run_scenario(kind: str, runs: int, args: argparse.Namespace, tmp: str) -> Scenario:
    with fresh_database(kind, tmp, "keel_load") as url, keel_server(url) as server:
        # On PostgreSQL the sampler reads the CPU of the database's backends through its URL.
        return load_scenario(server, url if kind == "postgres" else None, kind, runs, args, tmp)


def load_scenario(
    server: KeelServer, pg_url: str | None, kind: str, runs: int, args: argparse.Namespace, tmp: str
) -> Scenario:
    ctx = mp.get_context("spawn")
    go, go_at, ready = ctx.Event(), ctx.Value("d", 0.0), ctx.Queue()
    run_ids = [str(uuid.uuid4()) for _ in range(runs)]
    clients = max(1, min(args.clients, runs))
    plans = [
        ClientPlan(
            ws_url=server.ws_url, run_ids=run_ids[c::clients], seconds=args.seconds,
            rate=args.rate, metrics=args.metrics, window=args.window, flush_interval=args.flush_interval,
            out_path=f"{tmp}/frames-{kind}-{runs}-{c}.csv", seed=c,
        )
        for c in range(clients)
    ]
    processes = [ctx.Process(target=client_main, args=(plan, go, go_at, ready)) for plan in plans]
    page: Page | None = None
    errors = 0
    sampler: Sampler | None = None
    try:
        for process in processes:
            process.start()
        for _ in range(runs):
            ready.get(timeout=120)
        watched = [plan.run_ids[0] for plan in plans][:WATCHED] or run_ids[:WATCHED]
        watched += [r for r in run_ids if r not in watched][: WATCHED - len(watched)]
        page = None if args.no_page else Page(server.url, watched)
        sampler = Sampler(server.pid, pg_url)
        sampler.start()
        time.sleep(1.5)  # one idle sample before the load starts
        go_at.value = time.time() + 0.5
        go.set()
        end = go_at.value + args.seconds
        while time.time() < end + 3:
            time.sleep(min(5.0, max(0.1, end + 3 - time.time())))
            if page is not None:
                page.collect()
        for process in processes:
            process.join(timeout=DRAIN_S + 30)
        sampler.stop.set()
        sampler.join(timeout=5)
        if page is not None:
            page.collect()
            errors = page.console_errors()
    finally:
        if page is not None:
            page.quit()
        if sampler is not None:
            sampler.stop.set()
        for process in processes:
            if process.is_alive():
                process.kill()

    frames: list[list[Any]] = []
    for plan in plans:
        with open(plan.out_path, newline="") as f:
            frames.extend([r[0], *map(float, r[1:])] for r in csv.reader(f))
    assert sampler is not None
    scenario = Scenario(kind, runs)
    painted = {} if page is None else page.painted_ms
    summarize(scenario, frames, sampler.samples, painted, set(watched), go_at.value, args)
    scenario.figures["browser_console_errors"] = errors
    return scenario


def summarize(
    scenario: Scenario,
    frames: list[list[Any]],
    samples: list[dict[str, float]],
    painted_ms: dict[tuple[str, int], float],
    watched: set[str],
    go_at: float,
    args: argparse.Namespace,
) -> None:
    seconds = int(math.ceil(args.seconds + DRAIN_S))
    period = 1.0 / args.rate
    acks: dict[int, list[float]] = defaultdict(list)
    acked_steps = [0] * (seconds + 1)
    due_steps = [0] * (seconds + 1)
    sent_at: dict[tuple[str, int], float] = {}
    steady_acks, lags = [], []
    for run_id, _seq, first, steps, due, sent, acked in frames:
        for j, step in enumerate(range(int(first), int(first + steps))):
            sent_at[(run_id, step)] = sent
            due_steps[min(seconds, max(0, int(due + j * period - go_at)))] += 1
        lags.append(sent - due - args.flush_interval)
        if math.isnan(acked):
            continue
        acked_steps[min(seconds, max(0, int(acked - go_at)))] += int(steps)
        acks[int(acked - go_at)].append(1000 * (acked - sent))
        if args.warmup <= sent - go_at <= args.seconds:
            steady_acks.append(1000 * (acked - sent))
    live: dict[int, list[float]] = defaultdict(list)
    steady_live = []
    for (run_id, step), t_ms in painted_ms.items():
        if (run_id, step) in sent_at and run_id in watched:
            latency = t_ms - 1000 * sent_at[(run_id, step)]
            live[int(t_ms / 1000 - go_at)].append(latency)
            if args.warmup <= sent_at[(run_id, step)] - go_at <= args.seconds:
                steady_live.append(latency)
    expected_live = sum(1 for (r, _s) in sent_at if r in watched)

    by_second = {int(s["t"] - go_at): s for s in samples}
    acked_total = due_total = 0
    for second in range(-1, seconds + 1):
        if second >= 0:
            acked_total += acked_steps[second]
            due_total += due_steps[second]
        sample = by_second.get(second, {})
        scenario.per_second.append({
            "t_s": second,
            "server_cpu_pct": sample.get("server_cpu_pct", math.nan),
            "pg_cpu_pct": sample.get("pg_cpu_pct", math.nan),
            "browser_cpu_pct": sample.get("browser_cpu_pct", math.nan),
            "machine_busy_pct": sample.get("machine_busy_pct", math.nan),
            "server_rss_mib": sample.get("server_rss_mib", math.nan),
            "server_runq_wait_pct": sample.get("server_runq_wait_pct", math.nan),
            "acks": len(acks.get(second, [])),
            "ack_p50_ms": statistics.median(acks[second]) if acks.get(second) else math.nan,
            "ack_p95_ms": percentile(acks[second], 95) if acks.get(second) else math.nan,
            "live_p95_ms": percentile(live[second], 95) if live.get(second) else math.nan,
            "steps_due": due_total,
            "steps_acked": acked_total,
            "backlog_steps": due_total - acked_total,
        })

    # The drain's idle tail is left out (two seconds after the last ack kept).
    last = max((r["t_s"] for r in scenario.per_second if r["acks"]), default=seconds)
    scenario.per_second = [r for r in scenario.per_second if r["t_s"] <= last + 2]
    steady = [r for r in scenario.per_second if args.warmup <= r["t_s"] < args.seconds]
    acked_in_steady = sum(acked_steps[int(args.warmup):int(args.seconds)]) * args.metrics
    frames_in_steady = sum(
        1 for f in frames if not math.isnan(f[6]) and args.warmup <= f[6] - go_at < int(args.seconds)
    )
    steady_s = max(1.0, int(args.seconds) - int(args.warmup))
    cpu = [r["server_cpu_pct"] for r in steady if not math.isnan(r["server_cpu_pct"])]
    backlog = [r["backlog_steps"] for r in steady]
    total_steps = sum(int(f[3]) for f in frames)
    lost = total_steps - sum(int(f[3]) for f in frames if not math.isnan(f[6]))
    scenario.figures.update({
        "server_cpu_mean_pct": statistics.fmean(cpu) if cpu else math.nan,
        "server_cpu_p95_pct": percentile(cpu, 95) if cpu else math.nan,
        "pg_cpu_mean_pct": statistics.fmean(
            [r["pg_cpu_pct"] for r in steady if not math.isnan(r["pg_cpu_pct"])] or [math.nan]
        ),
        "browser_cpu_mean_pct": statistics.fmean(
            [r["browser_cpu_pct"] for r in steady if not math.isnan(r["browser_cpu_pct"])] or [math.nan]
        ),
        "server_runq_wait_mean_pct": statistics.fmean(
            [r["server_runq_wait_pct"] for r in steady if not math.isnan(r["server_runq_wait_pct"])]
            or [math.nan]
        ),
        "acked_points_per_s": acked_in_steady / steady_s,
        "server_cpu_ms_per_1k_points": statistics.fmean(cpu) * 10 / max(1e-9, acked_in_steady / steady_s / 1000)
        if cpu else math.nan,
        "server_cpu_ms_per_frame": statistics.fmean(cpu) * 10 / max(1e-9, frames_in_steady / steady_s)
        if cpu else math.nan,
        "machine_busy_mean_pct": statistics.fmean(
            [r["machine_busy_pct"] for r in steady if not math.isnan(r["machine_busy_pct"])] or [math.nan]
        ),
        "server_rss_max_mib": max((r["server_rss_mib"] for r in steady), default=math.nan),
        "ack_p50_ms": statistics.median(steady_acks) if steady_acks else math.nan,
        "ack_p95_ms": percentile(steady_acks, 95) if steady_acks else math.nan,
        "live_p50_ms": statistics.median(steady_live) if steady_live else math.nan,
        "live_p95_ms": percentile(steady_live, 95) if steady_live else math.nan,
        "live_painted": len([k for k in painted_ms if k in sent_at]),
        "live_expected": expected_live,
        "client_lag_p95_ms": 1000 * percentile(lags, 95) if lags else math.nan,
        "backlog_slope_steps_per_s": slope(backlog),
        "backlog_max_steps": max(backlog, default=math.nan),
        "steps_unacked_after_drain": lost,
        "points_per_s": scenario.runs * args.rate * args.metrics,
        "frames_per_step": len(frames) / max(1, total_steps),
    })


def slope(values: list[float]) -> float:
    """Least-squares slope per sample (a backlog that grows has a positive one)."""
    n = len(values)
    if n < 2:
        return math.nan
    mean_x, mean_y = (n - 1) / 2, statistics.fmean(values)
    num = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    return num / sum((i - mean_x) ** 2 for i in range(n))


# -- output -------------------------------------------------------------------------------


def write_csv(scenario: Scenario, out_dir: Path) -> Path:
    path = out_dir / f"{scenario.database}-{scenario.runs}.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(scenario.per_second[0]))
        writer.writeheader()
        writer.writerows(scenario.per_second)
    return path


def plot(scenarios: list[Scenario], out_dir: Path, args: argparse.Namespace) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return []
    paths = []
    for database in sorted({s.database for s in scenarios}):
        fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
        panels = [
            ("server_cpu_pct", "server CPU (% of one core)", TARGET_CPU_PCT),
            ("ack_p95_ms", "ack p95 (ms)", TARGET_ACK_P95_MS),
            ("live_p95_ms", "live p95, sent -> painted (ms)", TARGET_LIVE_P95_MS),
            ("backlog_steps", "backlog (steps due - steps acked)", None),
        ]
        for axis, (column, label, target) in zip(axes, panels, strict=True):
            for scenario in (s for s in scenarios if s.database == database):
                xs = [r["t_s"] for r in scenario.per_second]
                axis.plot(xs, [r[column] for r in scenario.per_second], label=f"{scenario.runs} runs")
            if target is not None:
                axis.axhline(target, color="red", linestyle="--", linewidth=1, label="target")
            axis.axvline(args.seconds, color="grey", linestyle=":", linewidth=1)
            axis.set_ylabel(label)
            axis.legend(loc="upper left", fontsize=8)
        axes[-1].set_xlabel("seconds since the load started (dotted: schedule ends)")
        fig.suptitle(
            f"Keel load, {database}: {args.rate:g} steps/s x {args.metrics} metrics per run, "
            + ("no browser page" if args.no_page else f"{WATCHED} runs watched")
        )
        fig.tight_layout()
        path = out_dir / f"load-{database}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def report(baseline: Scenario, full: Scenario, args: argparse.Namespace) -> bool:
    """Print the figures of `full` against the targets and `baseline`; True when all pass."""
    b, f = baseline.figures, full.figures
    grows = f["backlog_slope_steps_per_s"] > 0.01 * full.runs * args.rate
    print(
        f"\n{full.database}: {full.runs} runs x {args.rate:g} steps/s x {args.metrics} metrics "
        f"= {f['points_per_s']:,.0f} points/s for {args.seconds:g} s, "
        f"{f'a frame every {args.flush_interval:g} s' if args.flush_interval else 'a frame per step'} "
        f"(baseline {baseline.runs} runs); machine {f['machine_busy_mean_pct']:.0f} % busy "
        f"(baseline {b['machine_busy_mean_pct']:.0f} %), client send lag p95 "
        f"{f['client_lag_p95_ms']:.0f} ms, PostgreSQL backends {f['pg_cpu_mean_pct']:.0f} % of a core, "
        f"the browser {f['browser_cpu_mean_pct']:.0f} % (baseline {b['browser_cpu_mean_pct']:.0f} %)"
    )
    print(
        f"  acked {f['acked_points_per_s']:,.0f} points/s (baseline {b['acked_points_per_s']:,.0f}); server "
        f"CPU {f['server_cpu_ms_per_1k_points']:.1f} ms per 1k points, {f['server_cpu_ms_per_frame']:.1f} ms "
        f"per frame of {1 / f['frames_per_step']:.1f} steps (baseline {b['server_cpu_ms_per_1k_points']:.1f}, "
        f"{b['server_cpu_ms_per_frame']:.1f} ms); server's event loop waited for a CPU "
        f"{f['server_runq_wait_mean_pct']:.0f} % of the time (baseline {b['server_runq_wait_mean_pct']:.0f} %)"
    )
    rows = [
        ("server CPU mean (% core)", f["server_cpu_mean_pct"], b["server_cpu_mean_pct"], TARGET_CPU_PCT, "<"),
        ("ack p95 (ms)", f["ack_p95_ms"], b["ack_p95_ms"], TARGET_ACK_P95_MS, "<="),
        ("live p95 (ms)", f["live_p95_ms"], b["live_p95_ms"], TARGET_LIVE_P95_MS, "<="),
    ]
    ok = True
    for name, value, base_value, target, op in rows:
        if math.isnan(value) and args.no_page and name.startswith("live"):
            print(f"  {name:26s} not measured (--no-page)")
            continue
        passed = value < target if op == "<" else value <= target
        ok &= passed
        print(
            f"  {name:26s} {value:8.1f}   target {op} {target:g}: ratio {value / target:5.2f} "
            f"{'ok' if passed else 'OVER'}   baseline {base_value:8.1f} ({value / base_value:5.2f}x)"
        )
    ok &= not grows and f["steps_unacked_after_drain"] == 0
    print(
        f"  {'backlog':26s} slope {f['backlog_slope_steps_per_s']:+.2f} steps/s, max "
        f"{f['backlog_max_steps']:.0f} steps, {f['steps_unacked_after_drain']:.0f} unacked after drain: "
        f"{'GROWING' if grows else 'not growing'}   baseline slope {b['backlog_slope_steps_per_s']:+.2f}"
    )
    print(
        f"  ack p50 {f['ack_p50_ms']:.1f} ms, live p50 {f['live_p50_ms']:.1f} ms, painted "
        f"{f['live_painted']}/{f['live_expected']}, server RSS max {f['server_rss_max_mib']:.0f} MiB, "
        f"browser console errors {f['browser_console_errors']:.0f}"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=64)
    parser.add_argument("--baseline-runs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds left out of the figures")
    parser.add_argument("--rate", type=float, default=10.0, help="steps per second, each run")
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--window", type=int, default=8, help="frames in flight per run")
    parser.add_argument(
        "--flush-interval", type=float, default=0.0,
        help="seconds a step waits before its frame is sent, as the Monitor's SenderConfig.flush_interval "
        "(0.25 s); 0: one frame per step, the worst case",
    )
    parser.add_argument("--clients", type=int, default=4, help="load client processes")
    parser.add_argument("--database", choices=["postgres", "sqlite", "both"], default="postgres")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "load")
    parser.add_argument(
        "--no-page", action="store_true",
        help="no browser: the server, its database and the clients have the machine to themselves "
        "(live latency is not measured)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    kinds = ["postgres", "sqlite"] if args.database == "both" else [args.database]
    scenarios: list[tuple[Scenario, Scenario]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            pair = tuple(run_scenario(kind, n, args, tmp) for n in (args.baseline_runs, args.runs))
            scenarios.append(pair)  # type: ignore[arg-type]
    flat = [s for pair in scenarios for s in pair]
    for scenario in flat:
        print(f"wrote {write_csv(scenario, args.out)}")
    for path in plot(flat, args.out, args):
        print(f"wrote {path}")
    with (args.out / "figures.json").open("w") as f:
        json.dump([{"database": s.database, "runs": s.runs, **s.figures} for s in flat], f, indent=2)
    ok = all([report(baseline, full, args) for baseline, full in scenarios])
    if os.getloadavg()[0] > (os.cpu_count() or 1):
        print(f"  note: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
              "the figures hold for a quiet machine only when measured on one")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

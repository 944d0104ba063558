"""Keel beside its peers: the same per-step workload through MLflow, Trackio, wandb and Aim.

    .venv/bin/python -m bench.peers [--steps 500] [--runs 8] [--metrics 20] [--series-steps 100000]
                                    [--only keel/sqlite,mlflow/sqlite,...] [--json out.json]

Each peer runs in its own venv, made here from the exact pins in PINS (under --cache,
reused when its pins match), as a child process running bench/peers_worker.py; Keel runs
the same worker in this venv. Targets, each on its own fresh storage:

    keel/sqlite, keel/postgres    `keel serve` (bench/support.py), Monitor.log() per step
    mlflow/sqlite, mlflow/postgres  `mlflow server` (its default uvicorn, 4 workers; job
                                  execution off), MlflowClient.log_batch() of the step's
                                  metrics per step
    trackio                       local only: trackio.log(), the project's SQLite file
    wandb                         WANDB_MODE=offline: wandb.log(), the run's .wandb file
    aim                           a local repo: Run.track() of the step's metrics dict

Per target:
1. one run: `--metrics` metrics x `--steps` steps, one logging call per step;
2. `--runs` runs at once, each its own process (as `--runs` trainers), started together;
3. one run of one metric x `--series-steps` steps (written the fastest way the peer
   allows), then that series read back in full, `--read-repeats` times (median).

Figures: points/s to durable storage (points / wall time from the first call until the
data is durable, per peer as peers_worker.py's docstring says), the logging call's cost on
the training thread (median and p99 us; in the many-runs case pooled over every call),
and the read-back time. Last, Keel's ratio to each peer on each figure, normalised so that
> 1 means Keel is better; MLflow is compared with Keel on the same database, the
local-file peers with Keel on SQLite. See docs/peers.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.support import (
    ROOT,
    free_port,
    fresh_database,
    keel_server,
    percentile,
    postgres_database,
)

PINS: dict[str, list[str]] = {
    # mlflow 3.18.0 is on PyPI but its mlflow-skinny==3.18.0 was not yet installable here.
    "mlflow": ["mlflow==3.17.2", "psycopg2-binary==2.9.13"],
    "trackio": ["trackio==0.43.0"],
    "wandb": ["wandb==0.31.0"],
    "aim": ["aim==3.29.1"],
}

# Every peer kept local and quiet: no hub, no cloud, no telemetry.
PEER_ENV = {
    "WANDB_MODE": "offline",
    "WANDB_SILENT": "true",
    "DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_OFFLINE": "1",
    "TRACKIO_DISABLE_TELEMETRY": "1",
}
WORKER_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Target:
    label: str
    peer: str
    storage: str
    """In words, for the tables."""
    baseline: str | None
    """The Keel target this one's ratios are against (None for Keel itself)."""


TARGETS = (
    Target("keel/sqlite", "keel", "keel serve, SQLite", None),
    Target("keel/postgres", "keel", "keel serve, PostgreSQL", None),
    Target("mlflow/sqlite", "mlflow", "mlflow server, SQLite", "keel/sqlite"),
    Target("mlflow/postgres", "mlflow", "mlflow server, PostgreSQL", "keel/postgres"),
    Target("trackio", "trackio", "local SQLite file", "keel/sqlite"),
    Target("wandb", "wandb", "offline .wandb file", "keel/sqlite"),
    Target("aim", "aim", "local repo (RocksDB)", "keel/sqlite"),
)


def peer_python(cache: Path, peer: str) -> Path:
    """The peer's venv interpreter, making the venv from PINS unless one with those pins exists."""
    if peer == "keel":
        return Path(sys.executable)
    pins = PINS[peer]
    version = pins[0].split("==")[1]
    venv = cache / f"{peer}-{version}"
    marker = venv / ".installed"
    if marker.exists() and marker.read_text().split() == pins:
        return venv / "bin" / "python"
    shutil.rmtree(venv, ignore_errors=True)
    print(f"making {venv} ({' '.join(pins)}) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *pins], check=True, stdout=subprocess.DEVNULL)
    marker.write_text(" ".join(pins))
    return venv / "bin" / "python"


@contextmanager
def mlflow_server(python: Path, backend_uri: str, scratch: Path) -> Iterator[str]:
    port = free_port()
    log = open(scratch / "mlflow-server.log", "wb")  # noqa: SIM115 - handed to the child
    # Job execution off: it starts ~7 huey consumer processes for GenAI jobs, nothing the
    # tracking API uses, that would take CPU from everything else on a 2-core box.
    env = {**os.environ, **PEER_ENV, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    # Its own session: `mlflow server` runs uvicorn and its workers as children; the whole
    # group is stopped at the end.
    proc = subprocess.Popen(
        [str(python.parent / "mlflow"), "server", "--backend-store-uri", backend_uri,
         "--artifacts-destination", str(scratch / "mlflow-artifacts"), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start; see {scratch / 'mlflow-server.log'}") from None
                time.sleep(0.5)
        yield url
    finally:
        stop_group(proc)
        log.close()


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group `proc` leads, SIGKILL it if still there after 30 s."""
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def round_trip_ms(url: str, *, keep_alive: bool, count: int = 20) -> float:
    """Median ms of GET /health: on one kept-alive connection, or a new connection each.

    The gap between the two is the Nagle / delayed-ACK stall on a reused connection."""
    parts = urllib.parse.urlsplit(url)
    samples = []
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port)
    for _ in range(count):
        if not keep_alive:
            connection = http.client.HTTPConnection(parts.hostname or "", parts.port)
        started = time.perf_counter()
        connection.request("GET", "/health")
        connection.getresponse().read()
        samples.append(1000 * (time.perf_counter() - started))
        if not keep_alive:
            connection.close()
    connection.close()
    return statistics.median(samples)


@contextmanager
def storage(target: Target, python: Path, scratch: Path) -> Iterator[dict[str, Any]]:
    """The target's storage, fresh; yields the worker config's `target` and friends."""
    base: dict[str, Any] = {"peer": target.peer, "scratch": str(scratch), "project": "keel-peers"}
    if target.peer == "keel":
        kind = target.label.removeprefix("keel/")
        with fresh_database(kind, scratch, "keel_peers") as database, keel_server(database) as server:
            yield {**base, "target": server.url}
    elif target.label == "mlflow/sqlite":
        with mlflow_server(python, f"sqlite:///{scratch / 'mlflow.db'}", scratch) as url:
            yield {**base, "target": url}
    elif target.label == "mlflow/postgres":
        with (
            postgres_database("mlflow_peers") as database,
            # psycopg2 (in MLflow's venv): SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3.
            mlflow_server(python, database.replace("postgresql://", "postgresql+psycopg2://"), scratch) as url,
        ):
            yield {**base, "target": url}
    elif target.peer == "aim":
        yield {**base, "target": str(scratch / "aim-repo")}
    else:  # trackio (TRACKIO_DIR, set per worker) and wandb (the `scratch` dir)
        yield {**base, "target": str(scratch)}


def run_workers(python: Path, configs: list[dict[str, Any]], scratch: Path) -> list[dict[str, Any]]:
    """Start one worker per config, let them all go at once when every one is ready, and
    return their results."""
    # The worker runs as a module of this checkout (PYTHONPATH, in the peer's venv too), from
    # the scratch directory: the files a peer writes where it stands stay out of the repository.
    env = {**os.environ, **PEER_ENV, "TRACKIO_DIR": str(scratch / "trackio"), "PYTHONPATH": str(ROOT)}
    procs, logs = [], []
    for config in configs:
        logs.append(open(scratch / f"{config['name']}.{config['mode']}.log", "wb"))  # noqa: SIM115
        procs.append(subprocess.Popen(
            [str(python), "-m", "bench.peers_worker", json.dumps(config)], stdin=subprocess.PIPE,
            stdout=logs[-1], stderr=subprocess.STDOUT, env=env, cwd=scratch,
        ))  # fmt: skip
    try:
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        ready = [Path(config["ready_path"]) for config in configs if "ready_path" in config]
        while not all(path.exists() for path in ready):
            if any(proc.poll() is not None for proc in procs) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for proc in procs:
            try:
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                proc.stdin.close()
            except BrokenPipeError:
                pass
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for log in logs:
            log.close()
    results = []
    for config, proc in zip(configs, procs, strict=True):
        path = Path(config["result_path"])
        if proc.returncode != 0 or not path.exists():
            tail = (scratch / f"{config['name']}.{config['mode']}.log").read_text(errors="replace")[-1500:]
            raise RuntimeError(f"{config['name']} ({config['mode']}) exited {proc.returncode}:\n{tail}")
        results.append(json.loads(path.read_text()))
    return results


def scenario(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One scenario's figures from its workers' results (one worker, or many at once)."""
    calls = [us for result in results for us in result["call_us"]]
    wall_s = max(result["end"] for result in results) - min(result["go"] for result in results)
    points = sum(result["points"] for result in results)
    return {
        "points": points,
        "durable_s": wall_s,
        "log_s": max(result["log_s"] for result in results),
        "points_per_s": points / wall_s,
        "call_median_us": statistics.median(calls),
        "call_p99_us": percentile(calls, 99),
        "extra": [{k: v for k, v in result.items() if k not in ("call_us", "go", "end")} for result in results],
    }


def bench_target(target: Target, python: Path, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    scratch = root / target.label.replace("/", "-")
    scratch.mkdir()
    figures: dict[str, Any] = {}
    with storage(target, python, scratch) as base:

        def workers(mode: str, names: list[str], **extra: Any) -> list[dict[str, Any]]:
            configs = [
                {**base, **extra, "mode": mode, "name": name, "result_path": str(scratch / f"{name}.{mode}.json"),
                 **({"ready_path": str(scratch / f"{name}.ready")} if mode == "workload" else {})}
                for name in names
            ]  # fmt: skip
            return run_workers(python, configs, scratch)

        if target.peer == "mlflow":
            figures["health_keepalive_ms"] = round_trip_ms(base["target"], keep_alive=True)
            figures["health_new_connection_ms"] = round_trip_ms(base["target"], keep_alive=False)
        shape = {"steps": args.steps, "metrics": args.metrics}
        figures["one"] = scenario(workers("workload", ["one-run"], **shape))
        names = [f"run-{i}" for i in range(args.runs)]
        figures["many"] = scenario(workers("workload", names, **shape))
        (seeded,) = workers("seed", ["series"], steps=args.series_steps)
        figures["seed_s"] = seeded["seed_s"]
        figures["index_s"] = seeded.get("index_s")
        (read,) = workers("read", ["series-read"], seeded=seeded, repeats=args.read_repeats)
        if read["points_read"] != args.series_steps:
            raise RuntimeError(f"read back {read['points_read']} points of {args.series_steps}")
        figures["read_s"] = read["read_s"]
        figures["read_all_s"] = read["read_all_s"]
    return figures


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}{unit}"
    return f"{value:.3g}{unit}"


def print_scenario(title: str, key: str, results: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"  {'target':16s} {'storage':26s} {'points/s':>10s} {'durable s':>10s} {'log loop s':>10s} "
          f"{'call med us':>12s} {'call p99 us':>12s}")  # fmt: skip
    for target in TARGETS:
        result = results.get(target.label)
        if result is None:
            continue
        if "error" in result:
            print(f"  {target.label:16s} {target.storage:26s} failed: {result['error']}")
            continue
        row = result[key]
        print(f"  {target.label:16s} {target.storage:26s} {fmt(row['points_per_s']):>10s} {fmt(row['durable_s']):>10s} "
              f"{fmt(row['log_s']):>10s} {fmt(row['call_median_us']):>12s} {fmt(row['call_p99_us']):>12s}")  # fmt: skip


def print_reads(results: dict[str, dict[str, Any]], series_steps: int) -> None:
    print(f"\nread back one {series_steps:,}-step series in full, in a fresh process (median of the repeats; seconds)")
    for target in TARGETS:
        result = results.get(target.label)
        if result is None or "error" in result:
            continue
        how = ""
        if target.peer == "wandb":
            how = " (no offline read API: the .wandb file read by `keel import wandb`'s reader)"
        if result.get("index_s") is not None:
            how = f" (after indexing the run, {result['index_s']:.3g} s, as `aim up` would)"
        runs = ", ".join(f"{s:.3g}" for s in result["read_all_s"])
        print(f"  {target.label:16s} {fmt(result['read_s']):>8s} s   (each: {runs}; writing it took {result['seed_s']:.3g} s){how}")


def print_round_trips(results: dict[str, dict[str, Any]]) -> None:
    for label, result in results.items():
        if "health_keepalive_ms" in result:
            print(f"  {label}: GET /health median {result['health_keepalive_ms']:.3g} ms on a kept-alive connection "
                  f"(what MlflowClient reuses), {result['health_new_connection_ms']:.3g} ms on a new one")  # fmt: skip


RATIO_COLUMNS = (
    ("points/s 1 run", "one", "points_per_s", True),
    ("points/s N runs", "many", "points_per_s", True),
    ("call med 1", "one", "call_median_us", False),
    ("call p99 1", "one", "call_p99_us", False),
    ("call med N", "many", "call_median_us", False),
    ("call p99 N", "many", "call_p99_us", False),
    ("read series", None, "read_s", False),
)


def print_ratios(results: dict[str, dict[str, Any]], runs: int) -> None:
    print(f"\nKeel's ratio to each peer (> 1 means Keel is better: points/s Keel/peer, times peer/Keel; "
          f"N = {runs}; MLflow against Keel on the same database, the local-file peers against keel/sqlite)")  # fmt: skip
    print(f"  {'peer':16s} {'vs':14s}" + "".join(f" {name:>15s}" for name, *_ in RATIO_COLUMNS))
    for target in TARGETS:
        peer, keel = results.get(target.label), results.get(target.baseline or "")
        if target.baseline is None or peer is None or keel is None or "error" in peer or "error" in keel:
            continue
        cells = []
        for _name, scenario_key, figure, higher_is_better in RATIO_COLUMNS:
            peer_value = (peer[scenario_key] if scenario_key else peer)[figure]
            keel_value = (keel[scenario_key] if scenario_key else keel)[figure]
            ratio = keel_value / peer_value if higher_is_better else peer_value / keel_value
            cells.append(f"{fmt(ratio)}x")
        print(f"  {target.label:16s} {target.baseline:14s}" + "".join(f" {cell:>15s}" for cell in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500, help="steps per run (each step logs --metrics metrics)")
    parser.add_argument("--runs", type=int, default=8, help="runs at once in the many-runs scenario")
    parser.add_argument("--metrics", type=int, default=20)
    parser.add_argument("--series-steps", type=int, default=100_000, help="points of the read-back series")
    parser.add_argument("--read-repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="comma-separated target labels (default: all)")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "keel-bench" / "peers", help="venvs")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (logs, databases)")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C: workers killed, servers stopped, databases dropped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    chosen = [target for target in TARGETS if not args.only or target.label in args.only.split(",")]

    args.cache.mkdir(parents=True, exist_ok=True)
    pythons = {peer: peer_python(args.cache, peer) for peer in dict.fromkeys(target.peer for target in chosen)}
    print(f"{args.metrics} metrics x {args.steps:,} steps per run; 1 run, then {args.runs} runs at once; "
          f"read-back series {args.series_steps:,} steps; pins: {', '.join(p for pins in PINS.values() for p in pins)}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip

    root = Path(tempfile.mkdtemp(prefix="keel-peers-"))
    results: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    try:
        for target in chosen:
            began = time.monotonic()
            try:
                results[target.label] = bench_target(target, pythons[target.peer], args, root)
            except Exception as exc:  # one peer failing leaves the others' figures
                results[target.label] = {"error": f"{type(exc).__name__}: {str(exc)[-600:]}"}
            print(f"  {target.label}: done in {time.monotonic() - began:.0f} s "
                  f"(load average {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    finally:
        if args.keep:
            print(f"scratch kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    print_scenario(f"1 run: {args.metrics} metrics x {args.steps:,} steps", "one", results)
    print_scenario(f"{args.runs} runs at once, each {args.metrics} metrics x {args.steps:,} steps (call costs pooled)", "many", results)
    print_reads(results, args.series_steps)
    print_round_trips(results)
    print(f"\n(whole invocation {time.monotonic() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "pins": PINS, "results": results}, indent=1))
    print_ratios(results, args.runs)


if __name__ == "__main__":
    main()

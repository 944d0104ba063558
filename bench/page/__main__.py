"""What the dashboard page costs the browser: load time, bytes, main-thread busy.

    python -m bench.page [--runs 16] [--steps 5000] [--metrics 40] [--repeats 3] [--seconds 20]
                         [--only load,weight,live,table,peers] [--quick] [--json out.json]

A real `keel serve` (bench/support.py) on a fresh SQLite file, `--runs` runs x `--steps`
steps x `--metrics` metrics (the five headline keys among them, a few NaN/Inf; the values
are bench/page_data.py's), sent over the ingest websocket in frames of many rows by the
Monitor's own spool and Sender (bench/page/streams.py). Headless Chromium (/usr/bin/chromium,
chromedriver; bench/page/browser.py), one window size for every page (`--window`, tall
enough that the five headline charts are all in view: a page that draws only what is in
view is timed on what the user sees, and so is the static page).

Each part (`--only`) is a module of bench/page/, its method in its docstring: load.py,
weight.py and live.py share the server and its runs; live.py, table.py and peers.py start
their own where they need more runs. Every figure prints last, with its target and
pass/fail (bench/page/results.py). `--quick`: 4 runs x 500 steps, 5 s windows, 1 repeat, 50
table runs, 8 many-runs, no peers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.page import live, load, peers, table, weight
from bench.page.results import Results, report
from bench.page.streams import ingest, make_runs
from bench.page_data import metric_keys
from bench.support import keel_server

PARTS = ("load", "weight", "live", "table", "peers")
MODULES = {"load": load, "weight": weight, "live": live, "table": table, "peers": peers}


def parse_window(text: str) -> tuple[int, int]:
    width, height = text.lower().replace("x", ",").split(",")
    return int(width), int(height)


def parse_args() -> tuple[argparse.Namespace, list[str]]:
    parts_doc = "\n".join(f"- {MODULES[part].__doc__}" for part in PARTS)
    parser = argparse.ArgumentParser(description=f"{__doc__}\nParts:\n\n{parts_doc}", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5000, help="history steps per run")
    parser.add_argument("--metrics", type=int, default=40, help="metrics per step (>= 5: the headline keys first)")
    parser.add_argument("--repeats", type=int, default=3, help="cold loads of each page (alternated with its static page)")
    parser.add_argument("--seconds", type=float, default=20.0, help="busy measurement window")
    parser.add_argument("--hidden-seconds", type=float, default=10.0, help="busy window of the background tab")
    parser.add_argument("--rate", type=float, default=2.0, help="live steps/s per run")
    parser.add_argument("--many-runs", type=int, default=64)
    parser.add_argument("--many-steps", type=int, default=2000)
    parser.add_argument("--many-rate", type=float, default=1.0)
    parser.add_argument("--table-runs", type=int, default=1000)
    parser.add_argument("--peer-metrics", type=int, default=5, help="metrics logged to the peers (the headline five first)")
    parser.add_argument("--peer-seconds", type=float, default=40.0,
                        help="the peers' busy windows (TensorBoard reloads its charts every 30 s)")  # fmt: skip
    parser.add_argument("--peers", default="tensorboard,trackio", help="which peers")
    parser.add_argument("--window", type=parse_window, default=(1280, 2400), help="browser window, WIDTHxHEIGHT")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {','.join(PARTS)}")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small data, short windows, no peers")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "keel-bench" / "peers", help="peer venvs")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (server logs, databases)")
    args = parser.parse_args()
    parts = [p for p in args.only.split(",") if p]
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(unknown)}")
    if args.quick:
        args.runs, args.steps, args.metrics, args.repeats = 4, 500, 20, 1
        args.seconds, args.hidden_seconds, args.table_runs = 5.0, 5.0, 50
        args.many_runs, args.many_steps = 8, 300
        parts = [p for p in parts if p != "peers"]
    return args, parts


def timed(what: str, began: float) -> None:
    print(f"  {what}: {time.monotonic() - began:.0f} s (load average {os.getloadavg()[0]:.1f})", flush=True)


def main() -> int:
    args, parts = parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    started = time.monotonic()
    print(f"{args.runs} runs x {args.steps:,} steps x {args.metrics} metrics; parts {','.join(parts)}; "
          f"window {args.window[0]}x{args.window[1]}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
          flush=True)  # fmt: skip
    results = Results()
    scratch = Path(tempfile.mkdtemp(prefix="keel-page-"))
    keys = metric_keys(args.metrics)
    runs = make_runs(args.runs)
    try:
        if {"load", "weight", "live"} & set(parts):
            with keel_server(f"sqlite:///{scratch / 'page.db'}", log=scratch / "server.log") as server:
                took = ingest(server.url, runs, args.steps, keys, scratch)
                points = len(runs) * args.steps * len(keys)
                print(f"  ingested {points:,} points in {took:.0f} s ({points / took:,.0f} points/s)", flush=True)
                results.details["ingest_s"] = took
                if "load" in parts:
                    began = time.monotonic()
                    load.part_load(args, server.url, runs, results, scratch)
                    timed("load", began)
                if "weight" in parts:
                    began = time.monotonic()
                    weight.part_weight(args, server.url, runs, results)
                    timed("weight", began)
                if "live" in parts:
                    began = time.monotonic()
                    live.part_live(args, server.url, runs, keys, results, scratch)
                    timed("live", began)
            if "live" in parts:
                began = time.monotonic()
                live.part_many(args, scratch, keys, results)
                timed("live, many runs", began)
        if "table" in parts:
            began = time.monotonic()
            table.part_table(args, scratch, results)
            print(f"  table: {time.monotonic() - began:.0f} s", flush=True)
        if "peers" in parts:
            began = time.monotonic()
            peers.part_peers(args, runs, scratch, results)
            print(f"  peers: {time.monotonic() - began:.0f} s", flush=True)
    finally:
        if args.keep:
            print(f"scratch kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.monotonic() - started
    if args.json:
        args.json.write_text(json.dumps({
            "args": {k: str(v) for k, v in vars(args).items()},
            "figures": [vars(f) for f in results.figures],
            "details": results.details,
            "elapsed_s": elapsed,
        }, indent=1, default=str))  # fmt: skip
    report(results)
    print(f"(whole invocation {elapsed:.0f} s, load average now {os.getloadavg()[0]:.1f})")
    return 0 if all(f.ok is not False for f in results.figures) else 1


if __name__ == "__main__":
    raise SystemExit(main())

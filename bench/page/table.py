"""table: the runs table's first row, cold.

A fresh server with `--table-runs` runs (3 steps each); / opened cold `--repeats` times (the
first is also the server's first page); the median time until the runs grid's first row
with text (`.ag-center-cols-container .ag-row`; target <= 2 s), whether "No runs yet" was
visible at any 50 ms poll before, and GET /api/v1/runs's time (keel.client's `Client.runs`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.page.browser import browser, open_page, probe
from bench.page.results import Results
from bench.page.streams import ingest_run, make_runs
from bench.support import keel_server
from dashboard.theme import HEADLINE_KEYS
from keel.client import Client

__all__ = ["part_table"]


def part_table(args: argparse.Namespace, scratch: Path, results: Results) -> None:
    runs = make_runs(args.table_runs, prefix="t")
    with keel_server(f"sqlite:///{scratch / 'table.db'}", log=scratch / "table-server.log") as server:
        keys = list(HEADLINE_KEYS)
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda run: ingest_run(server.url, run, 3, keys, 3, scratch), runs))
        print(f"    {len(runs)} runs made in {time.monotonic() - began:.0f} s", flush=True)
        began = time.perf_counter()
        listed = Client(server.url, timeout=60).runs()
        rest_s = time.perf_counter() - began
        samples: list[float] = []
        no_runs = False
        for _ in range(args.repeats):  # cold: a fresh browser profile each
            with browser(args.window) as driver:
                samples.append(open_page(driver, f"{server.url}/", probe("table"), "runs table first row"))
                no_runs = no_runs or bool(driver.execute_script("return window.__bench.noRunsSeen"))
            print(f"    runs table cold load {samples[-1]:.2f} s", flush=True)
        shown = statistics.median(samples)
    results.details["table"] = {"shown_s": samples, "no_runs_seen": no_runs, "rest_s": rest_s, "listed": len(listed)}
    results.add("table", f"runs table of {len(runs)} runs: first row shown, cold, median", shown, "s", "<= 2", lambda v: v <= 2)
    results.add("table", "'No runs yet' visible while loading", "yes" if no_runs else "no", "", "no",
                note=f"(GET /api/v1/runs: {len(listed)} runs in {rest_s * 1000:.0f} ms)")  # fmt: skip
    results.figures[-1].ok = not no_runs

"""What the runs page (/) costs at many runs: time until its first row shows, cold.

    python -m bench.runs_page [--runs 10000] [--base 1000] [--repeats 3] [--firing 0.05]

For each of `--base` and `--runs` runs: a fresh SQLite file, migrated and seeded straight
through the store (server.storage.Store: open_run + 3 steps of the five headline keys per
run, as a trainer's hello and first frames would store them; a `--firing` share of the runs
also given a firing critical alert row, so the health column has something to join), then a
real `keel serve` on it (bench/support.py) and headless Chromium (bench/page/browser.py
and probe): / opened cold (a fresh profile each) `--repeats` times; the median time from
navigation start until the runs grid's first row with text (`.ag-center-cols-container
.ag-row`; target <= 2 s at 10,000 runs), and GET /api/v1/runs?latest=...&hazard=true's own
time. Prints both sizes and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

from bench.page.browser import browser, open_page, probe
from bench.page_data import HEADLINE_KEYS, step_values
from bench.support import keel_server
from wire import Row, RunInfo

TARGET_S = 2.0
GROUPS = ("cispo", "is", "gspo", "grpo")


async def _seed(database_url: str, runs: int, firing: float) -> None:
    from server import db
    from server.models import Alert
    from server.storage import Store

    await db.upgrade_async(database_url)
    store = Store(db.create_engine(database_url))
    keys = list(HEADLINE_KEYS)
    now = time.time()
    loud: list[str] = []
    every = max(1, round(1 / firing)) if firing > 0 else 0
    try:
        for i in range(runs):
            run_id = str(uuid.uuid4())
            info = RunInfo(id=run_id, name=f"{GROUPS[i % 4]}-s{i}", project="runsbench",
                           group=GROUPS[i % 4], tags=["bench"])  # fmt: skip
            await store.open_run(info, now)
            await store.write_points(run_id, [Row(step=s, time=None, values=step_values(i, s, keys)) for s in range(3)], now)
            if every and i % every == 0:
                loud.append(run_id)
        async with store.writing() as session:
            for run_id in loud:
                session.add(Alert(
                    fingerprint=uuid.uuid4().hex, rule_id=None, rule_name="bench", run_id=run_id, metric="grad/norm",
                    severity="critical", state="firing", started_step=1, fired_step=1, resolved_step=None, value=None,
                    message="bench", started_at=now, resolved_at=None, silenced=False,
                ))  # fmt: skip
    finally:
        await store.close()


def _rest_s(url: str) -> float:
    query = urllib.parse.urlencode({"latest": ",".join(HEADLINE_KEYS), "hazard": "true"})
    began = time.perf_counter()
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(f"{url}/api/v1/runs?{query}", timeout=60) as r:
        listed = json.load(r)
    elapsed = time.perf_counter() - began
    assert isinstance(listed, list)
    return elapsed


def measure(runs: int, args: argparse.Namespace, scratch: Path) -> dict[str, float | list[float]]:
    database_url = f"sqlite:///{scratch / f'runs_{runs}.db'}"
    began = time.monotonic()
    asyncio.run(_seed(database_url, runs, args.firing))
    print(f"  {runs} runs seeded in {time.monotonic() - began:.0f} s", flush=True)
    with keel_server(database_url, log=scratch / f"server_{runs}.log") as server:
        rest = _rest_s(server.url)
        samples = []
        for _ in range(args.repeats):
            with browser(args.window) as driver:
                samples.append(open_page(driver, f"{server.url}/", probe("table"), f"first row of {runs} runs", 120))
                error = driver.execute_script("var e = document.getElementById('runs-error'); return e && !e.hidden ? e.innerText : ''")
            print(f"  {runs} runs: first row in {samples[-1]:.2f} s" + (f" (page says: {error})" if error else ""), flush=True)
    return {"shown_s": statistics.median(samples), "samples": samples, "rest_s": rest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--base", type=int, default=1_000, help="the size the ratio is taken against")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--firing", type=float, default=0.05, help="share of runs with a firing alert")
    parser.add_argument("--window", type=lambda t: tuple(int(v) for v in t.split("x")), default=(1400, 900))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="keel-runs-page-") as directory:
        scratch = Path(directory)
        base = measure(args.base, args, scratch)
        big = measure(args.runs, args, scratch)
    ratio = float(big["shown_s"]) / float(base["shown_s"])  # type: ignore[arg-type]
    ok = float(big["shown_s"]) <= TARGET_S  # type: ignore[arg-type]
    print()
    print(f"runs page, first row shown, cold, median of {args.repeats}:")
    print(f"  {args.base:>6} runs: {base['shown_s']:.2f} s   (GET /api/v1/runs {base['rest_s']:.2f} s)")
    print(f"  {args.runs:>6} runs: {big['shown_s']:.2f} s   (GET /api/v1/runs {big['rest_s']:.2f} s)"
          f"   target <= {TARGET_S:.0f} s: {'pass' if ok else 'FAIL'}")  # fmt: skip
    print(f"  ratio {args.runs}/{args.base}: {ratio:.2f}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Live latency of the dashboard: ingest websocket -> painted in a real browser's chart.

A real `keel serve` process (SQLite file by default), three runs with 500 steps of
history, the compare page open in headless Chromium at 1280x800. Then each run
sends one step at a time over the ingest websocket; the page's live updater
records when each point was painted (on the chart's live overlay, or by the
Plotly.extendTraces that drew it into the figure, whichever came first; at the
next animation frame). Latency = paint time - the moment just before the frame was
sent (same machine, same clock). Target: p95 < 250 ms.

    python -m bench.live_latency [--points 100] [--rate 2] [--burst] [--database-url URL]

Needs /usr/bin/chromium and /usr/bin/chromedriver (apt-get install chromium chromium-driver).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from websockets.sync.client import ClientConnection, connect

from bench.support import keel_server, percentile
from wire import Hello, Points, Row, RunInfo

KEYS = ("reward/mean", "mismatch/kl", "gate/frac", "mismatch/ratio_max", "grad/norm")


def values(step: int, seed: int) -> dict[str, float]:
    wobble = math.sin(step * 0.3 + seed)
    kl = 1e-3 * (1.5 + wobble)
    return {
        "reward/mean": 0.5 + 0.3 * math.tanh(step / 300) + 0.02 * wobble,
        "mismatch/kl": kl,
        "gate/frac": 0.05 + 0.01 * wobble,
        "mismatch/ratio_max": 1.0 + 20 * kl,
        "grad/norm": 1.0 + 0.2 * abs(wobble),
    }


class Run:
    def __init__(self, stack: ExitStack, ws_url: str, name: str, group: str, seed: int):
        self.id = str(uuid.uuid4())
        self.seed = seed
        self.seq = 0
        self.ws: ClientConnection = stack.enter_context(
            connect(f"{ws_url}/api/v1/ingest", max_size=None)
        )
        run = RunInfo(id=self.id, name=name, project="bench", group=group, tags=["bench"])
        self.ws.send(json.dumps(Hello(run).to_json()))
        json.loads(self.ws.recv(timeout=10))

    def send(self, rows: list[Row]) -> float:
        sent_at = time.time()
        self.ws.send(json.dumps(Points(self.seq, rows).to_json()))
        self.seq += 1
        reply = json.loads(self.ws.recv(timeout=10))
        assert reply["type"] == "ack", reply
        return sent_at


def browser() -> webdriver.Chrome:
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--window-size=1280,800",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    # The live updater's instrumentation (keelLive.drawn, .stats) is off unless asked for.
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": "window.keelInstrument = true;"})
    return driver


def wait(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--points", type=int, default=100, help="live steps per run")
    parser.add_argument("--rate", type=float, default=2.0, help="live steps per second (each run)")
    parser.add_argument(
        "--history", type=int, default=500, help="steps per run before the page opens"
    )
    parser.add_argument("--burst", action="store_true", help="the runs send each step together")
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        database_url = args.database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        server = stack.enter_context(keel_server(database_url))
        base, ws_url = server.url, server.ws_url
        runs = [
            Run(stack, ws_url, f"{g}-s{s}", g, i)
            for i, (g, s) in enumerate([("cispo", 0), ("cispo", 1), ("is", 0)])
        ]
        for run in runs:
            for start in range(0, args.history, 250):
                run.send(
                    [
                        Row(step=s, time=None, values=values(s, run.seed))
                        for s in range(start, min(args.history, start + 250))
                    ]
                )

        driver = browser()
        stack.callback(driver.quit)
        driver.get(f"{base}/compare?runs={','.join(r.id for r in runs)}")
        charts_js = (
            "return Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot'))"
            ".filter(g => g.layout && g.layout.meta && g.layout.meta.render_id).length"
        )
        wait(lambda: driver.execute_script(charts_js) == 5, 60, "five charts")
        state_js = "return document.getElementById('live-indicator').getAttribute('data-state')"
        wait(lambda: driver.execute_script(state_js) == "live", 30, "live websocket")
        stats_js = "return JSON.parse(JSON.stringify(window.keelLive.stats))"
        before = driver.execute_script(stats_js)

        sent: dict[tuple[str, int], float] = {}
        period = 1.0 / args.rate
        # Independent trainers: each run steps at `rate`, its phase offset by 1/3 of a period
        # (--burst sends the three runs' steps back to back instead).
        arrivals = [
            (k * period + (0.0 if args.burst else i * period / len(runs)), step, run)
            for k, step in enumerate(range(args.history, args.history + args.points))
            for i, run in enumerate(runs)
        ]
        arrivals.sort(key=lambda item: (item[0], item[1]))
        started = time.monotonic()
        for offset, step, run in arrivals:
            time.sleep(max(0.0, started + offset - time.monotonic()))
            sent[(run.id, step)] = run.send([Row(step=step, time=None, values=values(step, run.seed))])

        drawn_js = (
            "var key = arguments[0]; return window.keelLive.drawn"
            ".filter(function (d) { return d.key === key; })"
        )

        def painted(key: str, field: str = "t") -> dict[tuple[str, int], float]:
            first: dict[tuple[str, int], float] = {}
            for d in driver.execute_script(drawn_js, key):  # first paint of each step
                if d[field] is not None:
                    first.setdefault((d["run"], int(d["step"])), float(d[field]))
            return first

        try:
            wait(lambda: all(k in painted(KEYS[0]) for k in sent), 10, "all points painted")
        except RuntimeError:
            pass
        per_key = {key: painted(key) for key in KEYS}
        first = [per_key[KEYS[0]][k] - t * 1000 for k, t in sent.items() if k in per_key[KEYS[0]]]
        all_five = [
            max(per_key[key][k] for key in KEYS) - t * 1000
            for k, t in sent.items()
            if all(k in per_key[key] for key in KEYS)
        ]
        received = painted(KEYS[0], "received")
        to_browser = [received[k] - t * 1000 for k, t in sent.items() if k in received]
        after = driver.execute_script(stats_js)
        errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        result = {
            "database": database_url.split(":", 1)[0],
            "points": len(sent),
            "painted": len(first),
            "rate_per_run_hz": args.rate,
            "arrivals": "burst" if args.burst else "staggered",
            "latency_ms": {
                "p50": round(statistics.median(first), 1) if first else None,
                "p95": round(percentile(first, 95), 1) if first else None,
                "p99": round(percentile(first, 99), 1) if first else None,
                "max": round(max(first), 1) if first else None,
            },
            "server_to_browser_ms": {
                "p50": round(statistics.median(to_browser), 1) if to_browser else None,
                "p95": round(percentile(to_browser, 95), 1) if to_browser else None,
            },
            "all_five_charts_p95_ms": round(percentile(all_five, 95), 1) if all_five else None,
            "figure_rerenders_during_stream": after["renders"] - before["renders"],
            "server_refresh_ticks": {
                k: v - before["ticks"].get(k, 0) for k, v in after["ticks"].items()
            },
            "points_appended": after["appended"] - before["appended"],
            "browser_console_errors": len(errors),
        }
    print(json.dumps(result, indent=2))
    latency = result["latency_ms"]
    print(
        f"live latency ingest -> painted: p50 {latency['p50']} ms, p95 {latency['p95']} ms "
        f"({result['painted']}/{result['points']} points, target p95 < 250 ms)"
    )
    return (
        0
        if latency["p95"] is not None
        and latency["p95"] < 250
        and result["painted"] == result["points"]
        else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())

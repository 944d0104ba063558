"""live: what an open page costs the browser's main thread, idle and while runs stream.

Main-thread busy fraction = delta CDP Performance.getMetrics TaskDuration / delta its
Timestamp over `--seconds`, from settled + 3 s (settled: no chart figure asked of the server
for 3 s, so a page still loading charts below the fold is not counted as live cost; the time
until then is printed as `settled_s`): the compare page with nothing streaming (idle), then
while every run streams 2 steps/s (one points frame per run per step, phases spread, steps
going on from --steps; bench/page/streams.py), the compare page and a run page (target
<= 15 %); then the compare page hidden behind another tab (Target.createTarget,
visibilityState checked to be "hidden"), from 5 s after it was hidden (past the 3 s after
which it closes its socket) over `--hidden-seconds` (target ~0), and how long it takes, once
shown again, until every run's newest sent step is drawn (catch-up). Then a fresh server
with `--many-runs` runs x `--many-steps` steps streaming 1 step/s each, all on one compare
page (target <= 25 %). Points drawn: window.keelLive.stats.appended, where the page has it.
Live latency (p95 <= 1 s) is bench/live_latency.py's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from selenium import webdriver

from bench.page.browser import appended, browser, busy, open_page, poll, probe
from bench.page.results import Results
from bench.page.streams import BenchRun, Streamer, ingest, make_runs
from bench.support import keel_server
from dashboard.theme import HEADLINE_KEYS

__all__ = ["part_live", "part_many"]

LIVE_SHOWN_TIMEOUT_S = 90.0
"""A page opened while runs stream: after this long, its busy is measured shown or not."""
SETTLE_QUIET_S = 3.0
SETTLE_TIMEOUT_S = 90.0
HIDDEN_SETTLE_S = 5.0
"""A tab hidden this long has closed its live socket (assets/live/socket.js PAUSE_HIDDEN_MS,
3 s) and finished what was in flight when it was hidden: its busy is measured from then."""

IN_VIEW_JS = """
var keys = arguments[0];
return Array.prototype.filter.call(document.querySelectorAll('.keel-graph .js-plotly-plot'), function (gd) {
  var key = gd.layout && gd.layout.meta && gd.layout.meta.key, rect = gd.getBoundingClientRect();
  return keys.indexOf(key) >= 0 && rect.top >= 0 && rect.bottom <= window.innerHeight;
}).length"""
LAST_X_JS = """
var keys = arguments[0], runs = arguments[1], step = arguments[2], done = {};
document.querySelectorAll('.keel-graph .js-plotly-plot').forEach(function (gd) {
  var key = gd.layout && gd.layout.meta && gd.layout.meta.key;
  if (keys.indexOf(key) < 0) return;
  var have = {};
  (gd._fullData || []).forEach(function (t) {
    var m = t.meta;
    if (!m || ['raw', 'smooth', 'mean'].indexOf(m.role) < 0 || !t.x || !t.x.length) return;
    if (t.x[t.x.length - 1] >= step) have[m.run] = true;
  });
  if (runs.every(function (r) { return have[r]; })) done[key] = true;
});
return keys.every(function (k) { return done[k]; });
"""
"""True once every headline chart has drawn every run in `runs` up to `step`."""


def settle(driver: webdriver.Chrome) -> float | None:
    """Seconds from navigation start until the page has no chart figure in flight and has
    asked for none for SETTLE_QUIET_S: a page that loads more charts after its headline
    ones (the run page's other metrics) is still loading until then, and its busy while
    streaming is measured after. None when it does not settle within SETTLE_TIMEOUT_S."""
    script = (
        "var b = window.__bench; return b && b.figuresInFlight === 0 && "
        f"performance.now() - b.figureAt >= {SETTLE_QUIET_S * 1000:.0f} ? Math.max(b.figureAt, 1) : null"
    )
    try:
        return float(poll(driver, script, SETTLE_TIMEOUT_S, "settled")) / 1000
    except RuntimeError:
        print(f"    (not settled within {SETTLE_TIMEOUT_S:.0f} s: busy measured anyway)", flush=True)
        return None


def live_busy(driver: webdriver.Chrome, url: str, source: str, what: str, seconds: float) -> dict[str, Any]:
    try:
        shown: float | None = open_page(driver, url, source, what, timeout=LIVE_SHOWN_TIMEOUT_S)
    except RuntimeError:
        # Measured anyway: a page that never finishes drawing while runs stream still costs
        # its tab what it costs (on the landed dashboard, the 16-run compare page does this).
        shown = None
        print(f"    ({what}: not shown within {LIVE_SHOWN_TIMEOUT_S:.0f} s; busy measured anyway)", flush=True)
    settled = settle(driver)
    in_view = driver.execute_script(IN_VIEW_JS, list(HEADLINE_KEYS))
    if in_view < len(HEADLINE_KEYS):
        print(f"    ({what}: only {in_view} of the five headline charts wholly in the window; see --window)")
    time.sleep(3)
    before = appended(driver)
    fraction = busy(driver, seconds)
    after = appended(driver)
    drawn = after - before if before is not None and after is not None else None
    return {"shown_s": shown, "settled_s": settled, "busy": fraction, "points_appended": drawn}


def hidden_tab(driver: webdriver.Chrome, streamer: Streamer, ids: list[str], seconds: float) -> dict[str, Any]:
    """The current tab sent to the background by a new foreground tab: its busy fraction,
    then the seconds until, shown again, it draws every run's step sent by then."""
    this = driver.execute_cdp_cmd("Target.getTargetInfo", {})["targetInfo"]["targetId"]
    other = driver.execute_cdp_cmd("Target.createTarget", {"url": "about:blank", "background": False})["targetId"]
    try:
        time.sleep(HIDDEN_SETTLE_S)
        visibility = driver.execute_script("return document.visibilityState")
        before = appended(driver)
        fraction = busy(driver, seconds)
        after = appended(driver)
    finally:
        driver.execute_cdp_cmd("Target.closeTarget", {"targetId": other})
    driver.execute_cdp_cmd("Target.activateTarget", {"targetId": this})
    driver.execute_cdp_cmd("Page.bringToFront", {})
    shown_again = time.monotonic()
    target_step = streamer.step - 1
    visible = driver.execute_script("return document.visibilityState")
    try:
        poll(driver, LAST_X_JS, 60, "catch-up", list(HEADLINE_KEYS), ids, target_step)
        catch_up: float | None = time.monotonic() - shown_again
    except RuntimeError:
        catch_up = None
    drawn = after - before if before is not None and after is not None else None
    return {"visibility": visibility, "visibility_after": visible, "busy": fraction, "catch_up_s": catch_up,
            "points_appended": drawn}  # fmt: skip


def part_live(args: argparse.Namespace, base: str, runs: list[BenchRun], keys: list[str], results: Results, scratch: Path) -> None:
    ids = [run.id for run in runs]
    compare = f"{base}/compare?runs={','.join(ids)}"
    compare_probe = probe("keel", HEADLINE_KEYS, ids)
    run_probe = probe("keel", HEADLINE_KEYS, ids[:1])
    n = len(runs)
    with browser(args.window) as driver:
        idle = live_busy(driver, compare, compare_probe, "compare (idle) shown", args.seconds)
        results.details["live/idle"] = idle
        results.add("live", f"compare page {n} runs, nothing streaming: busy", 100 * idle["busy"], "%")
        with Streamer(base, runs, keys, args.rate, args.steps, scratch) as streamer:
            driver.get("about:blank")
            streaming = live_busy(driver, compare, compare_probe, "compare (live) shown", args.seconds)
            streamer.check()
            results.details["live/compare"] = streaming
            results.add("live", f"compare page {n} runs: load while streaming (same browser, cold)", _shown(streaming), "s")
            results.add("live", f"compare page {n} runs streaming {args.rate:g} steps/s each: busy", 100 * streaming["busy"], "%",
                        "<= 15", lambda v: v <= 15, _drawn_note(streaming, args.seconds))  # fmt: skip
            hidden = hidden_tab(driver, streamer, ids, args.hidden_seconds)
            streamer.check()
            results.details["live/hidden"] = hidden
            results.add("live", f"compare page in a background tab (visibilityState {hidden['visibility']}): busy",
                        100 * hidden["busy"], "%", "~0 (<= 1)", lambda v: v <= 1, _drawn_note(hidden, args.hidden_seconds))  # fmt: skip
            results.add("live", "background tab shown again: until every run's newest step is drawn",
                        hidden["catch_up_s"], "s", note=f"(visibilityState then {hidden['visibility_after']})")  # fmt: skip
            driver.get("about:blank")
            run_page = live_busy(driver, f"{base}/runs/{ids[0]}", run_probe, "run page (live) shown", args.seconds)
            streamer.check()
            results.details["live/run"] = run_page
            results.add("live", f"run page, {n} runs streaming {args.rate:g} steps/s each: busy", 100 * run_page["busy"], "%",
                        "<= 15", lambda v: v <= 15, _drawn_note(run_page, args.seconds))  # fmt: skip
            if streamer.late_s > 0.5:
                print(f"    (the streamer fell up to {streamer.late_s:.1f} s behind its schedule)")
            results.details["live/streamer"] = {"frames": streamer.sent, "late_s": streamer.late_s, "dropped": streamer.dropped}
            results.add("live", f"ingest sockets the server dropped while the pages were open ({n} runs)", len(streamer.dropped),
                        note=f"({', '.join(sorted(set(streamer.dropped)))[:120]})" if streamer.dropped else "")  # fmt: skip


def part_many(args: argparse.Namespace, scratch: Path, keys: list[str], results: Results) -> None:
    runs = make_runs(args.many_runs, prefix="m")
    with keel_server(f"sqlite:///{scratch / 'many.db'}", log=scratch / "many-server.log") as server:
        took = ingest(server.url, runs, args.many_steps, keys, scratch)
        print(f"    {len(runs)} runs x {args.many_steps:,} steps x {len(keys)} metrics ingested in {took:.0f} s", flush=True)
        ids = [run.id for run in runs]
        with (
            browser(args.window) as driver,
            Streamer(server.url, runs, keys, args.many_rate, args.many_steps, scratch) as streamer,
        ):
            figures = live_busy(driver, f"{server.url}/compare?runs={','.join(ids)}", probe("keel", HEADLINE_KEYS, ids),
                                "compare (many runs, live) shown", args.seconds)  # fmt: skip
            streamer.check()
            results.details["live/many"] = {**figures, "late_s": streamer.late_s, "dropped": streamer.dropped}
            results.add("live", f"ingest sockets the server dropped while the page was open ({len(runs)} runs)", len(streamer.dropped))
        results.add("live", f"compare page {len(runs)} runs streaming {args.many_rate:g} step/s each: busy",
                    100 * figures["busy"], "%", "<= 25", lambda v: v <= 25, _drawn_note(figures, args.seconds))  # fmt: skip
        results.add("live", f"compare page {len(runs)} runs: load while streaming (same browser, cold)", _shown(figures), "s")


def _drawn_note(figures: dict[str, Any], seconds: float) -> str:
    drawn = figures.get("points_appended")
    return f"(keelLive appended {drawn} points in {seconds:g} s)" if drawn is not None else ""


def _shown(figures: dict[str, Any]) -> float | str:
    shown = figures["shown_s"]
    return shown if shown is not None else f"> {LIVE_SHOWN_TIMEOUT_S:.0f}"

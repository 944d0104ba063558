"""What the dashboard page costs the browser: load time, bytes, main-thread busy.

    python -m bench.page [--runs 16] [--steps 5000] [--metrics 40] [--repeats 3] [--seconds 20]
                         [--only load,weight,live,table,peers] [--quick] [--json out.json]

A real `keel serve` (bench/support.py) on a fresh SQLite file, `--runs` runs x `--steps`
steps x `--metrics` metrics (the five headline keys among them, a few NaN/Inf; the values
are bench/page_data.py's), ingested over the ingest websocket in frames of many rows.
Headless Chromium (/usr/bin/chromium, chromedriver), one window size for every page
(`--window`, tall enough that the five headline charts are all in view: a page that draws
only what is in view is timed on what the user sees, and so is the static page).

Parts (`--only`):

- load: cold loads (a fresh browser profile each) of /compare?runs=<all>, and of a static
  page that draws the same five charts with the same plotly.min.js (the file the dashboard
  serves, from the installed `plotly` package) from the same runs' points at 1,000 per trace
  (raw and EMA-0.6 smoothed, as the dashboard's default), fetched from
  /api/v1/runs/{id}/series?max_points=1000 beforehand and inlined in the page, served by a
  plain http.server. Then /runs/<id> against a static page of that run's five charts.
  Alternated, `--repeats` each; medians and the ratio page/static (target <= 1.5).
  "Shown", for the Keel page and the static page alike (the static page draws into the same
  classes and meta): each of the five `.keel-graph .js-plotly-plot` elements whose
  `layout.meta.key` is a headline key holds, for every run of the page, a trace with
  `meta.run` = the run and `meta.role` in raw/smooth/mean whose x is non-empty. A script
  injected before the page's own (CDP Page.addScriptToEvaluateOnNewDocument) checks this
  every 50 ms and records performance.now(), i.e. ms from navigation start.
- weight: bytes over the wire for the compare page, cold (fresh profile) and warm (same
  profile, after about:blank), each until shown + 2 s: the sum of the Resource Timing
  transferSize of the navigation and every resource (0 for a cache hit; the websocket's
  frames are not counted). Targets <= 3 MiB cold, <= 512 KiB warm; the 5 biggest listed.
- live: main-thread busy fraction = delta CDP Performance.getMetrics TaskDuration / delta
  its Timestamp over `--seconds`, from settled + 3 s (settled: no chart figure asked of the
  server for 3 s, so a page still loading charts below the fold is not counted as live
  cost; the time until then is printed as `settled_s`): the compare page with nothing
  streaming (idle), then while every run streams 2 steps/s (one points frame per run per
  step, phases spread, steps going on from --steps), the compare page and a run page
  (target <= 15 %); then the compare page hidden behind another tab (Target.createTarget,
  visibilityState checked to be "hidden"), from 5 s after it was hidden (past the 3 s after
  which it closes its socket) over `--hidden-seconds` (target ~0), and how long it
  takes, once shown again, until every run's newest sent step is drawn (catch-up). Then a
  fresh server with `--many-runs` runs x `--many-steps` steps streaming 1 step/s each, all on
  one compare page (target <= 25 %). Points drawn: window.keelLive.stats.appended, where
  the page has it. Live latency (p95 <= 1 s) is bench/live_latency.py's.
- table: a fresh server with `--table-runs` runs (3 steps each); / opened cold `--repeats`
  times (the first is also the server's first page); the median time until the runs grid's
  first row with text (`.ag-center-cols-container .ag-row`; target <= 2 s), whether "No runs
  yet" was visible at any 50 ms poll before, and GET /api/v1/runs's time.
- peers: the same runs (`--peer-metrics` metrics: the headline keys and a few; same
  values, non-finite points left out) in TensorBoard's scalar dashboard and Trackio's,
  each from PyPI in its own venv (bench/peers.py's machinery, under ~/.cache/keel-bench/peers/).
  Cold load to the five headline charts drawn, then busy over `--seconds` while every run
  appends 2 steps/s (written by a worker in the peer's venv, bench/page_data.py).
  TensorBoard: #scalars with a tag filter of the five keys; drawn = for each key a
  `tf-scalar-card` (shadow DOM, searched through) whose svg has >= 2 x runs `path.line`
  with a drawn `d` (the raw and the smoothed line of each run, smoothing 0.6 by default).
  Trackio: /?project=...; drawn = for each key the plot whose section + title is the key
  has a legend of >= runs items and coloured pixels on its Vega canvas (it draws to a
  canvas, so "each run's line" cannot be checked one by one; its legend lists a few runs and
  "+N more", both counted).

Every figure prints last, with its target and pass/fail. Needs /usr/bin/chromium and
/usr/bin/chromedriver. `--quick`: 4 runs x 500 steps, 5 s windows, 1 repeat, 50 table
runs, 8 many-runs, no peers.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from bench import peers as peer_venvs
from bench.page_data import HEADLINE_KEYS, metric_keys, step_values
from bench.support import ROOT, keel_server
from keel.local import free_port
from wire import Row, RunInfo, decode_value, hello_message, points_message

warnings.filterwarnings("ignore", message=r"connect\(\) must be used as a context manager")

PARTS = ("load", "weight", "live", "table", "peers")
GROUPS = ("cispo", "is", "gspo", "grpo", "dapo", "ppo", "rloo", "vapo")
LOG_KEYS = {"mismatch/kl", "mismatch/ratio_max", "grad/norm"}
"""The headline keys dashboard/theme.py draws on a log axis (the static page does too)."""
SMOOTHING = 0.6
"""The dashboard's default EMA weight (its smoothing slider), for the static page's lines."""
PEER_PINS = {"tensorboard": ["tensorboard==2.21.0"]}
"""Added to bench/peers.py's PINS (trackio's pin is there)."""
PEER_ENV = {**peer_venvs.PEER_ENV, "TF_CPP_MIN_LOG_LEVEL": "3"}
SHOWN_TIMEOUT_S = 180.0
LIVE_SHOWN_TIMEOUT_S = 90.0
"""A page opened while runs stream: after this long, its busy is measured shown or not."""
MiB = 1024 * 1024


# -- the browser --------------------------------------------------------------------------


def chrome(profile: Path, window: tuple[int, int]) -> webdriver.Chrome:
    """Headless Chromium on its own profile directory (a fresh one is a cold cache)."""
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-dev-shm-usage", f"--window-size={window[0]},{window[1]}",
                 f"--user-data-dir={profile}", "--remote-allow-origins=*"):  # fmt: skip
        options.add_argument(flag)
    options.page_load_strategy = "none"  # driver.get returns at once; the probe times the page
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_script_timeout(30)
    return driver


@contextmanager
def browser(window: tuple[int, int], profile: Path | None = None) -> Iterator[webdriver.Chrome]:
    """A browser on `profile`, or on a new empty profile (deleted after) when None."""
    directory = profile or Path(tempfile.mkdtemp(prefix="keel-page-profile-"))
    driver = chrome(directory, window)
    try:
        yield driver
    finally:
        with contextlib.suppress(Exception):
            driver.quit()
        if profile is None:
            shutil.rmtree(directory, ignore_errors=True)


# The probe: injected before any of the page's scripts, it polls the page's "shown" condition
# every 50 ms and records performance.now() (ms since navigation start) the first time it holds.
PROBE_JS = """
(function () {
  if (window.top !== window) return;
  try { performance.setResourceTimingBufferSize(100000); } catch (e) {}
  var SPEC = %(spec)s;
  var bench = window.__bench = {shown: null, noRunsSeen: false, checks: 0, figuresInFlight: 0, figureAt: 0};
  // The charts' figure requests (Dash callbacks of metric-graph), for "settled" (live_busy).
  var fetch0 = window.fetch;
  window.fetch = function (url, init) {
    var figure = init && typeof init.body === 'string' && init.body.indexOf('metric-graph') >= 0
      && String(url).indexOf('_dash-update-component') >= 0;
    if (!figure) return fetch0.apply(this, arguments);
    bench.figuresInFlight++;
    function done() { bench.figuresInFlight--; bench.figureAt = performance.now(); }
    return fetch0.apply(this, arguments).then(function (r) { done(); return r; }, function (e) { done(); throw e; });
  };
  function deepAll(root, sel, out) {
    out = out || [];
    root.querySelectorAll(sel).forEach(function (e) { out.push(e); });
    root.querySelectorAll('*').forEach(function (e) { if (e.shadowRoot) deepAll(e.shadowRoot, sel, out); });
    return out;
  }
  function length(x) {
    if (!x) return 0;
    if (typeof x.length === 'number') return x.length;
    if (x.bdata) return x.bdata.length;
    return 0;
  }
  function keel() {
    var done = {};
    document.querySelectorAll('.keel-graph .js-plotly-plot').forEach(function (gd) {
      var key = gd.layout && gd.layout.meta && gd.layout.meta.key;
      if (SPEC.keys.indexOf(key) < 0) return;
      var have = {};
      (gd.data || []).forEach(function (t, i) {
        var m = t.meta, full = gd._fullData && gd._fullData[i];
        if (!m || ['raw', 'smooth', 'mean'].indexOf(m.role) < 0) return;
        if (length(t.x) > 0 || (full && length(full.x) > 0)) have[m.run] = true;
      });
      if (SPEC.runs.every(function (r) { return have[r]; })) done[key] = true;
    });
    return SPEC.keys.every(function (k) { return done[k]; });
  }
  function table() {
    var text = document.body ? document.body.innerText : '';
    if (text.indexOf('No runs yet') >= 0) bench.noRunsSeen = true;
    return Array.prototype.some.call(
      document.querySelectorAll('.ag-center-cols-container .ag-row'),
      function (row) { return row.innerText.trim().length > 0; });
  }
  function tensorboard() {
    var done = {};
    deepAll(document, 'tf-scalar-card').forEach(function (card) {
      var lines = deepAll(card.shadowRoot || card, 'path.line').filter(function (p) {
        return (p.getAttribute('d') || '').length > 50; });
      if (lines.length >= 2 * SPEC.runs.length) done[card.tag] = true;
    });
    return SPEC.keys.every(function (k) { return done[k]; });
  }
  function trackio() {
    var done = {};
    document.querySelectorAll('.plot-container').forEach(function (plot) {
      var title = plot.querySelector('.plot-title'), accordion = plot.closest('.accordion');
      var label = accordion && accordion.querySelector('.accordion-label');
      if (!title || !label) return;
      var key = label.innerText.replace(/\\s*\\(\\d+\\)\\s*$/, '').trim() + '/' + title.innerText.trim();
      if (SPEC.keys.indexOf(key) < 0 || done[key]) return;
      // Its legend lists a few runs and "+N more".
      var legend = plot.querySelector('.custom-legend');
      var more = legend ? /\+(\d+) more/.exec(legend.innerText) : null;
      var listed = plot.querySelectorAll('.legend-item').length + (more ? parseInt(more[1], 10) : 0);
      if (listed < SPEC.runs.length) return;
      var canvas = plot.querySelector('canvas');
      if (!canvas || !canvas.width || !canvas.height) return;
      var pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data, coloured = 0;
      for (var i = 0; i < pixels.length; i += 16) {
        var r = pixels[i], g = pixels[i + 1], b = pixels[i + 2];
        if (pixels[i + 3] > 0 && Math.max(r, g, b) - Math.min(r, g, b) > 60) coloured++;
      }
      if (coloured > 100) done[key] = true;
    });
    return SPEC.keys.every(function (k) { return done[k]; });
  }
  var check = {keel: keel, table: table, tensorboard: tensorboard, trackio: trackio}[SPEC.kind];
  var timer = setInterval(function () {
    bench.checks++;
    try {
      if (check()) { bench.shown = performance.now(); clearInterval(timer); }
    } catch (e) { bench.error = String(e); }
  }, 50);
})();
"""


def probe(
    kind: str, keys: list[str] | tuple[str, ...] = (), runs: list[str] | tuple[str, ...] = ()
) -> str:
    return PROBE_JS % {"spec": json.dumps({"kind": kind, "keys": list(keys), "runs": list(runs)})}


def install_probe(driver: webdriver.Chrome, source: str) -> str:
    return str(
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": source})[
            "identifier"
        ]
    )


def poll(driver: webdriver.Chrome, script: str, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = driver.execute_script(script)
        except WebDriverException:  # the document is not there yet (page_load_strategy none)
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_shown(driver: webdriver.Chrome, what: str, timeout: float = SHOWN_TIMEOUT_S) -> float:
    """Seconds from navigation start until the probe saw the page shown."""
    ms = poll(driver, "return window.__bench && window.__bench.shown", timeout, what)
    return float(ms) / 1000


def open_page(
    driver: webdriver.Chrome, url: str, source: str, what: str, timeout: float = SHOWN_TIMEOUT_S
) -> float:
    """Navigate to `url` with the probe `source` installed; seconds until shown."""
    identifier = install_probe(driver, source)
    driver.get(url)
    try:
        return wait_shown(driver, what, timeout)
    finally:
        driver.execute_cdp_cmd(
            "Page.removeScriptToEvaluateOnNewDocument", {"identifier": identifier}
        )


def cold_load(url: str, source: str, what: str, window: tuple[int, int]) -> float:
    with browser(window) as driver:
        return open_page(driver, url, source, what)


def task_metrics(driver: webdriver.Chrome) -> tuple[float, float]:
    metrics = {
        m["name"]: m["value"]
        for m in driver.execute_cdp_cmd("Performance.getMetrics", {})["metrics"]
    }
    return float(metrics["TaskDuration"]), float(metrics["Timestamp"])


def busy(driver: webdriver.Chrome, seconds: float) -> float:
    """Fraction of wall time the page's main thread ran tasks, over the next `seconds`."""
    driver.execute_cdp_cmd("Performance.enable", {"timeDomain": "timeTicks"})
    task0, wall0 = task_metrics(driver)
    time.sleep(seconds)
    task1, wall1 = task_metrics(driver)
    return (task1 - task0) / (wall1 - wall0)


STATS_JS = "return (window.keelLive && window.keelLive.stats) ? JSON.parse(JSON.stringify(window.keelLive.stats)) : null"


def appended(driver: webdriver.Chrome) -> int | None:
    stats = driver.execute_script(STATS_JS)
    return int(stats["appended"]) if stats and "appended" in stats else None


# -- the data: runs ingested into a `keel serve` ---------------------------------------------


@dataclass
class BenchRun:
    index: int
    """Its number in bench/page_data.py's step_values (the same values everywhere)."""
    id: str
    name: str
    group: str


def make_runs(count: int, prefix: str = "") -> list[BenchRun]:
    per_group = max(1, math.ceil(count / len(GROUPS)))
    return [BenchRun(i, str(uuid.uuid4()), f"{prefix}{GROUPS[i // per_group % len(GROUPS)]}-s{i % per_group}",
                     GROUPS[i // per_group % len(GROUPS)]) for i in range(count)]  # fmt: skip


def hello(
    ws_url: str, run: BenchRun, writer: str, welcomes: list[int] | None = None
) -> ClientConnection:
    # No keepalive pings: a server busy drawing a heavy page answered them late and the client
    # closed the socket (1011); the frames themselves keep the connection alive.
    ws = connect(f"{ws_url}/api/v1/ingest", max_size=None, open_timeout=30, ping_interval=None)
    info = RunInfo(id=run.id, name=run.name, project="pagebench", group=run.group, tags=["bench"])
    ws.send(json.dumps({**hello_message(info), "writer": writer}))
    reply = json.loads(ws.recv(timeout=30))
    if reply.get("type") != "welcome":
        raise RuntimeError(f"hello refused: {reply}")
    if welcomes is not None:
        welcomes.append(int(reply["acked_seq"]))
    return ws


def ingest_run(
    ws_url: str, run: BenchRun, steps: int, keys: list[str], batch: int, window: int = 4
) -> None:
    """`steps` steps of the run, `batch` rows a frame, up to `window` frames unacknowledged."""
    ws = hello(ws_url, run, "history")
    try:
        seq, acked = 0, 0
        for start in range(0, steps, batch):
            rows = [
                Row(step=s, time=None, values=step_values(run.index, s, keys))
                for s in range(start, min(steps, start + batch))
            ]
            ws.send(json.dumps(points_message(seq, rows)))
            seq += 1
            while seq - acked >= window:
                acked = _ack(ws, acked)
        while acked < seq:
            acked = _ack(ws, acked)
    finally:
        ws.close()


def _ack(ws: ClientConnection, acked: int) -> int:
    reply = json.loads(ws.recv(timeout=120))
    if reply.get("type") != "ack":
        raise RuntimeError(f"frame not acknowledged: {reply}")
    return acked + 1


def ingest(
    ws_url: str, runs: list[BenchRun], steps: int, keys: list[str], *, batch: int | None = None
) -> float:
    """Every run's history, a few runs at a time; returns the seconds it took."""
    rows_per_frame = batch or max(1, min(10_000, 20_000 // len(keys)))
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda run: ingest_run(ws_url, run, steps, keys, rows_per_frame), runs))
    return time.monotonic() - began


def _close_quietly(ws: ClientConnection) -> None:
    with contextlib.suppress(Exception):
        ws.close()


class Streamer:
    """Every run sends one points frame per step at `rate` steps/s (phases spread over the
    period), from step `first_step` on, in a background thread; acks drained as they come."""

    def __init__(
        self, ws_url: str, runs: list[BenchRun], keys: list[str], rate: float, first_step: int
    ):
        self.runs, self.keys, self.rate = runs, keys, rate
        self.ws_url = ws_url
        self.writer = writer = f"live-{uuid.uuid4().hex[:8]}"
        self.welcomes: list[int] = []
        self.dropped: list[str] = []
        """The server closed a live socket (reconnected): its close frames."""
        self.sockets = [hello(ws_url, run, writer, self.welcomes) for run in runs]
        self.seqs = [0] * len(runs)
        self.acked = [0] * len(runs)
        self.step = first_step
        """The step being sent now (every run has sent the steps before it)."""
        self.sent = 0
        self.late_s = 0.0
        """The most the schedule fell behind (the sender itself could not keep up)."""
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Streamer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        # A socket whose unread acks filled its queue never sees the server's close (its
        # reader waits for room), and close() would wait for that reader forever: close each
        # in a thread of its own and give up on it after a while.
        closers = [threading.Thread(target=_close_quietly, args=(ws,), daemon=True) for ws in self.sockets]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join(timeout=5)

    def _drain(self, i: int) -> None:
        ws = self.sockets[i]
        while True:
            try:
                reply = json.loads(ws.recv(timeout=0))
            except TimeoutError:
                return
            if reply.get("type") != "ack":
                raise RuntimeError(f"live frame not acknowledged: {reply}")
            self.acked[i] += 1

    def _loop(self) -> None:
        try:
            self._send_steps()
        except Exception as exc:  # reported by check(), not lost in the thread
            self.error = exc

    def _reconnect(self, run: BenchRun, tries: int = 5) -> ClientConnection:
        """A new socket for `run`; a stalled server may take longer than one hello's 30 s."""
        for attempt in range(tries):
            try:
                return hello(self.ws_url, run, self.writer, self.welcomes)
            except (TimeoutError, OSError, ConnectionClosed):
                if attempt == tries - 1 or self._stop.is_set():
                    raise
        raise AssertionError("unreachable")

    def check(self) -> None:
        """Raises if the streaming stopped: a busy figure measured without it would be wrong."""
        if self.error is not None:
            raise RuntimeError(f"the live streamer stopped: {self.error!r}") from self.error

    def _send_steps(self) -> None:
        period = 1.0 / self.rate
        began = time.monotonic()
        k = 0
        while not self._stop.is_set():
            for i, run in enumerate(self.runs):
                due = began + k * period + i * period / len(self.runs)
                delay = due - time.monotonic()
                if delay > 0:
                    if self._stop.wait(delay):
                        return
                else:
                    self.late_s = max(self.late_s, -delay)
                row = Row(
                    step=self.step,
                    time=time.time(),
                    values=step_values(run.index, self.step, self.keys),
                )
                try:
                    self.sockets[i].send(json.dumps(points_message(self.seqs[i], [row])))
                    self.seqs[i] += 1
                    self.sent += 1
                    self._drain(i)
                except ConnectionClosed as exc:
                    # As the Monitor does: reconnect and go on after the last acked frame. On
                    # the landed dashboard a heavy page stalls the server's event loop past its
                    # websocket keepalive (20 s) and it drops ingest sockets with 1011.
                    self.dropped.append(repr(exc.rcvd or exc.sent))
                    with contextlib.suppress(Exception):
                        self.sockets[i].close()
                    self.sockets[i] = self._reconnect(run)
                    self.seqs[i] = self.acked[i] = int(self.welcomes.pop()) + 1
            self.step += 1
            k += 1


# -- the static baseline -------------------------------------------------------------------


def plotly_js() -> Path:
    """The plotly.min.js the dashboard serves (Dash serves the installed `plotly` package's)."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise RuntimeError(f"no {path}")
    return path


def get_json(url: str) -> Any:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    try:
        connection.request("GET", parts.path + ("?" + parts.query if parts.query else ""))
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {url}: {response.status} {body[:200]!r}")
        return json.loads(body)
    finally:
        connection.close()


def wire_float(value: Any) -> float:
    return decode_value(value)


def ema(values: list[float], weight: float) -> list[float | None]:
    """Debiased EMA over the finite values (a non-finite point is a gap, the EMA carries on)."""
    out: list[float | None] = []
    last, debias = 0.0, 0.0
    for value in values:
        if not math.isfinite(value):
            out.append(None)
            continue
        last = last * weight + (1 - weight) * value
        debias = debias * weight + (1 - weight)
        out.append(last / debias)
    return out


def series_points(
    base: str, runs: list[BenchRun], max_points: int = 1000
) -> dict[str, dict[str, Any]]:
    """key -> run id -> (steps, values) from Keel's REST series read, `max_points` a series."""
    out: dict[str, dict[str, Any]] = {key: {} for key in HEADLINE_KEYS}
    for key in HEADLINE_KEYS:
        for run in runs:
            answer = get_json(
                f"{base}/api/v1/runs/{run.id}/series?key={urllib.parse.quote(key)}&max_points={max_points}"
            )
            out[key][run.id] = (answer["steps"], [wire_float(v) for v in answer["values"]])
    return out


STATIC_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>static plotly baseline</title>
<style>body { font-family: system-ui, sans-serif; margin: 16px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
.keel-graph { height: %(height)dpx; }</style></head>
<body><h1>static baseline</h1><div class="charts">%(divs)s</div>
<script src="plotly.min.js"></script>
<script>
var CHARTS = %(charts)s;
CHARTS.forEach(function (chart, i) {
  Plotly.newPlot('chart-' + i, chart.data, chart.layout, {displaylogo: false, responsive: true});
});
</script></body></html>
"""


def static_page(
    directory: Path, name: str, points: dict[str, dict[str, Any]], runs: list[BenchRun], height: int
) -> str:
    """Writes `<name>.html` drawing the five headline charts of `runs`; returns its file name."""
    charts = []
    for key in HEADLINE_KEYS:
        log = key in LOG_KEYS
        data = []
        for run in runs:
            steps, values = points[key][run.id]
            clean = [v if math.isfinite(v) and (v > 0 or not log) else math.nan for v in values]
            raw = [None if math.isnan(v) else v for v in clean]
            data.append({"type": "scatter", "mode": "lines", "x": steps, "y": raw, "name": run.name, "opacity": 0.3,
                         "line": {"width": 1}, "showlegend": False, "meta": {"run": run.id, "role": "raw"}})  # fmt: skip
            data.append({"type": "scatter", "mode": "lines", "x": steps, "y": ema(clean, SMOOTHING), "name": run.name,
                         "line": {"width": 1.6}, "meta": {"run": run.id, "role": "smooth"}})  # fmt: skip
        layout = {"title": {"text": key}, "height": height, "margin": {"l": 50, "r": 10, "t": 40, "b": 40},
                  "yaxis": {"type": "log" if log else "linear"}, "meta": {"key": key}, "hovermode": "x"}  # fmt: skip
        charts.append({"data": data, "layout": layout})
    divs = "".join(
        f'<div class="keel-graph"><div id="chart-{i}"></div></div>' for i in range(len(charts))
    )
    html = STATIC_HTML % {
        "height": height,
        "divs": divs,
        "charts": json.dumps(charts, allow_nan=False),
    }
    (directory / f"{name}.html").write_text(html)
    return f"{name}.html"


@contextmanager
def static_server(directory: Path) -> Iterator[str]:
    """A plain http.server on `directory` (HTTP/1.0, no compression, no cache headers)."""
    handler = partial(_QuietHandler, directory=str(directory))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


# -- the parts -----------------------------------------------------------------------------


@dataclass
class Figure:
    part: str
    name: str
    value: float | str | None
    unit: str = ""
    target: str = ""
    ok: bool | None = None
    """None: for reference, no target."""
    note: str = ""


@dataclass
class Results:
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def add(self, part: str, name: str, value: float | str | None, unit: str = "", target: str = "",
            check: Callable[[float], bool] | None = None, note: str = "") -> None:  # fmt: skip
        ok = None
        if check is not None:
            ok = False if not isinstance(value, (int, float)) else check(float(value))
        self.figures.append(Figure(part, name, value, unit, target, ok, note))
        shown = f"{value:.3g}" if isinstance(value, float) else str(value)
        print(f"  [{part}] {name}: {shown} {unit} {note}".rstrip(), flush=True)


def part_load(
    args: argparse.Namespace, base: str, runs: list[BenchRun], results: Results, scratch: Path
) -> None:
    points = series_points(base, runs)
    static_dir = scratch / "static"
    static_dir.mkdir()
    shutil.copy(plotly_js(), static_dir / "plotly.min.js")
    compare_html = static_page(static_dir, "compare", points, runs, 330)
    run_html = static_page(static_dir, "run", points, runs[:1], 260)
    ids = [run.id for run in runs]
    window = args.window
    with static_server(static_dir) as static_base:
        pairs = (
            ("compare", f"{base}/compare?runs={','.join(ids)}", probe("keel", HEADLINE_KEYS, ids),
             f"{static_base}/{compare_html}"),
            ("run page", f"{base}/runs/{ids[0]}", probe("keel", HEADLINE_KEYS, ids[:1]), f"{static_base}/{run_html}"),
        )  # fmt: skip
        for label, url, source, static_url in pairs:
            keel_s: list[float] = []
            static_s: list[float] = []
            for repeat in range(args.repeats):
                order = [("keel", url, keel_s), ("static", static_url, static_s)]
                for kind, page, samples in order if repeat % 2 == 0 else order[::-1]:
                    samples.append(cold_load(page, source, f"{label} ({kind}) shown", window))
                    print(f"    {label} {kind} cold load {samples[-1]:.2f} s", flush=True)
            keel_med, static_med = statistics.median(keel_s), statistics.median(static_s)
            results.details[f"load/{label}"] = {"keel_s": keel_s, "static_s": static_s}
            results.add("load", f"{label}: Keel page, cold, median", keel_med, "s")
            results.add("load", f"{label}: static plotly.js page, cold, median", static_med, "s")
            results.add(
                "load",
                f"{label}: Keel / static",
                keel_med / static_med,
                "x",
                "<= 1.5",
                lambda v: v <= 1.5,
            )


def resources(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    return list(driver.execute_script(
        "return performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))"
        ".map(function (e) { return {name: e.name, transfer: e.transferSize, encoded: e.encodedBodySize,"
        " decoded: e.decodedBodySize}; })"
    ))  # fmt: skip


def part_weight(
    args: argparse.Namespace, base: str, runs: list[BenchRun], results: Results
) -> None:
    ids = [run.id for run in runs]
    url = f"{base}/compare?runs={','.join(ids)}"
    source = probe("keel", HEADLINE_KEYS, ids)
    loads: dict[str, tuple[float, list[dict[str, Any]]]] = {}
    with browser(args.window) as driver:
        for temperature in ("cold", "warm"):
            shown = open_page(driver, url, source, f"compare ({temperature}) shown")
            time.sleep(2)
            loads[temperature] = (shown, resources(driver))
            driver.get("about:blank")
            time.sleep(0.5)
    for temperature, (shown, entries) in loads.items():
        total = sum(e["transfer"] for e in entries)
        biggest = sorted(entries, key=lambda e: -e["transfer"])[:5]
        results.details[f"weight/{temperature}"] = {
            "shown_s": shown,
            "bytes": total,
            "requests": len(entries),
            "biggest": biggest,
        }
        note = "; biggest: " + ", ".join(
            f"{_short(e['name'])} {e['transfer'] / 1024:,.0f} KiB" for e in biggest
        )
        if temperature == "cold":
            results.add("weight", "compare page, cold, transferred", total / MiB, "MiB", "<= 3", lambda v: v <= 3,
                        f"({len(entries)} requests){note}")  # fmt: skip
        else:
            results.add("weight", "compare page, warm, transferred", total / 1024, "KiB", "<= 512", lambda v: v <= 512,
                        f"({len(entries)} requests){note}")  # fmt: skip
        results.add("weight", f"compare page, {temperature}, load time (same browser)", shown, "s")


def _short(url: str) -> str:
    path = urllib.parse.urlsplit(url).path
    return path.rsplit("/", 1)[-1][:40] or path


IN_VIEW_JS = """
return Array.prototype.filter.call(document.querySelectorAll('.keel-graph .js-plotly-plot'), function (gd) {
  var key = gd.layout && gd.layout.meta && gd.layout.meta.key, rect = gd.getBoundingClientRect();
  return KEYS.indexOf(key) >= 0 && rect.top >= 0 && rect.bottom <= window.innerHeight;
}).length""".replace("KEYS", json.dumps(list(HEADLINE_KEYS)))


def live_busy(
    driver: webdriver.Chrome, url: str, source: str, what: str, seconds: float
) -> dict[str, Any]:
    try:
        shown: float | None = open_page(driver, url, source, what, timeout=LIVE_SHOWN_TIMEOUT_S)
    except RuntimeError:
        # Measured anyway: a page that never finishes drawing while runs stream still costs
        # its tab what it costs (on the landed dashboard, the 16-run compare page does this).
        shown = None
        print(
            f"    ({what}: not shown within {LIVE_SHOWN_TIMEOUT_S:.0f} s; busy measured anyway)",
            flush=True,
        )
    settled = settle(driver)
    in_view = driver.execute_script(IN_VIEW_JS)
    if in_view < len(HEADLINE_KEYS):
        print(
            f"    ({what}: only {in_view} of the five headline charts wholly in the window; see --window)"
        )
    time.sleep(3)
    before = appended(driver)
    fraction = busy(driver, seconds)
    after = appended(driver)
    drawn = after - before if before is not None and after is not None else None
    return {"shown_s": shown, "settled_s": settled, "busy": fraction, "points_appended": drawn}


SETTLE_QUIET_S = 3.0
SETTLE_TIMEOUT_S = 90.0


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


LAST_X_JS = """
var keys = %(keys)s, runs = %(runs)s, step = %(step)d, done = {};
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


HIDDEN_SETTLE_S = 5.0
"""A tab hidden this long has closed its live socket (assets/live/5_socket.js PAUSE_HIDDEN_MS,
3 s) and finished what was in flight when it was hidden: its busy is measured from then."""


def hidden_tab(
    driver: webdriver.Chrome, streamer: Streamer, ids: list[str], seconds: float
) -> dict[str, Any]:
    """The current tab sent to the background by a new foreground tab: its busy fraction,
    then the seconds until, shown again, it draws every run's step sent by then."""
    this = driver.execute_cdp_cmd("Target.getTargetInfo", {})["targetInfo"]["targetId"]
    other = driver.execute_cdp_cmd(
        "Target.createTarget", {"url": "about:blank", "background": False}
    )["targetId"]
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
        script = LAST_X_JS % {
            "keys": json.dumps(list(HEADLINE_KEYS)),
            "runs": json.dumps(ids),
            "step": target_step,
        }
        poll(driver, script, 60, "catch-up")
        catch_up: float | None = time.monotonic() - shown_again
    except RuntimeError:
        catch_up = None
    drawn = after - before if before is not None and after is not None else None
    return {"visibility": visibility, "visibility_after": visible, "busy": fraction, "catch_up_s": catch_up,
            "points_appended": drawn}  # fmt: skip


def part_live(
    args: argparse.Namespace,
    base: str,
    ws_url: str,
    runs: list[BenchRun],
    keys: list[str],
    results: Results,
) -> None:
    ids = [run.id for run in runs]
    compare = f"{base}/compare?runs={','.join(ids)}"
    compare_probe = probe("keel", HEADLINE_KEYS, ids)
    run_probe = probe("keel", HEADLINE_KEYS, ids[:1])
    n = len(runs)
    with browser(args.window) as driver:
        idle = live_busy(driver, compare, compare_probe, "compare (idle) shown", args.seconds)
        results.details["live/idle"] = idle
        results.add(
            "live", f"compare page {n} runs, nothing streaming: busy", 100 * idle["busy"], "%"
        )
        with Streamer(ws_url, runs, keys, args.rate, args.steps) as streamer:
            driver.get("about:blank")
            streaming = live_busy(
                driver, compare, compare_probe, "compare (live) shown", args.seconds
            )
            streamer.check()
            results.details["live/compare"] = streaming
            results.add(
                "live",
                f"compare page {n} runs: load while streaming (same browser, cold)",
                _shown(streaming),
                "s",
            )
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
            run_page = live_busy(
                driver, f"{base}/runs/{ids[0]}", run_probe, "run page (live) shown", args.seconds
            )
            streamer.check()
            results.details["live/run"] = run_page
            results.add("live", f"run page, {n} runs streaming {args.rate:g} steps/s each: busy", 100 * run_page["busy"], "%",
                        "<= 15", lambda v: v <= 15, _drawn_note(run_page, args.seconds))  # fmt: skip
            if streamer.late_s > 0.5:
                print(f"    (the streamer fell up to {streamer.late_s:.1f} s behind its schedule)")
            results.details["live/streamer"] = {
                "frames": streamer.sent,
                "late_s": streamer.late_s,
                "dropped": streamer.dropped,
            }
            results.add(
                "live",
                f"ingest sockets the server dropped while the pages were open ({n} runs)",
                len(streamer.dropped),
                note=f"({', '.join(sorted(set(streamer.dropped)))[:120]})"
                if streamer.dropped
                else "",
            )


def _drawn_note(figures: dict[str, Any], seconds: float) -> str:
    drawn = figures.get("points_appended")
    return f"(keelLive appended {drawn} points in {seconds:g} s)" if drawn is not None else ""


def part_many(args: argparse.Namespace, scratch: Path, keys: list[str], results: Results) -> None:
    runs = make_runs(args.many_runs, prefix="m")
    with keel_server(f"sqlite:///{scratch / 'many.db'}", log=scratch / "many-server.log") as server:
        took = ingest(server.ws_url, runs, args.many_steps, keys)
        print(
            f"    {len(runs)} runs x {args.many_steps:,} steps x {len(keys)} metrics ingested in {took:.0f} s",
            flush=True,
        )
        ids = [run.id for run in runs]
        with (
            browser(args.window) as driver,
            Streamer(server.ws_url, runs, keys, args.many_rate, args.many_steps) as streamer,
        ):
            figures = live_busy(driver, f"{server.url}/compare?runs={','.join(ids)}", probe("keel", HEADLINE_KEYS, ids),
                                "compare (many runs, live) shown", args.seconds)  # fmt: skip
            streamer.check()
            results.details["live/many"] = {
                **figures,
                "late_s": streamer.late_s,
                "dropped": streamer.dropped,
            }
            results.add(
                "live",
                f"ingest sockets the server dropped while the page was open ({len(runs)} runs)",
                len(streamer.dropped),
            )
        results.add("live", f"compare page {len(runs)} runs streaming {args.many_rate:g} step/s each: busy",
                    100 * figures["busy"], "%", "<= 25", lambda v: v <= 25, _drawn_note(figures, args.seconds))  # fmt: skip
        results.add(
            "live",
            f"compare page {len(runs)} runs: load while streaming (same browser, cold)",
            _shown(figures),
            "s",
        )


def _shown(figures: dict[str, Any]) -> float | str:
    shown = figures["shown_s"]
    return shown if shown is not None else f"> {LIVE_SHOWN_TIMEOUT_S:.0f}"


def part_table(args: argparse.Namespace, scratch: Path, results: Results) -> None:
    runs = make_runs(args.table_runs, prefix="t")
    with keel_server(
        f"sqlite:///{scratch / 'table.db'}", log=scratch / "table-server.log"
    ) as server:
        keys = list(HEADLINE_KEYS)
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda run: ingest_run(server.ws_url, run, 3, keys, 3), runs))
        print(f"    {len(runs)} runs made in {time.monotonic() - began:.0f} s", flush=True)
        began = time.perf_counter()
        listed = get_json(f"{server.url}/api/v1/runs")
        rest_s = time.perf_counter() - began
        samples: list[float] = []
        no_runs = False
        for _ in range(args.repeats):  # cold: a fresh browser profile each
            with browser(args.window) as driver:
                samples.append(open_page(driver, f"{server.url}/", probe("table"), "runs table first row"))
                no_runs = no_runs or bool(driver.execute_script("return window.__bench.noRunsSeen"))
            print(f"    runs table cold load {samples[-1]:.2f} s", flush=True)
        shown = statistics.median(samples)
    results.details["table"] = {
        "shown_s": samples,
        "no_runs_seen": no_runs,
        "rest_s": rest_s,
        "listed": len(listed),
    }
    results.add(
        "table",
        f"runs table of {len(runs)} runs: first row shown, cold, median",
        shown,
        "s",
        "<= 2",
        lambda v: v <= 2,
    )
    results.add(
        "table",
        "'No runs yet' visible while loading",
        "yes" if no_runs else "no",
        "",
        "no",
        note=f"(GET /api/v1/runs: {len(listed)} runs in {rest_s * 1000:.0f} ms)",
    )
    results.figures[-1].ok = not no_runs


# -- the peers ---------------------------------------------------------------------------


def peer_python(cache: Path, peer: str) -> Path:
    for name, pins in PEER_PINS.items():
        peer_venvs.PINS.setdefault(name, pins)
    return peer_venvs.peer_python(cache, peer)


def worker(
    python: Path, config: dict[str, Any], scratch: Path, env: dict[str, str], *, stdin: bool = False
) -> subprocess.Popen[bytes]:
    log = open(scratch / f"{config['mode']}.log", "ab")  # noqa: SIM115 - handed to the child
    return subprocess.Popen(
        [str(python), "-m", "bench.page_data", json.dumps(config)],
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, **PEER_ENV, **env, "PYTHONPATH": str(ROOT)}, cwd=scratch, start_new_session=True,
    )  # fmt: skip


def run_worker(python: Path, config: dict[str, Any], scratch: Path, env: dict[str, str]) -> None:
    proc = worker(python, config, scratch, env)
    if proc.wait(timeout=1800) != 0:
        tail = (scratch / f"{config['mode']}.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{config['mode']} exited {proc.returncode}:\n{tail}")


@contextmanager
def background(proc: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield proc
    finally:
        if proc.stdin:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        peer_venvs.stop_group(proc)


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        parts = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=2)
        try:
            connection.request("GET", "/")
            if connection.getresponse().status < 500:
                return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            connection.close()
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up")
        time.sleep(0.3)


def peer_page(args: argparse.Namespace, label: str, url: str, source: str, live: Callable[[], subprocess.Popen[bytes]],
              results: Results) -> None:  # fmt: skip
    loads = []
    for _ in range(args.repeats):
        loads.append(cold_load(url, source, f"{label} shown", args.window))
        print(f"    {label} cold load {loads[-1]:.2f} s", flush=True)
    with browser(args.window) as driver:
        idle = open_page(driver, url, source, f"{label} shown")
        time.sleep(3)
        idle_busy = busy(driver, args.peer_seconds)
        with background(live()):
            time.sleep(3)
            live_busy_ = busy(driver, args.peer_seconds)
    results.details[f"peers/{label}"] = {
        "load_s": loads,
        "idle_busy": idle_busy,
        "busy": live_busy_,
        "shown_s": idle,
    }
    results.add("peers", f"{label}: five charts drawn, cold, median", statistics.median(loads), "s")
    results.add(
        "peers", f"{label}: busy, nothing logging ({args.peer_seconds:g} s)", 100 * idle_busy, "%"
    )
    results.add(
        "peers",
        f"{label}: busy, {args.runs} runs logging {args.rate:g} steps/s each ({args.peer_seconds:g} s)",
        100 * live_busy_,
        "%",
    )


def part_peers(
    args: argparse.Namespace, runs: list[BenchRun], scratch: Path, results: Results
) -> None:
    keys = metric_keys(args.peer_metrics)
    names = [f"run-{run.index:02d}" for run in runs]
    base_config = {"runs": len(runs), "steps": args.steps, "keys": keys}
    live_config = {"runs": len(runs), "keys": keys, "rate": args.rate, "start": args.steps}
    args.cache.mkdir(parents=True, exist_ok=True)
    for peer in [p for p in ("tensorboard", "trackio") if p in args.peers.split(",")]:
        began = time.monotonic()
        where = scratch / peer
        where.mkdir()
        try:
            python = peer_python(args.cache, peer)
            if peer == "tensorboard":
                logdir = where / "logs"
                run_worker(
                    python, {**base_config, "mode": "tb-history", "logdir": str(logdir)}, where, {}
                )
                port = free_port()
                log = open(where / "tensorboard.log", "wb")  # noqa: SIM115
                server = subprocess.Popen(
                    [str(python.parent / "tensorboard"), "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port),
                     "--reload_interval", "1"],
                    stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **PEER_ENV}, start_new_session=True,
                )  # fmt: skip
                with background(server):
                    wait_http(f"http://127.0.0.1:{port}", server)
                    tags = "^(" + "|".join(k.replace("/", "/") for k in HEADLINE_KEYS) + ")$"
                    url = f"http://127.0.0.1:{port}/#scalars&tagFilter={urllib.parse.quote(tags, safe='')}"
                    # Until TensorBoard has read every event file (it loads them in the background).
                    _wait_tb_loaded(f"http://127.0.0.1:{port}", len(runs), args.steps)
                    peer_page(args, "TensorBoard 2.21.0", url, probe("tensorboard", HEADLINE_KEYS, names),
                              partial(worker, python, {**live_config, "mode": "tb-live", "logdir": str(logdir)}, where, {}, stdin=True),
                              results)  # fmt: skip
            else:
                env = {"TRACKIO_DIR": str(where / "trackio")}
                project = "pagebench"
                run_worker(
                    python,
                    {**base_config, "mode": "trackio-history", "project": project},
                    where,
                    env,
                )
                port = free_port()
                server = worker(
                    python, {"mode": "trackio-show", "project": project, "port": port}, where, env
                )
                with background(server):
                    wait_http(f"http://127.0.0.1:{port}", server)
                    url = f"http://127.0.0.1:{port}/?project={project}"
                    peer_page(args, f"Trackio {peer_venvs.PINS['trackio'][0].split('==')[1]}", url,
                              probe("trackio", HEADLINE_KEYS, names),
                              partial(worker, python, {**live_config, "mode": "trackio-live", "project": project}, where, env, stdin=True),
                              results)  # fmt: skip
        except Exception as exc:  # one peer failing leaves the other's figures
            print(f"    {peer} failed: {type(exc).__name__}: {str(exc)[-800:]}", flush=True)
            results.add(
                "peers", f"{peer}", "failed", note=f"({type(exc).__name__}: {str(exc)[-200:]})"
            )
        print(f"    {peer}: {time.monotonic() - began:.0f} s", flush=True)


def _wait_tb_loaded(base: str, runs: int, steps: int, timeout: float = 300) -> None:
    """Until TensorBoard's scalars API answers every run's last step of the first key."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            tags = get_json(f"{base}/data/plugin/scalars/tags")
            if len(tags) >= runs:
                last = [get_json(f"{base}/data/plugin/scalars/scalars?run={run}&tag={urllib.parse.quote(HEADLINE_KEYS[0])}")
                        for run in list(tags)[:1]]  # fmt: skip
                if last and last[0] and last[0][-1][1] >= steps - 1:
                    return
        except (RuntimeError, OSError, ValueError):
            pass
        time.sleep(1)
    raise RuntimeError("TensorBoard did not load the event files")


# -- the report ----------------------------------------------------------------------------


def report(results: Results) -> None:
    print("\n" + "=" * 100)
    print(f"{'part':7s} {'figure':66s} {'value':>12s} {'target':>10s}  result")
    for f in results.figures:
        if isinstance(f.value, float):
            value = f"{f.value:,.3g}" if abs(f.value) < 1000 else f"{f.value:,.0f}"
        else:
            value = str(f.value if f.value is not None else "-")
        verdict = {True: "pass", False: "FAIL", None: ""}[f.ok]
        print(
            f"{f.part:7s} {f.name[:66]:66s} {value + ' ' + f.unit:>12s} {f.target:>10s}  {verdict}"
        )


def parse_window(text: str) -> tuple[int, int]:
    width, height = text.lower().replace("x", ",").split(",")
    return int(width), int(height)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5000, help="history steps per run")
    parser.add_argument(
        "--metrics", type=int, default=40, help="metrics per step (>= 5: the headline keys first)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="cold loads of each page (alternated with its static page)",
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="busy measurement window")
    parser.add_argument(
        "--hidden-seconds", type=float, default=10.0, help="busy window of the background tab"
    )
    parser.add_argument("--rate", type=float, default=2.0, help="live steps/s per run")
    parser.add_argument("--many-runs", type=int, default=64)
    parser.add_argument("--many-steps", type=int, default=2000)
    parser.add_argument("--many-rate", type=float, default=1.0)
    parser.add_argument("--table-runs", type=int, default=1000)
    parser.add_argument(
        "--peer-metrics",
        type=int,
        default=5,
        help="metrics logged to the peers (the headline five first)",
    )
    parser.add_argument(
        "--peer-seconds",
        type=float,
        default=40.0,
        help="the peers' busy windows (TensorBoard reloads its charts every 30 s)",
    )
    parser.add_argument("--peers", default="tensorboard,trackio", help="which peers")
    parser.add_argument(
        "--window", type=parse_window, default=(1280, 2400), help="browser window, WIDTHxHEIGHT"
    )
    parser.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated parts of {','.join(PARTS)}"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: small data, short windows, no peers"
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path.home() / ".cache" / "keel-bench" / "peers",
        help="peer venvs",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch directory (server logs, databases)"
    )
    args = parser.parse_args()
    parts = [p for p in args.only.split(",") if p]
    if unknown := set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(unknown)}")
    if args.quick:
        args.runs, args.steps, args.metrics, args.repeats = 4, 500, 20, 1
        args.seconds, args.hidden_seconds, args.table_runs = 5.0, 5.0, 50
        args.many_runs, args.many_steps = 8, 300
        parts = [p for p in parts if p != "peers"]
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
            with ExitStack() as stack:
                server = stack.enter_context(
                    keel_server(f"sqlite:///{scratch / 'page.db'}", log=scratch / "server.log")
                )
                took = ingest(server.ws_url, runs, args.steps, keys)
                points = len(runs) * args.steps * len(keys)
                print(
                    f"  ingested {points:,} points in {took:.0f} s ({points / took:,.0f} points/s)",
                    flush=True,
                )
                results.details["ingest_s"] = took
                for part in ("load", "weight", "live"):
                    if part not in parts:
                        continue
                    began = time.monotonic()
                    if part == "load":
                        part_load(args, server.url, runs, results, scratch)
                    elif part == "weight":
                        part_weight(args, server.url, runs, results)
                    else:
                        part_live(args, server.url, server.ws_url, runs, keys, results)
                    print(
                        f"  {part}: {time.monotonic() - began:.0f} s (load average {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
            if "live" in parts:
                began = time.monotonic()
                part_many(args, scratch, keys, results)
                print(
                    f"  live, many runs: {time.monotonic() - began:.0f} s (load average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        if "table" in parts:
            began = time.monotonic()
            part_table(args, scratch, results)
            print(f"  table: {time.monotonic() - began:.0f} s", flush=True)
        if "peers" in parts:
            began = time.monotonic()
            part_peers(args, runs, scratch, results)
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

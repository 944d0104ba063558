"""load: cold loads of the compare page and a run page, each beside a static plotly.js page.

Cold loads (a fresh browser profile each) of /compare?runs=<all>, and of a static page that
draws the same five charts with the same plotly.min.js (the file the dashboard serves, from
the installed `plotly` package) from the same runs' points at 1,000 per trace (raw, and
smoothed with the dashboard's own EMA at its default weight: dashboard/series.py), read
beforehand with keel.client's `Client.series(..., max_points=1000)` and inlined in the page,
served by a plain http.server. Then /runs/<id> against a static page of that run's five
charts. Alternated, `--repeats` each; medians and the ratio page/static (target <= 1.5).
"Shown", for the Keel page and the static page alike (the static page draws into the same
classes and meta): each of the five `.keel-graph .js-plotly-plot` elements whose
`layout.meta.key` is a headline key holds, for every run of the page, a trace with
`meta.run` = the run and `meta.role` in raw/smooth/mean whose x is non-empty (probe.js).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.page.browser import cold_load, probe
from bench.page.results import Results
from bench.page.streams import BenchRun
from dashboard.layout import INITIAL_SMOOTHING
from dashboard.series import ema
from dashboard.theme import HEADLINE_KEYS, metric_info
from keel.client import Client

__all__ = ["part_load"]

STATIC_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>static plotly baseline</title>
<style>body { font-family: system-ui, sans-serif; margin: 16px; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 12px; }
.keel-graph { height: HEIGHTpx; }</style></head>
<body><h1>static baseline</h1><div class="charts">DIVS</div>
<script src="plotly.min.js"></script>
<script>
var CHARTS = CHARTS_JSON;
CHARTS.forEach(function (chart, i) {
  Plotly.newPlot('chart-' + i, chart.data, chart.layout, {displaylogo: false, responsive: true});
});
</script></body></html>
"""
"""HEIGHT, DIVS and CHARTS_JSON are filled in by static_page."""


def plotly_js() -> Path:
    """The plotly.min.js the dashboard serves (Dash serves the installed `plotly` package's)."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise RuntimeError(f"no {path}")
    return path


def series_points(base: str, runs: list[BenchRun], max_points: int = 1000) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """key -> run id -> (steps, values) from Keel's REST series read, `max_points` a series."""
    client = Client(base, timeout=60)
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {key: {} for key in HEADLINE_KEYS}
    for key in HEADLINE_KEYS:
        for run in runs:
            series = client.series(run.id, key, max_points=max_points)
            out[key][run.id] = ([int(s) for s in series.steps], [float(v) for v in series.values])
    return out


def static_page(directory: Path, name: str, points: dict[str, dict[str, Any]], runs: list[BenchRun], height: int) -> str:
    """Writes `<name>.html` drawing the five headline charts of `runs` (their points
    inlined); returns its file name."""
    charts = []
    for key in HEADLINE_KEYS:
        log = metric_info(key).log_y
        data = []
        for run in runs:
            steps, values = points[key][run.id]
            clean = [v if math.isfinite(v) and (v > 0 or not log) else math.nan for v in values]
            raw = [None if math.isnan(v) else v for v in clean]
            smooth, _ = ema(clean, INITIAL_SMOOTHING)
            data.append({"type": "scatter", "mode": "lines", "x": steps, "y": raw, "name": run.name, "opacity": 0.3,
                         "line": {"width": 1}, "showlegend": False, "meta": {"run": run.id, "role": "raw"}})  # fmt: skip
            data.append({"type": "scatter", "mode": "lines", "x": steps, "y": smooth, "name": run.name,
                         "line": {"width": 1.6}, "meta": {"run": run.id, "role": "smooth"}})  # fmt: skip
        layout = {"title": {"text": key}, "height": height, "margin": {"l": 50, "r": 10, "t": 40, "b": 40},
                  "yaxis": {"type": "log" if log else "linear"}, "meta": {"key": key}, "hovermode": "x"}  # fmt: skip
        charts.append({"data": data, "layout": layout})
    divs = "".join(f'<div class="keel-graph"><div id="chart-{i}"></div></div>' for i in range(len(charts)))
    html = (
        STATIC_HTML.replace("HEIGHT", str(height))
        .replace("DIVS", divs)
        .replace("CHARTS_JSON", json.dumps(charts, allow_nan=False))  # last: the points hold no placeholder
    )
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


def part_load(args: argparse.Namespace, base: str, runs: list[BenchRun], results: Results, scratch: Path) -> None:
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
            results.add("load", f"{label}: Keel / static", keel_med / static_med, "x", "<= 1.5", lambda v: v <= 1.5)

"""The one callback that draws every metric chart (compare and run pages), and the one
that draws the collapse hazard chart beside them.

Each chart fetches its own series, so charts fill in independently, and only once the
browser says it is near the view (a run with 40 metrics costs what is on screen). It
redraws on page/option changes, on zoom (re-fetching the visible range at full
resolution), and on the structural live ticks (alerts, reconnects, aggregated
charts). Plain live points never come here: the browser appends them.

The hazard is a function of every step so far (the server recomputes it), so the browser
cannot append to it: it is redrawn on the data tick, which live points bump at most every
few seconds (as the tables beside the charts are).
"""

from __future__ import annotations

import asyncio
import copy
import math
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dash import ALL, MATCH, ClientsideFunction, Dash, Input, Output, State, ctx
from dash.exceptions import PreventUpdate

from dashboard.data import KeelApi
from dashboard.figures import ChartOptions, RunLine, alert_marks, hazard_figure, metric_figure
from dashboard.layout import (
    ALERT_MARKS,
    GRAPH_TYPE,
    HAZARD_GRAPH,
    SEEN_TYPE,
    ZOOM_TYPE,
    tick_reasons,
)
from dashboard.learned_level import ENTROPY_KEY, LEVEL_KEYS, learned_level, start_level
from dashboard.series import Alert, Series, all_zero, magnitude
from dashboard.theme import KL_BANDS, KL_KEY, loss_name, metric_info
from dashboard.traces import HazardRead

__all__ = ["register", "zoom_range", "chart_figure", "learned_levels", "start_levels", "load_hazard", "hazards", "HISTORY_POINTS", "HAZARD_POINTS", "ZOOM_POINTS", "UNCHANGED"]

HISTORY_POINTS = 500
"""Buckets per series for the first draw, about one per horizontal pixel of a chart (the
SQL keeps each bucket's min and max, drawn as a band: spikes survive)."""
ZOOM_POINTS = 5000
"""Points per series for a zoomed range: raw points unless the range holds more."""
HAZARD_POINTS = 600
"""Buckets of a run's hazard (the server keeps each bucket's highest hazard)."""

UNCHANGED = "unchanged"
RESET = None


def zoom_range(relayout: dict[str, Any] | None) -> tuple[float, float] | str | None:
    """The x range a relayout event asks for: a (start, end) pair, None to reset, or
    UNCHANGED when the event does not touch the x axis (resize, y-only zoom, legend)."""
    if not relayout:
        return UNCHANGED
    if relayout.get("xaxis.autorange"):
        return RESET
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        return float(relayout["xaxis.range[0]"]), float(relayout["xaxis.range[1]"])
    pair = relayout.get("xaxis.range")
    if isinstance(pair, list) and len(pair) == 2:
        return float(pair[0]), float(pair[1])
    return UNCHANGED


# "log-axis": a chart drawn on a linear axis for want of a positive value got one (or a log
# chart with nothing drawn got a value ≤ 0), so the server must choose its axis again.
# "compact": a line took in more live points than its history holds (assets/live/2_charts.js
# COMPACT_AFTER), so it is drawn again from buckets: a page open all day stays cheap.
# "unused": a run whose chart said the metric is not used by its loss (0 at every step) logged
# another value, so its line must be drawn after all.
# An "alert" tick (an alert fired or resolved) redraws no chart: its marks alone are read
# (`mark_alerts`) and put in place of the drawn ones by the browser.
STRUCTURAL_TICKS = {"reconnect", "log-axis", "compact", "unused"}


# In the browser (assets/charts.js): only relayouts that touch the x axis reach the server;
# the others (autosize, resizes, y-only zooms) would race an option's redraw.
X_AXIS_ONLY = ClientsideFunction("keel_charts", "x_axis_only")


def register(dash_app: Dash, api: KeelApi) -> None:
    graph = {"type": GRAPH_TYPE, "key": MATCH}
    zoom_store = {"type": ZOOM_TYPE, "key": MATCH}
    seen_store = {"type": SEEN_TYPE, "key": MATCH}
    dash_app.clientside_callback(
        X_AXIS_ONLY, Output(zoom_store, "data"), Input(graph, "relayoutData")
    )

    @dash_app.callback(
        Output(graph, "figure"),
        Input("page-state", "data"),
        Input("opt-smoothing", "value"),
        Input("opt-aggregate", "value"),
        Input("opt-yscale", "value"),
        Input("opt-kl-band", "value"),
        Input(zoom_store, "data"),
        Input("live-tick", "data"),
        Input("backtest-firings", "data"),
        Input(seen_store, "data"),
        State(graph, "id"),
        # First when the browser says the chart is near the view (layout.SEEN_TYPE); again
        # when it asks for this chart alone (a learned level still to come: assets/live/socket.js).
        prevent_initial_call=True,
    )
    async def draw(
        state: dict[str, Any] | None,
        smoothing: float | None,
        aggregate: str | None,
        yscale: str | None,
        kl_band: str | None,
        relayout: dict[str, Any] | None,
        tick: dict[str, Any] | None,
        backtest: dict[str, Any] | None,
        seen: bool | dict[str, Any] | None,
        graph_id: dict[str, str],
    ) -> dict[str, Any]:
        if not state or not seen:
            raise PreventUpdate
        triggers = {item["prop_id"] for item in ctx.triggered}
        if triggers == {"opt-kl-band.value"} and graph_id["key"] != KL_KEY:
            raise PreventUpdate  # the band is the KL chart's alone
        # A backtest's firings show on its run's page only, beside the run's real alerts.
        replayed = []
        if state.get("page") == "run" and backtest and backtest.get("run_id") in state.get("runs", []):
            replayed = [Alert.from_store(firing) for firing in backtest.get("firings", [])]
        elif triggers == {"backtest-firings.data"}:
            raise PreventUpdate
        asked = seen if isinstance(seen, dict) else {}
        if len(triggers) == 1 and getattr(ctx.triggered_id, "type", None) == SEEN_TYPE and asked.get("reason") == "level":
            # Asked for because points came for runs without a learned level: nothing to draw
            # again until one of them has one (the points themselves are appended in the browser).
            waiting = [run_id for run_id in asked.get("pending") or [] if run_id in state.get("runs", [])]
            starting = [run_id for run_id in asked.get("pending_start") or [] if run_id in state.get("runs", [])]
            levels, starts = await asyncio.gather(learned_levels(api, waiting), start_levels(api, starting))
            if not any(level is not None for level in (*levels.values(), *starts.values())):
                raise PreventUpdate
        zoom = zoom_range(relayout)  # the store only ever holds x-axis relayouts (X_AXIS_ONLY)
        if triggers == {"live-tick.data"}:
            reasons = tick_reasons(tick)
            wanted = bool(reasons & STRUCTURAL_TICKS) or ("aggregate" in reasons and aggregate != "runs")
            if not wanted:
                raise PreventUpdate
        x_range = zoom if isinstance(zoom, tuple) else None
        options = ChartOptions(
            smoothing=float(smoothing or 0.0),
            aggregate="std"
            if aggregate == "std"
            else "stderr"
            if aggregate == "stderr"
            else "runs",
            log_y=None if yscale in (None, "auto") else yscale == "log",
            x_range=x_range,
            height=int(state.get("height", 300)),
            band=KL_BANDS.get(kl_band or "") if graph_id["key"] == KL_KEY else None,
        )
        return await chart_figure(api, graph_id["key"], state.get("runs", []), options, replayed)

    @dash_app.callback(
        Output(ALERT_MARKS, "data"),
        Input("live-tick", "data"),
        State("page-state", "data"),
        State({"type": SEEN_TYPE, "key": ALL}, "data"),
        State({"type": SEEN_TYPE, "key": ALL}, "id"),
        prevent_initial_call=True,
    )
    async def mark_alerts(
        tick: dict[str, Any] | None, state: dict[str, Any] | None, seen: list[Any], ids: list[dict[str, str]]
    ) -> dict[str, Any]:
        """On an alert tick, the alert marks of every chart drawn: one read of the runs and
        their alerts, no series (a chart drawn afresh by the same tick has them already)."""
        reasons = tick_reasons(tick)
        keys = [item["key"] for item, shown in zip(ids, seen, strict=True) if shown]
        if not state or "alert" not in reasons or reasons & STRUCTURAL_TICKS or not keys:
            raise PreventUpdate
        read = time.time()
        infos = await api.runs_by_id(state.get("runs", []))
        known = {run_id: info for run_id, info in infos.items() if info}
        alerts = await api.alerts(list(known))
        if alerts is None:
            raise PreventUpdate
        runs = {run_id: (str(info.get("name", run_id)), info.get("last_step")) for run_id, info in known.items()}
        return {"read": read, "charts": {key: alert_marks(key, runs, alerts) for key in keys}}

    dash_app.clientside_callback(
        ClientsideFunction("keel_charts", "alert_marks"), Output("alert-marks-drawn", "data"), Input(ALERT_MARKS, "data")
    )

    @dash_app.callback(
        Output(HAZARD_GRAPH, "figure"),
        Input("page-state", "data"),
        Input("live-data-tick", "data"),
        prevent_initial_call=True,  # first on the "drawn" tick: after the metric charts
    )
    async def draw_hazard(state: dict[str, Any] | None, _tick: Any) -> dict[str, Any]:
        if not state or state.get("page") not in ("run", "compare"):
            raise PreventUpdate
        lines, reads, horizon, live = await load_hazard(api, state.get("runs", []))
        return hazard_figure(lines, horizon, int(state.get("height", 300)), render_id=uuid.uuid4().hex, growing=live, reads=reads)


async def chart_figure(
    api: KeelApi, key: str, run_ids: list[str], options: ChartOptions, backtest: Sequence[Alert] = ()
) -> dict[str, Any]:
    """The chart of `key` over `run_ids` as `options` draw it (its zoomed range read at full
    resolution), with its companion lines and, on the entropy chart, each run's learned
    level. Also what a card sent with its figure holds (views/run.py)."""
    read = time.time()
    infos = await api.runs_by_id(run_ids)
    lines, alerts, companions = await load_lines(api, infos, key, options.x_range)
    levels = starts = None
    if metric_info(key).learned_level:
        ids = [line.run_id for line in lines]
        levels, starts = await asyncio.gather(learned_levels(api, ids), start_levels(api, ids))
    unused = await unused_by_loss(api, key, lines) if options.x_range is None else {}
    figure = metric_figure(
        key, lines, alerts, options, render_id=uuid.uuid4().hex, backtest=backtest, companions=companions, levels=levels,
        starts=starts, running=running(infos), unused=unused, rollbacks=await rollbacks(api, [line.run_id for line in lines]),
    )
    # When its alerts were read: alert marks read later replace its own (assets/live/charts.js).
    figure["layout"]["meta"]["alerts_read"] = read
    return figure


ROLLBACK_KEY = "guard/rollback"
"""1 at each step a guard rolled its run back (learners/lm/guard.py)."""


async def rollbacks(api: KeelApi, run_ids: list[str]) -> dict[str, list[int]]:
    """The steps each run's guard rolled back at (none for a run without a guard); a bucket of
    steps counts when its highest value is 1."""
    if not run_ids:
        return {}
    found = await api.series_of_runs(run_ids, ROLLBACK_KEY, max_points=HISTORY_POINTS)
    marked = {}
    for run_id, series in found.items():
        tops = series.maxs or series.values
        steps = [step for step, top in zip(series.steps, tops, strict=True) if top >= 1.0]
        if steps:
            marked[run_id] = steps
    return marked


async def unused_by_loss(api: KeelApi, key: str, lines: Sequence[RunLine]) -> dict[str, str | None]:
    """The runs whose loss does not do what `key` counts (theme.MetricInfo.of_loss): those that
    logged 0 at every step, each with its loss as its config names it (None: not named)."""
    if metric_info(key).of_loss is None:
        return {}
    zero = [line.run_id for line in lines if all_zero(line.series)]
    runs = await asyncio.gather(*(api.run(run_id) for run_id in zero))
    return {run_id: loss_name((run or {}).get("config") or {}) for run_id, run in zip(zero, runs, strict=True)}


def running(infos: dict[str, dict[str, Any] | None]) -> set[str]:
    """The runs of these that are live: their charts leave room on the right for their next
    points, and a group's band is extended by the page as they come."""
    return {run_id for run_id, info in infos.items() if (info or {}).get("status") == "running"}


async def load_hazard(api: KeelApi, run_ids: list[str]) -> tuple[list[RunLine], dict[str, HazardRead], int | None, bool]:
    """Each known run's hazard as a line (empty while it warms up), what reads each, the
    horizon the server speaks about (None when no run answered), and whether a run of them is live."""
    infos = await api.runs_by_id(run_ids)
    known = [run_id for run_id in dict.fromkeys(run_ids) if infos.get(run_id)]
    series, reads, horizon = await hazards(api, known)
    lines = []
    for run_id in known:
        info = infos[run_id] or {}
        lines.append(RunLine(run_id, str(info.get("name", run_id)), info.get("group"), series[run_id]))
    return lines, reads, horizon, bool(running(infos))


async def hazards(api: KeelApi, run_ids: list[str]) -> tuple[dict[str, Series], dict[str, HazardRead], int | None]:
    """Each run's hazard as a series of HAZARD_POINTS buckets at most, each its highest hazard,
    up to the step its reward collapsed (a collapse ahead no longer speaks of it past there; empty
    while the run warms up, or for a run the server does not know), what reads it, and the
    horizon the server speaks about (None when no run answered): the hazard chart's data, and
    the compare summary's peak hazard."""
    answers = await api.hazards(run_ids, max_points=HAZARD_POINTS)  # each run once
    found, reads, horizon = {}, {}, None
    for run_id, answer in answers.items():
        series, read = Series.empty(), HazardRead()
        if answer is not None:
            horizon = int(answer["horizon"])
            read = HazardRead.from_json(answer)
            ends = read.fell_at if read.collapsed else None  # a fall not judged yet may regain: still a hazard
            kept = [(s, float(v)) for s, v in zip(answer["steps"], answer["hazard"], strict=True) if ends is None or s < ends]
            series = Series([s for s, _ in kept], [v for _, v in kept])
        found[run_id], reads[run_id] = series, read
    return found, reads, horizon


async def load_lines(
    api: KeelApi, infos: dict[str, dict[str, Any] | None], key: str, x_range: tuple[float, float] | None
) -> tuple[list[RunLine], list[Alert], list[RunLine]]:
    """The chart's line of each known run (`infos`: the runs as api.runs_by_id reads them),
    the runs' alerts, and the runs' companion lines (theme.MetricInfo.companion; a run that
    does not log it has none)."""
    known = [run_id for run_id, info in infos.items() if info]
    start = end = None
    if x_range is not None:
        start = max(0, math.floor(min(x_range)))
        end = max(0, math.ceil(max(x_range)))
    read: dict[str, Any] = {"max_points": HISTORY_POINTS if x_range is None else ZOOM_POINTS, "start": start, "end": end}
    info = metric_info(key)
    companion = info.companion
    drawn, alerts, beside = await asyncio.gather(
        _drawn_series(api, known, key, read),
        api.alerts(known),
        api.series_of_runs(known, companion, **read) if companion else _no_series(),
    )
    lines, companions = [], []
    for run_id in known:
        info_of_run = infos[run_id] or {}
        name, group = str(info_of_run.get("name", run_id)), info_of_run.get("group")
        source, series = drawn[run_id]
        lines.append(RunLine(run_id, name, group, series, key=source))
        if companion and beside[run_id].steps:
            companions.append(RunLine(run_id, name, group, beside[run_id], key=companion))
    return lines, alerts or [], companions


async def _no_series() -> dict[str, Series]:
    return {}


async def _drawn_series(
    api: KeelApi, run_ids: list[str], key: str, read: dict[str, Any]
) -> dict[str, tuple[str | None, Series]]:
    """Each run's series of the chart: its key's, or for a chart of other metrics (the loss
    magnitude) the first of them the run logs, with that metric's key; |x| for a magnitude."""
    info = metric_info(key)
    if not info.sources:
        found = await api.series_of_runs(run_ids, key, **read)
        chosen: dict[str, str | None] = dict.fromkeys(run_ids)
        series = {run_id: found[run_id] for run_id in run_ids}
    else:
        logged = await api.keys_of_runs(run_ids)
        chosen = {
            run_id: next((source for source in info.sources if source in logged[run_id]), info.sources[0])
            for run_id in run_ids
        }
        reads = await asyncio.gather(
            *(api.series_of_runs([r for r in run_ids if chosen[r] == source], source, **read) for source in info.sources)
        )
        by_source = dict(zip(info.sources, reads, strict=True))
        series = {run_id: by_source[str(chosen[run_id])][run_id] for run_id in run_ids}
    if info.of == "magnitude":
        series = {run_id: magnitude(one) for run_id, one in series.items()}
    return {run_id: (chosen[run_id], series[run_id]) for run_id in run_ids}


LEVEL_READ = 1000
"""Steps of the first read of a run's points for its learned level; each next read twice as
many, up to LEVEL_READ_MAX (the most points one read of the API answers unbucketed): a run
whose level is set in its first hundreds of steps costs three short reads, one that has not
learned yet is read to its end."""
LEVEL_READ_MAX = 100_000
LEVEL_CACHE_RUNS = 4096
"""Runs whose learned level (or where its detector stands) this process keeps."""


@dataclass
class _Level:
    """Where a run's learned level stands: the level once set (it then never changes), else
    the detector's state after every step up to `next_step` - 1 that all of LEVEL_KEYS had
    passed (a step's points are complete once every key logged a later one)."""

    state: dict[str, Any]
    next_step: int
    level: float | None = None


_LEVELS: OrderedDict[str, _Level] = OrderedDict()
"""Run id -> where its learned level stands (least recently used first): the entropy chart
reads a run's points for its level once, not on every draw (a run that has not learned
would be read to its end each time: 2.7 s of a 16-run compare page's load, measured)."""


async def learned_levels(api: KeelApi, run_ids: list[str]) -> dict[str, float | None]:
    """Each run's learned entropy level (dashboard/learned_level.py; None while it has none)."""
    ids = list(dict.fromkeys(run_ids))
    return dict(zip(ids, await asyncio.gather(*(learned_level_of(api, run_id) for run_id in ids)), strict=True))


async def learned_level_of(api: KeelApi, run_id: str) -> float | None:
    """The run's learned level, from every point (never buckets) of the entropy, the reward and
    its spread, read in step order until the level is set or the run's points end. The steps
    every key has passed stay read (`_LEVELS`): a later call reads only the steps since."""
    known = _LEVELS.get(run_id)
    if known is not None:
        _LEVELS.move_to_end(run_id)
        if known.level is not None:
            return known.level
    last = await api.last_steps(run_id)
    if ENTROPY_KEY not in last:
        return None
    keys = [key for key in LEVEL_KEYS if key in last]
    end_of_run = max(last[key] or 0 for key in keys)
    complete = min(last[key] or 0 for key in keys)  # every key logged past the steps before it
    state = copy.deepcopy(known.state) if known is not None else {}
    beyond: dict[str, Any] | None = None  # the detector past `complete`: not kept
    start, size = (known.next_step if known is not None else 0), LEVEL_READ
    while start <= end_of_run:
        end = start + size - 1  # a range of `size` steps holds at most `size` points: never bucketed
        reads = await asyncio.gather(
            *(api.series_of_runs([run_id], key, max_points=size, start=start, end=end) for key in keys)
        )
        rows: dict[int, dict[str, float]] = {}
        for key, found in zip(keys, reads, strict=True):
            for step, value in zip(found[run_id].steps, found[run_id].values, strict=True):
                rows.setdefault(step, {})[key] = value
        for step, values in sorted(rows.items()):
            if step <= complete:
                level = learned_level(state, [(step, values)])
                if level is not None:
                    _remember(run_id, _Level({}, 0, level))
                    return level
            else:
                beyond = copy.deepcopy(state) if beyond is None else beyond
                level = learned_level(beyond, [(step, values)])
                if level is not None:
                    _remember(run_id, _Level(state, complete + 1))
                    return level
        start, size = end + 1, min(2 * size, LEVEL_READ_MAX)
    _remember(run_id, _Level(state, min(start, complete + 1)))
    return None


_STARTS: OrderedDict[str, float] = OrderedDict()
"""Run id -> its entropy's start, once known (it never changes; a run without one is read again)."""


async def start_levels(api: KeelApi, run_ids: list[str]) -> dict[str, float | None]:
    """Each run's entropy start (dashboard/learned_level.py `start_level`; None until it has
    logged START_VALUES entropy values)."""
    ids = list(dict.fromkeys(run_ids))
    return dict(zip(ids, await asyncio.gather(*(start_level_of(api, run_id) for run_id in ids)), strict=True))


async def start_level_of(api: KeelApi, run_id: str) -> float | None:
    """The run's entropy start, from its first points (never buckets), read from step 0 in
    ranges that double until it has START_VALUES of them or its points end."""
    known = _STARTS.get(run_id)
    if known is not None:
        _STARTS.move_to_end(run_id)
        return known
    last = (await api.last_steps(run_id)).get(ENTROPY_KEY)
    values: list[float] = []
    start, size = 0, LEVEL_READ
    while last is not None and start <= last:
        found = (await api.series_of_runs([run_id], ENTROPY_KEY, max_points=size, start=start, end=start + size - 1))[run_id]
        values.extend(found.values)
        level = start_level(values)
        if level is not None:
            _STARTS[run_id] = level
            while len(_STARTS) > LEVEL_CACHE_RUNS:
                _STARTS.popitem(last=False)
            return level
        start, size = start + size, min(2 * size, LEVEL_READ_MAX)
    return None


def _remember(run_id: str, level: _Level) -> None:
    _LEVELS[run_id] = level
    _LEVELS.move_to_end(run_id)
    while len(_LEVELS) > LEVEL_CACHE_RUNS:
        _LEVELS.popitem(last=False)

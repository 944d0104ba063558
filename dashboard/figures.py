"""Figure builders: points in, Plotly figure (a plain dict) out. No I/O.

Conventions the browser relies on (assets/live/ appends live points):
- `layout.meta` = {"key", "keys", "of", "render_id", "aggregate", "smoothing", "empty",
  "y_extent", "flat", "log_fallback", ...}: "keys" the metrics its lines draw (its key, or
  the loss magnitude's sources, and a companion's), "of" "magnitude" when they are |x|; the
  entropy chart's "levels" (run -> learned level or None) and "pending" (runs without one);
- each trace's `meta` = {"run", "role", "last_step", ...} with role one of
  "raw" (the line as logged), "smooth" (its EMA; meta.ema carries the state),
  "nonfinite" (NaN/±Inf markers on the edge axis y2), "envelope" (min/max of
  downsampled buckets), "member"/"mean"/"band" (group aggregation; while a member is
  live the page extends them from their meta: a member's "ema", "first_step", "asof" and
  "tail", a mean's "members", "running", "spread", "last_step" and "floor", a band's
  "points", traces.group_traces), "alerts",
  "companion" (a metric drawn beside the run's line: its length cap); meta.key when
  the trace draws another metric than the chart's key.
Non-finite values never vanish: they are gaps in the line and markers at the
plot edge on an overlaid, fixed [0, 1] axis, so zoom and log scale cannot hide them.

The y axis never zooms into rounding error: a series flat to within FLAT_SPAN of its
size gets a fixed range of ±FLAT_PAD around it (`flat_range`; the browser applies the
same rule to live points from `meta.y_extent`). On a log axis values ≤ 0 are gaps marked at the
bottom edge ("zero" edge markers) and a smoothed line stops at its floor (traces.LOG_FLOOR); a chart
with nothing positive to show is drawn on a linear axis with a note instead.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dashboard.series import Alert, nonfinite_points
from dashboard.text import plot_text
from dashboard.theme import FONT, GRID, INK, MUTED, SEVERITY_COLOURS, metric_info
from dashboard.traces import (
    EDGE_LABEL,
    EDGE_SYMBOL,
    EDGE_Y,
    ChartedRuns,
    HazardRead,
    RunLine,
    Style,
    alert_overlays,
    charted_runs,
    companion_trace,
    group_of,
    group_traces,
    level_shape,
    rollback_shapes,
    run_styles,
    run_traces,
)

__all__ = [
    "RunLine",
    "ChartOptions",
    "Style",
    "run_styles",
    "metric_figure",
    "alert_marks",
    "hazard_figure",
    "HAZARD_TITLE",
    "message_figure",
    "base_layout",
    "flat_range",
    "FLAT_SPAN",
    "FLAT_PAD",
    "x_axis_end",
    "HEADROOM",
    "MIN_HEADROOM",
    "EDGE_Y",
    "EDGE_SYMBOL",
]

Figure = dict[str, Any]

FLAT_SPAN = 1e-6
"""Values closer than this fraction of their size are one value to the eye: float32 keeps
about 7 digits and float64 arithmetic rounds in the 16th, so such a spread is noise."""
FLAT_PAD = 0.1
"""How far a flat series' axis reaches either side of it: ±10 % of the value, or a tenth
of a decade each way on a log axis."""


@dataclass(frozen=True)
class ChartOptions:
    smoothing: float = 0.6
    """EMA weight in [0, 1); 0 shows the raw line only."""
    aggregate: Literal["runs", "std", "stderr"] = "runs"
    """"runs": one line per run; otherwise one mean line per group with a ± std / stderr band."""
    log_y: bool | None = None
    """None: the metric's default (log for KL, ratios, norms)."""
    x_range: tuple[float, float] | None = None
    """A zoomed view to keep; None autoranges."""
    height: int = 300
    band: tuple[str, float, float] | None = None
    """A healthy band to shade across the chart, (label, low, high) in the metric's units
    (theme.KL_BANDS on the KL chart); None shades nothing."""


def _annotation(text: str, *, colour: str = MUTED) -> Figure:
    return {
        "text": text,
        "xref": "paper",
        "yref": "paper",
        "x": 0.5,
        "y": 0.5,
        "showarrow": False,
        "font": {"size": 13, "color": colour},
    }


def base_layout(title: str, unit: str, height: int, log_y: bool) -> Figure:
    """Every chart's frame: title, margins, fonts, step on x, `unit` on a linear or log y.
    `title` and `unit` are Plotly markup: a trainer's string goes in through `plot_text`."""
    axis = {
        "gridcolor": GRID,
        "zeroline": False,
        "linecolor": GRID,
        "ticks": "outside",
        "tickcolor": GRID,
    }
    return {
        "title": {"text": title, "x": 0.01, "xanchor": "left", "y": 0.97, "font": {"size": 14}},
        "height": height,
        "margin": {"l": 64, "r": 16, "t": 36, "b": 48},
        "font": {"family": FONT, "size": 12, "color": INK},
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
        "hovermode": "x unified",
        "hoverlabel": {"namelength": -1},  # a run's name whole in the hover (Plotly cuts it at 15)
        "xaxis": {**axis, "title": {"text": "step", "standoff": 4}},
        "yaxis": {
            **axis,
            "title": {"text": unit},
            "type": "log" if log_y else "linear",
            "exponentformat": "power" if log_y else "SI",
        },
        "yaxis2": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
        # One legend per page (the run chips above the charts), not one under every chart:
        # five copies of it cost room and a share of every live redraw.
        "showlegend": False,
        "shapes": [],
        "annotations": [],
    }


def flat_range(extent: tuple[float, float] | None, log_y: bool) -> list[float] | None:
    """The y range (in axis units: log10 on a log axis) that shows a flat series as a flat
    line, or None when the series varies (or is exactly 0 everywhere, which Plotly draws
    at [-1, 1]). Plotly's own autorange zooms into rounding error, and puts a constant on
    a log axis at the top edge; `autorangeoptions.include` only widens that afterwards."""
    if extent is None:
        return None
    lo, hi = extent
    size = max(abs(lo), abs(hi))
    if size == 0 or hi - lo >= FLAT_SPAN * size:
        return None
    middle = (lo + hi) / 2
    if log_y:
        return [math.log10(middle) - FLAT_PAD, math.log10(middle) + FLAT_PAD]
    return [middle - FLAT_PAD * abs(middle), middle + FLAT_PAD * abs(middle)]


HEADROOM = 0.1
"""Room on the right of a growing run's step axis, as a share of the steps shown: the live
updater paints the next points there without a redraw (assets/live/overlay.js)."""
MIN_HEADROOM = 10
"""The least room on the right, in steps."""


def x_axis_end(first: float, newest: float) -> float:
    """Where the step axis of a chart whose newest point is at `newest` ends while its runs
    grow: HEADROOM of the steps shown past the newest (at least MIN_HEADROOM), rounded up to a
    multiple of a round step (1, 2 or 5 × 10^k, at most that room). Every chart of a page that
    holds the same steps ends at the same step, and the end moves in a few jumps, not with
    every point (assets/live/math.js `xAxisEnd` is the same arithmetic)."""
    room = max(MIN_HEADROOM, HEADROOM * (newest - first))
    decade = 10 ** math.floor(math.log10(room))
    grid = max(m * decade for m in (1, 2, 5) if m * decade <= room)
    return float(math.ceil((newest + room) / grid) * grid)


def _follow_data(layout: Figure, steps: Sequence[Sequence[int]]) -> None:
    """Leave room on the right of the step axis for the points to come (x_axis_end), and say
    where it ends in layout.meta ("x_first", "x_end": the live updater widens it from there)."""
    firsts = [s[0] for s in steps if s]
    if not firsts:
        return
    first, newest = min(firsts), max(s[-1] for s in steps if s)
    end = x_axis_end(first, newest)
    layout["xaxis"]["autorangeoptions"] = {"include": [end]}
    layout["meta"].update(x_first=first, x_end=end)


def _y_extent(traces: Sequence[Figure], log_y: bool) -> tuple[float, float] | None:
    """The smallest and largest value drawn on the main y axis (markers live on y2)."""
    isfinite = math.isfinite  # drawable() inlined: a 16-run chart has ~50,000 values
    drawn = [
        v
        for trace in traces
        if trace.get("yaxis", "y") == "y"
        for v in trace["y"]
        if v is not None and isfinite(v) and (v > 0 or not log_y)
    ]
    return (min(drawn), max(drawn)) if drawn else None


DRAWN_PRECISION = 5e-4
"""A drawn value is kept to this fraction of the chart's y span (a sixth of a pixel of a
330-pixel chart; hover shows 4 significant digits): the digits beyond are weight, not data."""


def _drop_invisible_digits(traces: Sequence[Figure], extent: tuple[float, float] | None) -> None:
    """Round the main axis' lines to DRAWN_PRECISION of the span they are drawn over (in
    place; a flat chart, drawn over its own fixed range, keeps every digit). About half a
    figure's JSON is digits no pixel shows."""
    if extent is None or extent[1] <= extent[0]:
        return
    size = max(abs(extent[0]), abs(extent[1]))
    digits = min(17, max(4, 1 + math.ceil(math.log10(size / ((extent[1] - extent[0]) * DRAWN_PRECISION)))))
    for trace in traces:
        if trace.get("yaxis", "y") != "y" or trace.get("meta", {}).get("role") == "hazard":
            continue
        trace["y"] = [float(f"{v:.{digits}g}") if isinstance(v, float) and math.isfinite(v) else v for v in trace["y"]]


def _log_fallback_note(lines: Sequence[RunLine]) -> str | None:
    """Why a log axis cannot draw these lines (finite values, none positive), or None if it can."""
    finite = [
        v
        for line in lines
        for values in (line.series.values, line.series.maxs or ())
        for v in values
        if math.isfinite(v)
    ]
    if not finite or any(v > 0 for v in finite):
        return None
    what = "all values are 0" if all(v == 0 for v in finite) else "no value is above 0"
    return f"{what}; a log axis cannot show them<br>drawn on a linear axis"


def _drawn_name(key: str, lines: Sequence[RunLine]) -> str:
    """What a chart's lines are, under its title: its key, or for a chart of other metrics
    (the loss magnitude) the ones its runs' lines draw, |x| for a magnitude."""
    info = metric_info(key)
    if not info.sources:
        return key
    drawn = [k for k in info.sources if any(line.key == k for line in lines)] or [info.sources[0]]
    return ", ".join(f"|{k}|" if info.of == "magnitude" else k for k in drawn)


def alert_marks(key: str, runs: ChartedRuns, alerts: Sequence[Alert]) -> Figure:
    """The live alerts' marks on the chart of `key` as `metric_figure` draws them (its shapes
    named `firing:<run>` or `resolved`, its trace with meta.role "alerts"; no backtest's):
    what the browser puts in place of a drawn chart's own when the alerts changed and its
    series did not (assets/live/charts.js, `markAlerts`), so that an alert does not make
    every chart read its series again."""
    shapes, traces = alert_overlays(metric_info(key).drawn_from, runs, alerts)
    return {"key": key, "shapes": shapes, "trace": traces[0] if traces else None}


def metric_figure(
    key: str,
    lines: Sequence[RunLine],
    alerts: Sequence[Alert] = (),
    options: ChartOptions = ChartOptions(),
    render_id: str = "",
    backtest: Sequence[Alert] = (),
    *,
    companions: Sequence[RunLine] = (),
    levels: Mapping[str, float | None] | None = None,
    starts: Mapping[str, float | None] | None = None,
    running: Collection[str] = (),
    unused: Mapping[str, str | None] | None = None,
    rollbacks: Mapping[str, Sequence[int]] | None = None,
) -> Figure:
    """One chart of one metric across runs (or across groups when aggregating), with the
    runs' alerts and a backtest's firings. `companions`: a metric drawn beside the runs'
    lines (theme.MetricInfo.companion, their `key`); `levels`: each run's learned level
    (None: not yet), drawn as a dashed line across the chart; `starts`: each run's start, the
    level "entropy far above its start" measures from (None: not yet), a dotted line; `running`: the runs that are
    live (the step axis leaves room for their next points, x_axis_end; a group's band ends at
    its slowest live member, and the page extends it); `unused`: the runs whose loss
    does not use the metric (run id -> the loss's name, None when unnamed), said in a note
    instead of drawn as a flat line (theme.MetricInfo.of_loss); `rollbacks`: each guarded run's
    rollback steps, a dotted line across the chart at each."""
    info = metric_info(key)
    every_line = lines
    lines = [line for line in lines if line.run_id not in (unused or {})]
    log_y = info.log_y if options.log_y is None else options.log_y
    log_note = _log_fallback_note(lines) if log_y else None
    if log_note is not None:
        log_y = False
    # The key (and an unknown key's title and unit, which are the key) is the trainer's:
    # text, inside the markup added here.
    drawn = _drawn_name(key, lines)
    title = (
        f"<b>{plot_text(info.title)}</b>"
        if info.title == drawn
        else f"<b>{plot_text(info.title)}</b>  <span style='color:{MUTED};font-size:11px'>{plot_text(drawn)}</span>"
    )
    layout = base_layout(title, plot_text(info.unit), options.height, log_y)
    styles = run_styles(every_line)  # a run keeps its colour and dash when another is not drawn
    aggregate = options.aggregate != "runs"
    traces: list[Figure] = []
    if aggregate:
        groups: dict[str, list[RunLine]] = {}
        for line in lines:
            groups.setdefault(group_of(line), []).append(line)
        for name in sorted(groups):
            members = groups[name]
            spread: Literal["std", "stderr"] = "stderr" if options.aggregate == "stderr" else "std"
            traces.extend(
                group_traces(members, styles[members[0].run_id], options.smoothing, spread, log_y, running)
            )
    else:
        for line in lines:
            traces.extend(run_traces(line, styles[line.run_id], options.smoothing, log_y))
    traces.extend(companion_trace(line, styles[line.run_id], log_y) for line in companions if line.run_id in styles)
    shapes, alert_traces = alert_overlays(info.drawn_from, charted_runs(lines), alerts, backtest)
    shapes += rollback_shapes(lines, rollbacks or {}, styles)
    layout["shapes"] = shapes if options.band is None else [_band_shape(options.band), *shapes]
    traces.extend(alert_traces)
    level_meta = _draw_levels(layout, lines, levels, styles, log_y) if levels is not None else {}
    if starts is not None:
        level_meta.update(_draw_starts(layout, lines, starts, styles, log_y))

    empty = not any(line.series.steps for line in lines)
    if unused:
        _say_unused(layout, key, every_line, unused, alone=not lines)
    elif not lines:
        layout["annotations"].append(_annotation("No runs selected"))
    elif empty:
        layout["annotations"].append(_annotation(f"No points for {plot_text(key)} yet — waiting for data"))
    if log_note is not None:
        note = _annotation(log_note)
        layout["annotations"].append(
            {**note, "y": 0.97, "yanchor": "top", "font": {**note["font"], "size": 11}}
        )
    extent = _y_extent(traces, log_y)
    y_range = flat_range(extent, log_y)
    if y_range is not None:
        layout["yaxis"].update(range=y_range, autorange=False)
    else:
        _drop_invisible_digits(traces, extent)
    counts: dict[str, int] = {}
    for line in lines:
        for point in nonfinite_points(line.series):
            counts[point.kind] = counts.get(point.kind, 0) + 1
    if counts:
        summary = ", ".join(
            f"{counts[k]} {EDGE_LABEL[k]}" for k in ("nan", "+inf", "-inf") if k in counts
        )
        layout["annotations"].append(
            {
                "text": f"non-finite: {summary}",
                "xref": "paper",
                "yref": "paper",
                "x": 1,
                "y": 1.0,
                "xanchor": "right",
                "yanchor": "bottom",
                "showarrow": False,
                "font": {"size": 11, "color": SEVERITY_COLOURS["critical"]},
            }
        )
    if options.x_range is not None:
        layout["xaxis"]["range"] = list(options.x_range)
        layout["xaxis"]["autorange"] = False
    layout["uirevision"] = f"{key}|{','.join(sorted(line.run_id for line in lines))}"
    layout["meta"] = {
        "key": key,
        "keys": [*info.drawn_from, *([info.companion] if info.companion else [])],
        "of": info.of,
        "render_id": render_id,
        "aggregate": aggregate,
        "smoothing": options.smoothing,
        "empty": empty,
        "y_extent": list(extent) if extent is not None else None,
        "flat": {"span": FLAT_SPAN, "pad": FLAT_PAD, "range": y_range},
        "log_fallback": log_note is not None,
        "band": None if options.band is None else list(options.band),
        "edge": {kind: [EDGE_Y[kind], EDGE_SYMBOL[kind], EDGE_LABEL[kind]] for kind in EDGE_Y},
        **level_meta,
    }
    layout["meta"]["unused"] = sorted(unused or {})
    if running and options.x_range is None and lines:
        _follow_data(layout, [line.series.steps for line in lines])
    return {"data": traces, "layout": layout}


def unused_note(key: str, lines: Sequence[RunLine], unused: Mapping[str, str | None], *, named: bool) -> str:
    """What a chart says of the runs whose loss does not use `key` (figures.metric_figure
    `unused`), in text: "not used by importance_sampling: 0 at every step (it gated nothing)";
    `named`: with the runs' names, for a chart that draws other runs too."""
    by_loss: dict[str, list[str]] = {}
    for line in lines:
        if line.run_id in unused:
            by_loss.setdefault(unused[line.run_id] or "this run's loss", []).append(line.name)
    what = metric_info(key).of_loss or "used"
    parts = [f"{loss} ({', '.join(names)})" if named else loss for loss, names in by_loss.items()]
    return f"not used by {'; '.join(parts)}: 0 at every step (it {what} nothing)"


def _say_unused(
    layout: Figure, key: str, lines: Sequence[RunLine], unused: Mapping[str, str | None], *, alone: bool
) -> None:
    """The note on a chart with runs whose loss does not use its metric: in place of the chart
    when no other run is drawn (the axes hidden), else in its top left corner."""
    text = plot_text(unused_note(key, lines, unused, named=not alone or len(lines) > 1))
    if alone:
        layout["xaxis"].update(visible=False)
        layout["yaxis"].update(visible=False)
        layout["annotations"].append(_annotation(text))
        return
    layout["annotations"].append(
        {**_annotation(text), "x": 0.01, "y": 0.97, "xanchor": "left", "yanchor": "top", "font": {"size": 10, "color": MUTED}}
    )


LEVEL_LABEL = "learned level"


def _level_lines(
    layout: Figure, lines: Sequence[RunLine], values: Mapping[str, float | None], styles: Mapping[str, Style], log_y: bool,
    kind: str, label: str, **shape: str,
) -> dict[str, float | None]:
    """Each drawn run's level of `values` as a line across the chart (a shape named
    `<kind>:<run id>`, labelled "<label> <value>", with the run's name when several are
    drawn); returns run id -> its value (None: not yet) for the runs `values` knows."""
    known = {line.run_id: values.get(line.run_id) for line in lines if line.run_id in values}
    several = len(lines) > 1
    for line in lines:
        level = known.get(line.run_id)
        if level is None or not math.isfinite(level) or (log_y and level <= 0):
            continue
        text = f"{label} {level:.3g}" + (f" ({line.name})" if several else "")
        layout["shapes"].append(level_shape(level, f"{kind}:{line.run_id}", styles[line.run_id], text, **shape))
    return known


def _draw_levels(
    layout: Figure, lines: Sequence[RunLine], levels: Mapping[str, float | None], styles: Mapping[str, Style], log_y: bool
) -> Figure:
    """Each run's learned level as a dashed line across the chart (a shape named
    `level:<run id>`) and a note for the runs that have none yet; returns what goes in
    `layout.meta`: "levels" (run id -> level or None) and "pending" (the runs without one:
    the live updater asks for the chart again when their points arrive)."""
    known = _level_lines(layout, lines, levels, styles, log_y, "level", LEVEL_LABEL)
    several = len(lines) > 1
    pending = [line for line in lines if line.run_id in known and known[line.run_id] is None]
    waiting = [line for line in pending if line.series.steps]
    if waiting:
        who = "" if not several else f" for {', '.join(line.name for line in waiting)}"
        layout["annotations"].append(
            {
                **_annotation(f"{LEVEL_LABEL}: not yet{plot_text(who)}"),
                "x": 0.01,
                "y": 0.97,
                "xanchor": "left",
                "yanchor": "top",
                "font": {"size": 10, "color": MUTED},
            }
        )
    return {"levels": known, "pending": [line.run_id for line in pending]}


START_LABEL = "start"


def _draw_starts(
    layout: Figure, lines: Sequence[RunLine], starts: Mapping[str, float | None], styles: Mapping[str, Style], log_y: bool
) -> Figure:
    """Each run's start (the median of its first entropy values: "entropy far above its
    start" pages at 3× it) as a dotted line across the chart (a shape named `start:<run id>`);
    returns what goes in `layout.meta`: "starts" (run id -> start or None) and
    "pending_start" (the runs without one: the live updater asks for the chart again when
    their points arrive)."""
    known = _level_lines(layout, lines, starts, styles, log_y, "start", START_LABEL, dash="dot", at="start")
    return {"starts": known, "pending_start": [run_id for run_id, start in known.items() if start is None]}


def _band_shape(band: tuple[str, float, float]) -> Figure:
    """A band across the chart from low to high on y, under the lines, labelled inside its
    top left (on a log axis Plotly places a shape by its data values, as on a linear one)."""
    label, low, high = band
    return {
        "name": "band",
        "type": "rect",
        "xref": "paper",
        "yref": "y",
        "x0": 0,
        "x1": 1,
        "y0": low,
        "y1": high,
        "fillcolor": "rgba(21,128,61,0.08)",
        "line": {"width": 1, "dash": "dot", "color": "rgba(21,128,61,0.5)"},
        "layer": "below",
        "label": {
            "text": plot_text(f"healthy: {label} ({low:g}–{high:g})"),
            "textposition": "top left",
            "font": {"size": 10, "color": "rgba(21,128,61,0.9)"},
        },
    }


HAZARD_TITLE = "collapse hazard"
_AXIS_TITLE_CHAR_PX = 6.5
"""About how wide a character of an axis title is (12 px font)."""
_VERTICAL_MARGINS = 84
"""The plot's top and bottom margins (base_layout): what of a chart's height the y axis lacks."""


HAZARD_READS = ("reward/mean", "mismatch/kl", "mismatch/ratio_max", "grad/norm")
"""The metrics the hazard reads most (server/alerts/hazard.py READS): a run without any has none."""


def hazard_figure(
    lines: Sequence[RunLine],
    horizon: int | None,
    height: int = 300,
    render_id: str = "",
    *,
    growing: bool = False,
    reads: Mapping[str, HazardRead] | None = None,
) -> Figure:
    """The runs' collapse hazard (GET /runs/{id}/hazard), one line per run in the run's
    colour and dash as on the metric charts, on a fixed [0, 1] axis, up to the step its
    reward fell (marked: "collapsed at step N", "falling since step N"), with what it does
    not read said. `horizon` None: the server said none (no run known); `growing`: as
    metric_figure's."""
    reads = reads or {}
    unit = f"P(collapse within {horizon} steps)" if horizon is not None else "P(collapse)"
    if len(unit) * _AXIS_TITLE_CHAR_PX > height - _VERTICAL_MARGINS:
        unit = unit.replace(" within ", " within<br>")  # two lines rather than over the title
    layout = base_layout(f"<b>{HAZARD_TITLE}</b>", unit, height, False)
    layout["yaxis"].update(range=[0, 1], autorange=False)
    styles = run_styles(lines)
    traces: list[Figure] = [
        {
            "type": "scatter",
            "mode": "lines",
            "x": list(line.series.steps),
            "y": list(line.series.values),
            "name": plot_text(line.name),
            "line": {"color": styles[line.run_id].colour, "dash": styles[line.run_id].dash, "width": 2},
            "hovertemplate": "%{y:.3f}",
            "meta": {"run": line.run_id, "role": "hazard"},
        }
        for line in lines
    ]
    for line in lines:
        read = reads.get(line.run_id, HazardRead())
        if read.fell_at is not None:
            layout["shapes"].append(_fall_shape(read.fell_at, styles[line.run_id].colour, line.run_id))
            label = read.fall if len(lines) == 1 else f"{line.name}: {read.fall}"
            layout["annotations"].append(_fall_label(read.fell_at, plot_text(label), styles[line.run_id].colour))
    empty = not any(line.series.steps for line in lines)
    if not lines:
        layout["annotations"].append(_annotation("No runs selected"))
    elif empty and not any(reads.get(line.run_id, HazardRead()).fell_at is not None for line in lines):
        layout["annotations"].append(_annotation(_no_hazard_yet(lines, reads)))
    unread = _unread_note(lines, reads)
    if unread:
        layout["annotations"].append({**_annotation(plot_text(unread)), "y": 0.02, "yanchor": "bottom", "font": {"size": 11, "color": MUTED}})
    # A refresh keeps the user's zoom while the same runs are shown.
    layout["uirevision"] = f"hazard|{','.join(sorted(line.run_id for line in lines))}"
    layout["meta"] = {"chart": "hazard", "horizon": horizon, "render_id": render_id, "empty": empty}
    if growing:
        falls = [[read.fell_at] for read in reads.values() if read.fell_at is not None]
        _follow_data(layout, [*(line.series.steps for line in lines), *falls])
    return {"data": traces, "layout": layout}


def _no_hazard_yet(lines: Sequence[RunLine], reads: Mapping[str, HazardRead]) -> str:
    """Why no run has a hazard yet: none logs what it reads, or each is still warming up."""
    blind = [line for line in lines if len(reads.get(line.run_id, HazardRead()).missing) == len(HAZARD_READS)]
    if len(blind) == len(lines):
        return f"No hazard: it reads {', '.join(HAZARD_READS[:-1])} or {HAZARD_READS[-1]}, and {'this run logs' if len(lines) == 1 else 'these runs log'} none of them"
    warmup = max((reads.get(line.run_id, HazardRead()).warmup for line in lines), default=0)
    return f"Warming up — the hazard starts once a run has logged {warmup} steps of what it reads" if warmup else "No hazard yet"


def _unread_note(lines: Sequence[RunLine], reads: Mapping[str, HazardRead]) -> str:
    """A line naming the main metrics a run with a hazard never logged (their features sit at
    the fitted corpus' mean: the hazard reads the others only)."""
    notes = []
    for line in lines:
        missing = reads.get(line.run_id, HazardRead()).missing
        if missing and len(missing) < len(HAZARD_READS):
            notes.append(("" if len(lines) == 1 else f"{line.name}: ") + f"read without {', '.join(missing)} (not logged)")
    return " · ".join(notes)


def _fall_shape(step: int, colour: str, run_id: str) -> Figure:
    return {
        "type": "line", "xref": "x", "yref": "paper", "x0": step, "x1": step, "y0": 0, "y1": 1,
        "line": {"color": colour, "width": 1.5, "dash": "dot"}, "name": f"fall:{run_id}",
    }  # fmt: skip


def _fall_label(step: int, text: str, colour: str) -> Figure:
    return {
        "text": text, "xref": "x", "yref": "paper", "x": step, "y": 0.98, "xanchor": "left", "yanchor": "top",
        "showarrow": False, "font": {"size": 11, "color": colour},
    }  # fmt: skip


def message_figure(text: str, height: int = 300) -> Figure:
    """A blank chart carrying a message (loading, errors, nothing to show), as text."""
    layout = base_layout("", "", height, False)
    layout["xaxis"].update(visible=False)
    layout["yaxis"].update(visible=False)
    layout["annotations"] = [_annotation(plot_text(text))]
    layout["meta"] = {"key": None, "render_id": "", "aggregate": False, "empty": True}
    return {"data": [], "layout": layout}

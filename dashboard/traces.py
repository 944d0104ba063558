"""Trace builders for the metric charts (pure): per-run lines, group bands, markers, alerts.

`dashboard.figures` assembles them into a figure; the `meta` each trace carries
is the contract with the browser's live updater (see figures.py).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from dashboard.series import Alert, Series, as_of, ema, group_band, nonfinite_points
from dashboard.text import plot_text
from dashboard.theme import DASHES, GROUP_PALETTE, INK, SEVERITY_COLOURS

__all__ = [
    "RunLine",
    "HazardRead",
    "Style",
    "run_styles",
    "group_of",
    "run_traces",
    "drawable",
    "group_traces",
    "alert_overlays",
    "charted_runs",
    "ChartedRuns",
    "rollback_shapes",
    "companion_trace",
    "level_shape",
    "EDGE_Y",
    "EDGE_SYMBOL",
    "EDGE_LABEL",
    "LOG_FLOOR",
    "log_floor",
    "zero_label",
]

Figure = dict[str, Any]

# Where non-finite markers (and, on a log axis, values ≤ 0) sit on the overlaid [0, 1]
# axis, and how they look.
EDGE_Y = {"+inf": 0.975, "nan": 0.93, "-inf": 0.025, "zero": 0.045}
EDGE_SYMBOL = {"+inf": "triangle-up", "nan": "x", "-inf": "triangle-down", "zero": "circle-open"}
EDGE_LABEL = {"+inf": "+Inf", "nan": "NaN", "-inf": "−Inf", "zero": "0"}
LOG_FLOOR = 0.1
"""On a log axis a smoothed line is drawn down to LOG_FLOOR × the smallest positive value its
run logged: the EMA of positive values never falls below their minimum, so below that it is
zeros (or negatives) pulling it towards 0, not a measurement; it would dive decades (0.6⁵⁰ ≈
1e-11 after 50 zeros). Those points are gaps; the zeros themselves are edge markers."""
BACKTEST_Y = 0.14
"""Backtest firings' open diamonds: just above the real alerts' (y2 runs 0..1)."""
ALERT_Y = 0.07


@dataclass(frozen=True)
class RunLine:
    """One run's series of the charted metric."""

    run_id: str
    name: str
    group: str | None
    series: Series
    key: str | None = None
    """The metric the line draws when it is not the chart's key (the loss magnitude chart's
    `loss/total` or `loss/pg`, a companion's `response/length_cap`): the live updater appends
    that metric's values to it."""


@dataclass(frozen=True)
class HazardRead:
    """What reads a run's hazard right (GET /runs/{id}/hazard): where its reward fell, the
    hazard's warm-up, and which of its main metrics the run never logged."""

    fell_at: int | None = None
    """The first step of the reward's fall (a lasting one: the hazard, a collapse ahead, stops
    there; one not judged yet: it goes on)."""
    collapsed: bool = False
    """The fall lasted (else it has not regained yet, and is not judged yet)."""
    warmup: int = 0
    missing: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, answer: dict[str, Any]) -> HazardRead:
        collapsed, falling = answer.get("collapsed_at"), answer.get("falling_since")
        return cls(
            fell_at=collapsed if collapsed is not None else falling,
            collapsed=collapsed is not None,
            warmup=int(answer.get("warmup") or 0),
            missing=tuple(answer.get("missing") or ()),
        )

    @property
    def fall(self) -> str | None:
        """"collapsed at step N", "falling since step N", or None."""
        if self.fell_at is None:
            return None
        return f"{'collapsed at' if self.collapsed else 'falling since'} step {self.fell_at}"


@dataclass(frozen=True)
class Style:
    colour: str
    dash: str


def group_of(line: RunLine) -> str:
    """The aggregation key: the run's group, or the run alone when it has none."""
    return line.group if line.group else f"run:{line.run_id}"


def run_styles(lines: Sequence[RunLine]) -> dict[str, Style]:
    """Colour by group (sorted, so a group keeps its colour across pages), dash by seed within it."""
    groups = sorted({group_of(line) for line in lines})
    colour = {g: GROUP_PALETTE[i % len(GROUP_PALETTE)] for i, g in enumerate(groups)}
    styles: dict[str, Style] = {}
    seen: dict[str, int] = {}
    for line in sorted(lines, key=lambda ln: (group_of(ln), ln.name, ln.run_id)):
        g = group_of(line)
        index = seen.get(g, 0)
        seen[g] = index + 1
        styles[line.run_id] = Style(colour[g], DASHES[index % len(DASHES)])
    return styles


def _rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def drawable(value: float | None, log_y: bool) -> bool:
    """Whether the main y axis can place the value: finite, and positive on a log axis."""
    return value is not None and math.isfinite(value) and (value > 0 or not log_y)


def _drawable_or_none(values: Sequence[float | None], log_y: bool) -> list[float | None]:
    # None is a gap. On a log axis Plotly would draw 0 and negatives far below the plot,
    # so each would pull the line down off the bottom edge (a comb) instead of breaking it.
    isfinite = math.isfinite  # drawable() inlined: a 16-run chart has ~50,000 values
    return [v if v is not None and isfinite(v) and (v > 0 or not log_y) else None for v in values]


def log_floor(values: Sequence[float | None]) -> float | None:
    """LOG_FLOOR × the smallest positive finite value, or None when there is none."""
    positive = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return LOG_FLOOR * min(positive) if positive else None


def _smoothed_drawn(values: Sequence[float | None], log_y: bool, floor: float | None) -> list[float | None]:
    """A smoothed line's drawable values; on a log axis the ones below its floor are gaps."""
    drawn = _drawable_or_none(values, log_y)
    if not log_y or floor is None:
        return drawn
    return [v if v is not None and v >= floor else None for v in drawn]


def _line_floor(series: Series) -> float | None:
    return log_floor([*series.values, *(series.mins or ())])


def zero_label(value: float) -> str:
    """The hover text of a value ≤ 0 marked on a log chart's edge (the live updater's too:
    written as JavaScript writes the number, so a point drawn here and one painted live read
    the same)."""
    return "0" if value == 0 else f"{_js_number(value)} (≤ 0)"


def _js_number(value: float) -> str:
    """A finite float as JavaScript's `String(value)` writes it: the shortest digits that read
    back as it (Python's repr has the same digits), in plain notation from 1e-6 up to 1e21 and
    as `1.5e-8` / `1e+21` outside it (repr: `1e-05`, `2.0`, `1e+16`)."""
    if value == 0:
        return "0"
    text = repr(value)
    if 1e-6 <= abs(value) < 1e21:
        plain = format(Decimal(text), "f")
        return plain.rstrip("0").rstrip(".") if "." in plain else plain
    mantissa, _, exponent = text.partition("e")
    return f"{mantissa}e{'+' if int(exponent) > 0 else '-'}{abs(int(exponent))}"


ENVELOPE_POINTS = 250
"""Buckets of a line's min–max band: the band is a translucent area, so half the line's
resolution draws the same picture with half its points, and merging buckets keeps every
spike (the merged max is the largest of the maxima)."""


def _coarser(buckets: list[tuple[int, float, float]], most: int) -> list[tuple[int, float, float]]:
    """At most `most` (step, min, max) buckets: runs of consecutive ones merged, each at its
    last step, with the smallest min and the largest max."""
    if len(buckets) <= most:
        return buckets
    size = -(-len(buckets) // most)
    merged = []
    for start in range(0, len(buckets), size):
        part = buckets[start : start + size]
        merged.append((part[-1][0], min(lo for _, lo, _ in part), max(hi for _, _, hi in part)))
    return merged


def _envelope(line: RunLine, colour: str, log_y: bool) -> Figure | None:
    series = line.series
    if not series.downsampled or series.mins is None or series.maxs is None:
        return None
    kept = []
    for s, value, lo, hi in zip(series.steps, series.values, series.mins, series.maxs, strict=True):
        if not (drawable(lo, False) and drawable(hi, log_y)):
            continue
        if not drawable(lo, log_y):
            # A log axis cannot reach a minimum ≤ 0: the band stops at the bucket's own value.
            lo = value if drawable(value, log_y) else hi
        kept.append((s, lo, hi))
    if not kept:
        return None
    kept = _coarser(kept, ENVELOPE_POINTS)
    steps = [s for s, _, _ in kept]
    return {
        "type": "scatter",
        "x": steps + steps[::-1],
        "y": [hi for _, _, hi in kept] + [lo for _, lo, _ in kept][::-1],
        "fill": "toself",
        "fillcolor": _rgba(colour, 0.13),
        "line": {"width": 0},
        "mode": "lines",
        "hoverinfo": "skip",
        "showlegend": False,
        "legendgroup": line.run_id,
        "name": plot_text(f"{line.name} min–max"),
        "meta": {"run": line.run_id, "role": "envelope"},
    }


def _nonfinite_trace(line: RunLine, colour: str, log_y: bool = False) -> Figure:
    """Markers at the plot edge: non-finite values, and on a log axis the values ≤ 0 (which
    the axis cannot place: gaps in the line, an open circle at the bottom edge, hover "0")."""
    points: list[tuple[int, str, str]] = [(p.step, p.kind, EDGE_LABEL[p.kind]) for p in nonfinite_points(line.series)]
    if log_y:
        points += [
            (step, "zero", zero_label(v))
            for step, v in zip(line.series.steps, line.series.values, strict=True)
            if math.isfinite(v) and v <= 0
        ]
        points.sort(key=lambda p: p[0])
    return {
        "type": "scatter",
        "x": [step for step, _, _ in points],
        "y": [EDGE_Y[kind] for _, kind, _ in points],
        "yaxis": "y2",
        "mode": "markers",
        "marker": {
            "symbol": [EDGE_SYMBOL[kind] for _, kind, _ in points],
            "size": 9,
            "color": colour,
            "line": {"width": 1, "color": INK},
        },
        "text": [text for _, _, text in points],
        # The name comes in as data, never as template text (a run may be called "%{y}").
        "hovertemplate": "%{fullData.name}: %{text}<extra></extra>",
        "showlegend": False,
        "legendgroup": line.run_id,
        "name": plot_text(line.name),
        "meta": {"run": line.run_id, "role": "nonfinite", "last_step": line.series.last_step, **_key_meta(line)},
    }


def _key_meta(line: RunLine) -> Figure:
    return {"key": line.key} if line.key else {}


def run_traces(line: RunLine, style: Style, smoothing: float, log_y: bool) -> list[Figure]:
    series = line.series
    traces: list[Figure] = []
    envelope = _envelope(line, style.colour, log_y)
    if envelope is not None:
        traces.append(envelope)
    smoothed = smoothing > 0
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "x": list(series.steps),
            "y": _drawable_or_none(series.values, log_y),
            "name": plot_text(line.name),
            "legendgroup": line.run_id,
            "showlegend": not smoothed,
            "opacity": 0.28 if smoothed else 1.0,
            "line": {"color": style.colour, "dash": style.dash, "width": 1 if smoothed else 1.8},
            "hovertemplate": "%{y:.4~g}" + ("<extra>raw</extra>" if smoothed else ""),
            "meta": {"run": line.run_id, "role": "raw", "last_step": series.last_step, **_key_meta(line)},
        }
    )
    if smoothed:
        values, state = ema(series.values, smoothing)
        floor = _line_floor(series) if log_y else None
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": list(series.steps),
                "y": _smoothed_drawn(values, log_y, floor),
                "name": plot_text(line.name),
                "legendgroup": line.run_id,
                "line": {"color": style.colour, "dash": style.dash, "width": 2},
                "hovertemplate": "%{y:.4~g}",
                "meta": {
                    "run": line.run_id,
                    "role": "smooth",
                    "last_step": series.last_step,
                    "ema": {"value": state.value, "count": state.count},
                    **({"floor": floor} if log_y else {}),
                    **_key_meta(line),
                },
            }
        )
    traces.append(_nonfinite_trace(line, style.colour, log_y))
    return traces


def group_traces(
    members: Sequence[RunLine],
    style: Style,
    smoothing: float,
    spread: Literal["std", "stderr"],
    log_y: bool,
    running: Collection[str] = (),
) -> list[Figure]:
    """A group's members (thin), its mean ± spread band and its mean. While members are
    `running` and ahead of every other member, the band ends at the slowest of them: at every
    step up to there each running member has said its value, and the page extends the band
    from there as their points come (assets/live/charts.js), with what each member's meta
    carries (its smoothing state, its value as of the band's end, its points after it); the
    mean's meta names those running members ("running"). Otherwise (nothing running, or a
    member that stopped ahead of a running one: a seed restarted beside finished ones) the
    band spans every step, "running" is empty, and the page asks the server to draw it again
    when a member's points come."""
    group = members[0].group or members[0].name
    curves = []
    traces: list[Figure] = []
    live = [line.series.steps[-1] for line in members if line.run_id in running and line.series.steps]
    end = min(live) if live else None
    if end is not None and any(line.series.steps[-1] > end for line in members if line.run_id not in running and line.series.steps):
        end = None
    extending = [line.run_id for line in members if line.run_id in running] if end is not None else []
    floors = []
    for line in members:
        steps, state = line.series.steps, None
        if smoothing > 0:
            values, state = ema(line.series.values, smoothing)
        else:
            values = list(line.series.values)
        curves.append((steps, values))
        band_end = end if end is not None else steps[-1] if steps else 0  # no steps: nothing as of it, no tail
        counted = _drawable_or_none(values, False)  # what a band counts: the finite values
        meta: Figure = {
            "run": line.run_id, "role": "member", "last_step": line.series.last_step, **_key_meta(line),
            "first_step": steps[0] if steps else None,
            "asof": as_of(steps, counted, band_end),
            "tail": [[step, value] for step, value in zip(steps, counted, strict=True) if step > band_end],
        }  # fmt: skip
        if state is not None:
            meta["ema"] = {"value": state.value, "count": state.count}
        line_floor = _line_floor(line.series) if log_y else None
        if log_y:
            meta["floor"] = line_floor
            floors.append(line_floor)
        if smoothing > 0:
            values = _smoothed_drawn(values, log_y, line_floor)
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": list(line.series.steps),
                "y": _drawable_or_none(values, log_y),
                "name": plot_text(line.name),
                "legendgroup": f"group:{group}",
                "showlegend": False,
                "opacity": 0.25,
                "line": {"color": style.colour, "width": 1},
                "hoverinfo": "skip",
                "meta": meta,
            }
        )
    floor = min((f for f in floors if f is not None), default=None)
    band = group_band(curves, spread=spread, end=end)
    mean = _smoothed_drawn(band.mean, log_y, floor)
    upper = _smoothed_drawn(band.upper, log_y, floor)
    # On a log axis a band reaching 0 or below is cut at the mean (its lower half cannot show).
    lower = [lo if drawable(lo, log_y) else mu for lo, mu in zip(band.lower, mean, strict=True)]
    label = plot_text(f"{group} (n={len(members)})")
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "x": band.steps + band.steps[::-1],
            "y": upper + lower[::-1],
            "fill": "toself",
            "fillcolor": _rgba(style.colour, 0.2),
            "line": {"width": 0},
            "hoverinfo": "skip",
            "showlegend": False,
            "legendgroup": f"group:{group}",
            "name": f"{label} ± {spread}",
            "meta": {"group": group, "role": "band", "points": len(band.steps)},
        }
    )
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "x": band.steps,
            "y": mean,
            "customdata": band.count,
            "name": label,
            "legendgroup": f"group:{group}",
            "line": {"color": style.colour, "width": 2.2},
            "hovertemplate": "%{y:.4~g} (n=%{customdata})",
            "meta": {
                "group": group, "role": "mean", "members": [line.run_id for line in members], "spread": spread,
                "running": extending,
                "last_step": band.steps[-1] if band.steps else None, "floor": floor,
            },  # fmt: skip
        }
    )
    traces.extend(_nonfinite_trace(line, style.colour, log_y) for line in members)
    return traces


def companion_trace(line: RunLine, style: Style, log_y: bool) -> Figure:
    """A metric drawn beside a run's line (its length cap beside its length): a thin dashed
    line in the run's colour, unsmoothed, a step function (the value holds until the next)."""
    return {
        "type": "scatter",
        "mode": "lines",
        "x": list(line.series.steps),
        "y": _drawable_or_none(line.series.values, log_y),
        "name": plot_text(f"{line.name} {line.key or ''}".strip()),
        "legendgroup": line.run_id,
        "showlegend": False,
        "opacity": 0.8,
        "line": {"color": style.colour, "dash": "dash", "width": 1.2, "shape": "hv"},
        "hovertemplate": "%{y:.4~g}<extra>" + plot_text(line.key or "") + "</extra>",
        "meta": {"run": line.run_id, "role": "companion", "last_step": line.series.last_step, **_key_meta(line)},
    }


def level_shape(level: float, name: str, style: Style, label: str, dash: str = "dash", at: str = "end") -> Figure:
    """A run's reference level across the whole chart (its learned entropy: dashed, labelled at
    its right end; its start: dotted, labelled at its left, `at` "start"), in the run's colour."""
    return {
        "name": name,
        "type": "line",
        "xref": "paper",
        "yref": "y",
        "x0": 0,
        "x1": 1,
        "y0": level,
        "y1": level,
        "line": {"color": style.colour, "dash": dash, "width": 1.5},
        "layer": "below",
        "label": {
            "text": plot_text(label),
            "textposition": at,
            "yanchor": "bottom",
            "font": {"size": 10, "color": style.colour},
        },
    }


def rollback_shapes(lines: Sequence[RunLine], rollbacks: Mapping[str, Sequence[int]], styles: Mapping[str, Style]) -> list[Figure]:
    """A guard's rollbacks (`guard/rollback`, learners/lm/guard.py) as a dotted line across the
    chart at each step one happened, in its run's colour: where the weights went back."""
    return [
        {
            "name": f"rollback:{line.run_id}", "type": "line", "xref": "x", "yref": "paper", "x0": step, "x1": step,
            "y0": 0, "y1": 1, "layer": "below", "line": {"color": styles[line.run_id].colour, "width": 1.5, "dash": "dashdot"},
        }  # fmt: skip
        for line in lines
        if line.run_id in styles
        for step in rollbacks.get(line.run_id, ())
    ]


ChartedRuns = Mapping[str, tuple[str, int | None]]
"""The runs a chart draws: each run's name and the last step drawn, by run id."""


def charted_runs(lines: Sequence[RunLine]) -> ChartedRuns:
    """The runs of a chart's lines, as `alert_overlays` reads them."""
    return {line.run_id: (line.name, line.series.last_step) for line in lines}


def alert_overlays(
    key: str | Sequence[str], runs: ChartedRuns, alerts: Sequence[Alert], backtest: Sequence[Alert] = ()
) -> tuple[list[Figure], list[Figure]]:
    """Each alert's range as a shaded band and its start as a diamond on the chart's top edge;
    `backtest` firings (where a rule would have fired) as open diamonds and outlined bands,
    in a trace of their own. `key`: the metric the chart draws, or the metrics (an alert on
    any of them belongs on it). The live alerts' shapes are named `firing:<run id>` or
    `resolved`, their trace's meta.role is "alerts": what the browser replaces when the
    alerts change and the series do not (`alert_marks`)."""
    keys = [key] if isinstance(key, str) else list(key)
    shapes: list[Figure] = []
    traces: list[Figure] = []
    for group, replayed in ((alerts, False), (backtest, True)):
        group_shapes, trace = _alert_marks(keys, runs, group, backtest=replayed)
        shapes += group_shapes
        if trace is not None:
            traces.append(trace)
    return shapes, traces


def _alert_marks(
    keys: Sequence[str], runs: ChartedRuns, alerts: Sequence[Alert], *, backtest: bool
) -> tuple[list[Figure], Figure | None]:
    names = {run_id: name for run_id, (name, _) in runs.items()}
    last = {run_id: step for run_id, (_, step) in runs.items()}
    shapes: list[Figure] = []
    xs: list[int] = []
    texts: list[str] = []
    colours: list[str] = []
    for alert in alerts:
        if alert.state == "pending" or not any(alert.on_chart(key) for key in keys) or alert.run_id not in names:
            continue
        if alert.started_step is None:
            continue
        colour = SEVERITY_COLOURS.get(alert.severity, SEVERITY_COLOURS["warning"])
        end = alert.resolved_step
        if end is None:
            end = max(alert.started_step, last[alert.run_id] or alert.started_step)
        if backtest:
            name = "backtest"
            fill, outline = "rgba(0,0,0,0)", {"width": 1, "dash": "dot", "color": _rgba(colour, 0.6)}
            until = "still firing at the last step" if alert.resolved_step is None else f"resolved at {alert.resolved_step}"
            head = f"{plot_text(f'backtest · {alert.severity} · {alert.rule}')} would fire ({until})"
        else:
            # A firing range is named after its run: the live updater stretches it with the
            # points it appends (assets/live/).
            name = f"firing:{alert.run_id}" if alert.resolved_step is None else "resolved"
            fill, outline = _rgba(colour, 0.06), {"width": 0}
            state = "firing" if alert.resolved_step is None else f"resolved at {alert.resolved_step}"
            head = plot_text(f"{alert.severity} · {alert.rule} · {names[alert.run_id]} ({state})")
        shapes.append(
            {
                "name": name,
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": alert.started_step,
                "x1": end,
                "y0": 0,
                "y1": 1,
                "fillcolor": fill,
                "line": outline,
                "layer": "below",
            }
        )
        xs.append(alert.started_step)
        colours.append(colour)
        texts.append(f"{head}<br>{plot_text(alert.message)}")
    if not xs:
        return shapes, None
    marker_trace = {
        "type": "scatter",
        "x": xs,
        "y": [BACKTEST_Y if backtest else ALERT_Y] * len(xs),
        "yaxis": "y2",
        "mode": "markers",
        "marker": (
            {"symbol": "diamond-open", "size": 11, "color": colours, "line": {"width": 2, "color": colours}}
            if backtest
            else {"symbol": "diamond", "size": 10, "color": colours, "line": {"width": 1, "color": "#fff"}}
        ),
        "text": texts,
        "hovertemplate": "%{text}<extra>" + ("backtest" if backtest else "alert") + "</extra>",
        "showlegend": False,
        "name": "backtest" if backtest else "alerts",
        "meta": {"role": "backtest" if backtest else "alerts"},
    }
    return shapes, marker_trace

"""Figures of a run's step details (pure): the heatmap of ℓ over steps with its tail quantiles,
and each sequence's Σℓ against its length with the least-squares line.

`layout.meta` carries what the page and its tests read back: {"chart": "distribution", "key",
"edges", "first_bin", "steps", "bucketed", "render_id"} and {"chart": "sequences", "fit",
"steps", "render_id"}.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.distributions import (
    QUANTILES,
    histogram_quantile,
    occupied_bins,
    shares,
    signed_log_ticks,
)
from dashboard.figures import base_layout
from dashboard.theme import INK, SEVERITY_COLOURS
from dashboard.traces import EDGE_SYMBOL, EDGE_Y
from wire import read_value

__all__ = [
    "Distribution",
    "distribution_figure",
    "sequences_figure",
    "edge_label",
    "quantile_label",
    "fit_text",
    "LOG_SHARE_FLOOR",
]

Figure = dict[str, Any]

LOG_SHARE_FLOOR = -8
"""The colour scale stops at 10⁻⁸ of a step's tokens: one token in a hundred million."""
# Light to dark, so empty bins (no colour) read as nothing and the bulk as the darkest.
HEAT_COLOURS = [[0.0, "#e8f1fa"], [0.35, "#9ecae1"], [0.65, "#3182bd"], [1.0, "#08306b"]]
QUANTILE_COLOUR = "#D55E00"
STEP_COLOURS = "Viridis"


@dataclass(frozen=True)
class Distribution:
    """A histogram per step, as GET /runs/{id}/distributions answers."""

    key: str
    edges: list[float]
    steps: list[int]
    counts: list[list[int]]
    bucketed: bool = False
    left_out: int = 0
    nans: list[int] | None = None
    """Tokens whose ℓ was NaN, per step (counted in no bin)."""

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> Distribution:
        return cls(
            key=str(payload.get("key", "")),
            edges=[float(e) for e in payload.get("edges") or []],
            steps=[int(s) for s in payload.get("steps") or []],
            counts=[[int(c) for c in counts] for counts in payload.get("counts") or []],
            bucketed=bool(payload.get("bucketed")),
            left_out=int(payload.get("left_out") or 0),
            nans=[int(n) for n in payload["nan"]] if isinstance(payload.get("nan"), list) else None,
        )

    @property
    def empty(self) -> bool:
        return not self.edges or not self.steps


def edge_label(value: float) -> str:
    """An edge as a tick label: 0, 0.01, −1, 1e-5."""
    text = f"{value:.3g}".replace("e-0", "e-").replace("e+0", "e")
    return text.replace("-", "−") if value < 0 else text


def quantile_label(q: float) -> str:
    """0.999 -> "p99.9"."""
    return f"p{q * 100:g}"


def _log_share(share: float) -> float | None:
    # Three decimals of log10: 0.2 % of the share, more than any colour shows.
    return round(math.log10(share), 3) if share > 0 else None


def _superscript(exponent: int) -> str:
    return "10" + str(exponent).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


def distribution_figure(
    dist: Distribution,
    *,
    title: str,
    totals: Sequence[float] | None = None,
    height: int = 360,
    render_id: str = "",
    x_range: tuple[float, float] | None = None,
) -> Figure:
    """The share of each step's tokens in each bin as a heatmap (log colour), one row per bin
    of the occupied range, with the tail quantiles (QUANTILES) as lines. `totals`: each step's
    token count to share by (the all-token histogram's, for a subset such as the unbounded
    tokens); each step's own sum by default."""
    layout = base_layout(title, "ℓ = log π − log μ", height, False)
    layout["hovermode"] = "closest"
    layout["margin"] = {**layout["margin"], "r": 8}
    rows = occupied_bins(dist.counts)
    if dist.empty or rows is None:
        return {"data": [], "layout": layout}
    low, high = rows
    z_by_step = []
    for index, counts in enumerate(dist.counts):
        total = totals[index] if totals is not None else None
        z_by_step.append([_log_share(share) for share in shares(counts, total)[low : high + 1]])
    z = [list(row) for row in zip(*z_by_step, strict=True)]  # rows = bins, columns = steps
    drawn = [v for row in z for v in row if v is not None]
    z_max = max(drawn) if drawn else 0.0
    z_min = max(min(drawn) if drawn else LOG_SHARE_FLOOR, LOG_SHARE_FLOOR)
    z_min = min(z_min, z_max - 1)
    colour_ticks = list(range(math.ceil(z_min), math.floor(z_max) + 1))
    traces: list[Figure] = [
        {
            "type": "heatmap",
            "x": list(dist.steps),
            "y": list(range(low, high + 2)),  # n + 1 values: the rows' boundaries, in bin units
            "z": z,
            "zmin": z_min,
            "zmax": z_max,
            "colorscale": HEAT_COLOURS,
            "hoverongaps": False,
            "hovertemplate": "step %{x}<br>share of the step's tokens: 10^%{z:.2f}<extra></extra>",
            "colorbar": {
                "title": {"text": "share", "side": "right"},
                "tickvals": colour_ticks,
                "ticktext": [_superscript(t) for t in colour_ticks],
                "thickness": 10,
                "len": 0.9,
                "outlinewidth": 0,
            },
            "meta": {"role": "heatmap"},
        }
    ]
    for q in QUANTILES:
        found = [histogram_quantile(dist.edges, counts, q) for counts in dist.counts]
        outer = q < 0.005 or q > 0.995
        name = quantile_label(q)
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": list(dist.steps),
                "y": [None if f is None else round(f.position, 3) for f in found],
                "customdata": [None if f is None else float(f"{f.value:.4g}") for f in found],
                "name": name,
                "line": {"color": QUANTILE_COLOUR, "width": 1.2 if outer else 1.8, "dash": "dot" if outer else "solid"},
                "hovertemplate": f"{name} of ℓ: %{{customdata:.4g}}<extra>step %{{x}}</extra>",
                "meta": {"role": "quantile", "q": q},
            }
        )
    nan_steps = [(step, n) for step, n in zip(dist.steps, dist.nans or [], strict=False) if n > 0]
    if nan_steps:
        # NaN ℓ is in no bin: a ✕ on the top edge (as on the metric charts), never dropped.
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": [step for step, _ in nan_steps],
                "y": [EDGE_Y["nan"]] * len(nan_steps),
                "yaxis": "y2",
                "customdata": [n for _, n in nan_steps],
                "marker": {"symbol": EDGE_SYMBOL["nan"], "size": 9, "color": SEVERITY_COLOURS["critical"]},
                "hovertemplate": "step %{x}: %{customdata} tokens with NaN ℓ<extra></extra>",
                "name": "NaN ℓ",
                "meta": {"role": "nonfinite"},
            }
        )
    ticks = signed_log_ticks(dist.edges, low, high + 1)
    layout["yaxis"].update(
        range=[low, high + 1],
        autorange=False,
        tickvals=ticks,
        ticktext=[edge_label(dist.edges[i]) for i in ticks],
        zeroline=False,
    )
    if x_range is not None:
        layout["xaxis"].update(range=list(x_range), autorange=False)
    layout["uirevision"] = f"distribution|{dist.key}"
    layout["meta"] = {
        "chart": "distribution",
        "key": dist.key,
        "edges": list(dist.edges),
        "first_bin": low,
        "steps": list(dist.steps),
        "bucketed": dist.bucketed,
        "render_id": render_id,
    }
    return {"data": traces, "layout": layout}


def sequences_figure(
    payload: dict[str, Any], *, title: str, height: int = 360, render_id: str = ""
) -> Figure:
    """Σℓ of each sequence against its length (coloured by step), with the least-squares line
    the server fitted (GET /runs/{id}/sequences)."""
    layout = base_layout(title, "Σℓ of the sequence", height, False)
    layout["hovermode"] = "closest"
    layout["xaxis"]["title"] = {"text": "length (tokens)", "standoff": 4}
    lengths = [float(n) for n in payload.get("length") or []]
    sums = [_number(s) for s in payload.get("log_ratio") or []]
    steps = [int(s) for s in payload.get("steps") or []]
    finite = [(n, s, step) for n, s, step in zip(lengths, sums, steps, strict=False) if math.isfinite(s)]
    traces: list[Figure] = [
        {
            "type": "scattergl" if len(finite) > 2000 else "scatter",
            "mode": "markers",
            "x": [n for n, _, _ in finite],
            "y": [float(f"{s:.4g}") for _, s, _ in finite],
            "customdata": [step for _, _, step in finite],
            "marker": {
                "size": 5,
                "opacity": 0.6,
                "color": [step for _, _, step in finite],
                "colorscale": STEP_COLOURS,
                "showscale": len({step for _, _, step in finite}) > 1,
                "colorbar": {"title": {"text": "step", "side": "right"}, "thickness": 10, "len": 0.9, "outlinewidth": 0},
            },
            "name": "sequences",
            "hovertemplate": "length %{x}<br>Σℓ %{y:.4g}<br>step %{customdata}<extra></extra>",
            "meta": {"role": "sequences"},
        }
    ]
    fit = payload.get("fit")
    if fit and finite:
        slope = float(fit["slope_per_1k"]) / 1000
        intercept = float(fit["intercept"])
        xs = [min(n for n, _, _ in finite), max(n for n, _, _ in finite)]
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": xs,
                "y": [intercept + slope * x for x in xs],
                "name": "least squares",
                "line": {"color": INK, "width": 2, "dash": "dash"},
                "hovertemplate": f"{fit_text(fit)}<extra></extra>",
                "meta": {"role": "fit"},
            }
        )
        layout["annotations"].append(_corner_note(fit_text(fit), background="rgba(255,255,255,0.8)"))
    elif finite:
        layout["annotations"].append(_corner_note("no slope: the sequences shown all have the same length"))
    layout["uirevision"] = "sequences"
    layout["meta"] = {"chart": "sequences", "fit": fit, "steps": sorted(set(steps)), "render_id": render_id}
    return {"data": traces, "layout": layout}


def _corner_note(text: str, *, background: str | None = None) -> Figure:
    """A note in the plot's top-left corner (the fit, or why there is none)."""
    note: Figure = {
        "text": text,
        "xref": "paper",
        "yref": "paper",
        "x": 0.01,
        "y": 0.98,
        "xanchor": "left",
        "yanchor": "top",
        "showarrow": False,
        "font": {"size": 12, "color": INK},
    }
    if background is not None:
        note["bgcolor"] = background
    return note


def fit_text(fit: dict[str, Any]) -> str:
    """The fitted slope as the page prints it: "Σℓ slope: −1.01 per 1,000 tokens (n = 812)"."""
    slope = float(fit["slope_per_1k"])
    sign = "−" if slope < 0 else "+"
    return f"Σℓ slope: {sign}{abs(slope):.3g} per 1,000 tokens (n = {int(fit['n']):,})"


def _number(raw: Any) -> float:
    value = read_value(raw)
    return math.nan if value is None else value


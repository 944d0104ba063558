"""The parity view's figures (views/parity.py): two sides' `mismatch/log_ratio` histograms
overlaid, their difference per bin, and their tails over steps. Pure: counts and points in,
Plotly figure (a plain dict) out.

A side is one run or one group of runs (its runs' histograms summed). The histograms are drawn
as shares of the side's tokens, so sides with different token counts compare. The x axis is
the histogram's bins, one unit each, labelled with their edges (the edges are signed-log: ℓ
spans ±10⁻⁴ … ±10 in bins of equal width on the page, as on the run page's heatmap).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.distributions import occupied_bins, shares, signed_log_ticks
from dashboard.figures import base_layout, message_figure
from dashboard.text import plot_text
from dashboard.theme import GROUP_PALETTE, MUTED

__all__ = ["SIDE_COLOURS", "HistogramSide", "TailLine", "summed", "overlay_figure", "difference_figure", "tails_figure"]

Figure = dict[str, Any]

SIDE_COLOURS = {"a": GROUP_PALETTE[0], "b": GROUP_PALETTE[1]}
"""A is the reference (blue), B the one compared with it (vermillion), on every parity chart."""


@dataclass(frozen=True)
class HistogramSide:
    label: str
    """What the legend calls it: "A: <run or group>"."""
    colour: str
    counts: list[int]
    """Tokens per bin, summed over the side's steps (and runs)."""


@dataclass(frozen=True)
class TailLine:
    label: str
    colour: str
    dash: str
    """"solid" for both tails (|ℓ| ≥ 1), "dot" for the low tail (ℓ ≤ −1)."""
    steps: list[int]
    values: list[float]


def summed(counts_per_step: Sequence[Sequence[int]], bins: int) -> list[int]:
    """Each bin's count over every step (zeros when there is no step)."""
    total = [0] * bins
    for counts in counts_per_step:
        for index, count in enumerate(counts):
            total[index] += count
    return total


def _bin_axis(edges: Sequence[float], low: int, high: int) -> Figure:
    """Bins low..high at x = their index; edge i (bin i's lower edge) at i − 0.5."""
    ticks = signed_log_ticks(edges, low, high + 1)
    return {
        "tickvals": [index - 0.5 for index in ticks],
        "ticktext": [f"{edges[index]:g}" for index in ticks],
        "range": [low - 0.5, high + 0.5],
        "title": {"text": "ℓ = log π − log μ (bins)", "standoff": 4},
    }


def _bin_hover(edges: Sequence[float], low: int, high: int) -> list[str]:
    return [f"[{edges[i]:.3g}, {edges[i + 1]:.3g})" for i in range(low, high + 1)]


def _occupied(sides: Sequence[HistogramSide]) -> tuple[int, int] | None:
    return occupied_bins([side.counts for side in sides])


def overlay_figure(edges: Sequence[float], sides: Sequence[HistogramSide], height: int = 300) -> Figure:
    """Both sides' histograms as shares of their tokens, overlaid on a log axis (the tails are
    a thousandth of the bulk)."""
    span = _occupied(sides)
    if span is None or len(edges) < 2:
        return message_figure("No mismatch/log_ratio histograms in the range", height)
    low, high = span
    layout = base_layout("<b>ℓ distribution</b>", "share of the side's tokens", height, True)
    layout["xaxis"].update(_bin_axis(edges, low, high))
    layout.update(barmode="overlay", bargap=0, showlegend=True, hovermode="x unified")
    layout["legend"] = {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"}
    traces = []
    for side in sides:
        side_shares = shares(side.counts)
        traces.append({
            "type": "bar",
            "x": list(range(low, high + 1)),
            "y": [side_shares[i] if side.counts[i] else None for i in range(low, high + 1)],
            "name": plot_text(side.label),
            "marker": {"color": side.colour, "opacity": 0.45, "line": {"color": side.colour, "width": 1}},
            "customdata": _bin_hover(edges, low, high),
            "hovertemplate": "ℓ in %{customdata}: %{y:.3g}",
        })  # fmt: skip
    layout["meta"] = {
        "chart": "parity-overlay",
        "first_bin": low,
        "totals": [sum(side.counts) for side in sides],
        "counts": [side.counts[low : high + 1] for side in sides],
    }
    return {"data": traces, "layout": layout}


def difference_figure(edges: Sequence[float], a: HistogramSide, b: HistogramSide, height: int = 300) -> Figure:
    """B's share minus A's, per bin: where B has more tokens than A (up) and fewer (down)."""
    span = _occupied((a, b))
    if span is None or len(edges) < 2:
        return message_figure("No mismatch/log_ratio histograms in the range", height)
    low, high = span
    share_a, share_b = shares(a.counts), shares(b.counts)
    difference = [share_b[i] - share_a[i] for i in range(low, high + 1)]
    layout = base_layout("<b>difference per bin</b>  (B − A)", "share of tokens, B − A", height, False)
    layout["xaxis"].update(_bin_axis(edges, low, high))
    layout["yaxis"].update(zeroline=True, zerolinecolor=MUTED)
    layout["bargap"] = 0
    traces = [{
        "type": "bar",
        "x": list(range(low, high + 1)),
        "y": difference,
        "marker": {"color": [b.colour if value > 0 else a.colour for value in difference]},
        "customdata": _bin_hover(edges, low, high),
        "hovertemplate": "ℓ in %{customdata}: B − A = %{y:.3g}<extra></extra>",
    }]  # fmt: skip
    layout["meta"] = {"chart": "parity-difference", "first_bin": low, "difference": difference}
    return {"data": traces, "layout": layout}


def tails_figure(lines: Sequence[TailLine], height: int = 300) -> Figure:
    """The tails per step of each run of both sides: |ℓ| ≥ 1 (`mismatch/tail_frac`, solid)
    and ℓ ≤ −1 (`mismatch/low_tail_frac`, dotted), on a log axis (a step with no token in a
    tail is a gap)."""
    if not any(line.steps for line in lines):
        return message_figure("No mismatch/tail_frac or mismatch/low_tail_frac in the range", height)
    layout = base_layout(
        "<b>tails over steps</b>  <span style='font-size:11px'>|ℓ| ≥ 1 solid, ℓ ≤ −1 dotted</span>",
        "fraction of tokens", height, True,
    )  # fmt: skip
    # Under the plot: a group's runs make more entries than fit beside the title.
    layout.update(showlegend=True)
    layout["margin"]["b"] = 88
    layout["legend"] = {"orientation": "h", "x": 0, "y": -0.28, "yanchor": "top", "font": {"size": 11}}
    traces = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "x": line.steps,
            "y": [value if math.isfinite(value) and value > 0 else None for value in line.values],
            "name": plot_text(line.label),
            "line": {"color": line.colour, "dash": line.dash, "width": 1.5},
            "marker": {"size": 3},
            "hovertemplate": "%{y:.3g}",
        }
        for line in lines
    ]
    layout["meta"] = {"chart": "parity-tails", "lines": [line.label for line in lines]}
    return {"data": traces, "layout": layout}

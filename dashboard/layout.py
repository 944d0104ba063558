"""Layout pieces shared by the pages: shell, chart controls, graphs, badges, empty states."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

from dash import dcc, html, no_update
from plotly.io.json import to_json_plotly

from dashboard.figures import message_figure
from dashboard.theme import HAZARD_HEALTHY, HEALTHY, KL_BANDS

__all__ = [
    "GRAPH_TYPE",
    "ZOOM_TYPE",
    "ALERT_MARKS",
    "SEEN_TYPE",
    "INITIAL_SMOOTHING",
    "ALERT_TOKENS_TYPE",
    "shell",
    "chart_controls",
    "metric_graph",
    "hazard_graph",
    "HAZARD_GRAPH",
    "badge",
    "display_status",
    "empty_state",
    "page_state",
    "live_target",
    "changed_only",
    "data_attributes",
    "tick_reasons",
    "GRID_COLUMN_DEFAULTS",
    "radio",
    "digest",
    "whole_name",
]

GRID_COLUMN_DEFAULTS = {"sortable": True, "resizable": True, "wrapHeaderText": True, "autoHeaderHeight": True}
"""Every column of the dashboard's tables (the runs table, the compare summary): sortable,
resizable, its header wrapped over lines rather than cut."""

GRAPH_TYPE = "metric-graph"
"""Pattern-matching id type of every metric chart: {"type": GRAPH_TYPE, "key": <metric key>}."""
ZOOM_TYPE = "metric-zoom"
"""The store beside each chart holding its last x-axis relayout (a zoom or a reset)."""
INITIAL_SMOOTHING = 0.6
"""The smoothing slider's value when a page opens (the EMA weight of the first figures)."""
SEEN_TYPE = "metric-seen"
"""The store beside each chart that the browser sets once the chart comes near the view
(assets/live/start.js): a chart's figure is fetched only then, so charts far below the
fold cost neither the server nor the page anything until scrolled to. The live updater sets
it again ({"reason", "t"}) to have that one chart drawn again (assets/live/socket.js,
`redrawChart`)."""
ALERT_MARKS = "alert-marks"
"""The store of the live alerts' marks of every chart on the page ({"read": server time,
"charts": {key: figures.alert_marks}}), written on an alert tick: the charts take them in
without reading their series again."""
ALERT_TOKENS_TYPE = "alert-tokens"
"""The "tokens" button of an alert in the run page's alerts table:
{"type": ALERT_TOKENS_TYPE, "alert": <id>, "step": <its first step>} (views/token_view.py)."""
HAZARD_GRAPH = "hazard-graph"
"""Id (and class) of the collapse hazard chart. Not a `keel-graph`: the live updater does not
append to it; the server redraws it on the pages' data ticks (views/charts.py)."""

STATUS_LABELS = {
    "running": "live",
    "finished": "finished",
    "failed": "failed",
    "killed": "failed",
    "silent": "silent",
}


def display_status(status: str) -> str:
    """The four states a researcher cares about: live, finished, failed, silent."""
    return STATUS_LABELS.get(status, status)


def data_attributes(**attributes: str) -> dict[str, Any]:
    """data-* attributes for a Dash html component (read by the live updater (assets/live/) and CSS)."""
    return {f"data-{name.replace('_', '-')}": value for name, value in attributes.items()}


def tick_reasons(tick: dict[str, Any] | None) -> set[str]:
    """Why the browser bumped a live-tick or live-data-tick store (assets/live/socket.js):
    every reason asked for while its refresh waited."""
    return set((tick or {}).get("reasons") or [(tick or {}).get("reason")])


def shell(page: Any = None, built_for: str | None = None) -> html.Div:
    """The page frame: header with navigation and live indicator, routed content below:
    `page`, already built for the URL `built_for` (path and query), or filled by the router."""
    return html.Div(
        [
            dcc.Location(id="url", refresh="callback-nav"),
            dcc.Store(id="page-built-for", data=built_for),
            dcc.Store(id="live-tick"),
            dcc.Store(id="live-data-tick"),
            # The live alerts' marks of every chart drawn, read on an alert tick
            # (views/charts.py); the browser puts them on the charts (assets/charts.js).
            dcc.Store(id=ALERT_MARKS),
            dcc.Store(id="alert-marks-drawn"),  # written by nothing: keel_charts.alert_marks's output
            dcc.Store(id="backtest-firings"),  # {"run_id", "firings"}: the run page's last backtest
            html.Header(
                [
                    html.A(
                        ["Keel", html.Span("RL stability monitor")],
                        href="/",
                        className="keel-brand",
                    ),
                    html.Nav(
                        [dcc.Link("Runs", href="/"), dcc.Link("Compare", href="/compare")],
                        className="keel-nav",
                    ),
                    html.Div(className="spacer"),
                    html.Span(id="live-indicator", **data_attributes(state="off")),
                    html.A("API docs", href="/docs", className="docs-link"),
                ],
                className="keel-header",
            ),
            html.Main(page, id="page", className="keel-page"),
        ]
    )


def page_state(page: str, runs: list[str], height: int) -> dcc.Store:
    """What the chart callbacks need to know about the page they draw on."""
    return dcc.Store(id="page-state", data={"page": page, "runs": runs, "height": height})


def live_target(runs: list[str] | str) -> html.Div:
    """Tells the live updater (assets/live/) which runs to subscribe to ("*" for all)."""
    target = runs if isinstance(runs, str) else ",".join(runs)
    return html.Div(id="live-target", hidden=True, **data_attributes(live_runs=target))


def _field(caption: str, control: Any, class_name: str = "field", **style: Any) -> html.Div:
    return html.Div(
        [html.Label(caption, className="caption"), control],
        className=class_name,
        style=style or None,
    )


def radio(component_id: str, labels: dict[str, str]) -> dcc.RadioItems:
    """Inline radio buttons: value -> label, the first one selected."""
    return dcc.RadioItems(
        id=component_id,
        options=[{"label": label, "value": value} for value, label in labels.items()],
        value=next(iter(labels)),
        className="radio-inline",
    )


def chart_controls(*, aggregate: bool, extra_metrics: bool) -> html.Div:
    """Smoothing, aggregation, y scale, the KL chart's healthy band (every chart page has these
    ids) and extra metrics."""
    controls = html.Div(
        [
            _field(
                "Smoothing (EMA)",
                dcc.Slider(
                    id="opt-smoothing",
                    min=0,
                    max=0.99,
                    step=0.01,
                    value=INITIAL_SMOOTHING,
                    marks={0: "off", 0.3: "0.3", 0.6: "0.6", 0.9: "0.9"},
                    tooltip={"placement": "bottom", "always_visible": False},
                    updatemode="mouseup",
                ),
                "field slider",
            ),
            _field(
                "Show",
                radio(
                    "opt-aggregate",
                    {
                        "runs": "each run",
                        "std": "group mean ± std",
                        "stderr": "group mean ± stderr",
                    },
                ),
                display=None if aggregate else "none",
            ),
            _field(
                "Y scale",
                radio("opt-yscale", {"auto": "auto", "linear": "linear", "log": "log"}),
            ),
            _field(
                "KL healthy band",
                radio(
                    "opt-kl-band",
                    {"none": "none"} | {kind: f"{label} {low:g}–{high:g}" for kind, (label, low, high) in KL_BANDS.items()},
                ),
            ),
        ],
        className="toolbar panel",
    )
    if extra_metrics:
        controls.children.append(
            _field(
                "Add metrics",
                dcc.Dropdown(id="opt-metrics", multi=True, placeholder="any other logged metric…"),
                "field wide",
            )
        )
    return controls


def metric_graph(key: str, height: int, figure: dict[str, Any] | None = None) -> html.Div:
    """A chart card of `key`: "Loading…" until the browser says it is near the view and its
    figure comes (views/charts.py), or drawn with `figure` at once (marked seen: the browser
    does not ask for it again)."""
    return html.Div(
        [
            dcc.Store(id={"type": ZOOM_TYPE, "key": key}),
            dcc.Store(id={"type": SEEN_TYPE, "key": key}, data=True if figure is not None else None),
            dcc.Graph(
                id={"type": GRAPH_TYPE, "key": key},
                figure=figure if figure is not None else message_figure("Loading…", height),
                className="keel-graph",
                style={"height": f"{height}px"},
                config={
                    "displaylogo": False,
                    "responsive": True,
                    # Few buttons, so the bar does not cover the chart title.
                    "modeBarButtons": [["toImage", "zoom2d", "pan2d", "resetScale2d"]],
                    "toImageButtonOptions": {
                        "format": "png",
                        "scale": 2,
                        "filename": "_".join(re.findall(r"[\w.-]+", key)) or "chart",
                    },
                },
            ),
            *_caption(HEALTHY.get(key)),
        ],
        className="chart-card",
        **data_attributes(key=key, **({"seen": "drawn"} if figure is not None else {})),
    )


def _caption(text: str | None) -> list[html.P]:
    """The line under a chart saying what healthy looks like on it (theme.HEALTHY), if any."""
    return [html.P(text, className="chart-caption")] if text else []


def hazard_graph(height: int) -> html.Div:
    return html.Div(
        [
            dcc.Graph(
                id=HAZARD_GRAPH,
                figure=message_figure("Loading…", height),
                className=HAZARD_GRAPH,
                style={"height": f"{height}px"},
                config={
                    "displaylogo": False,
                    "responsive": True,
                    "modeBarButtons": [["toImage", "zoom2d", "pan2d", "resetScale2d"]],
                    "toImageButtonOptions": {"format": "png", "scale": 2, "filename": "collapse_hazard"},
                },
            ),
            *_caption(HAZARD_HEALTHY),
        ],
        className="chart-card",
    )


def whole_name(tooltip_field: str) -> dict[str, Any]:
    """What a grid column of run names adds to its definition: the name whole, wrapped over
    lines when the column is narrow (seeds of one arm differ at their end: cut, they read the
    same), and as the cell's title from `tooltip_field` (plain text; the grid needs
    `enableBrowserTooltips`)."""
    return {"wrapText": True, "autoHeight": True, "tooltipField": tooltip_field, "cellClass": "cell-name"}


def badge(text: str, kind: str | None = None) -> html.Span:
    return html.Span(text, className=f"badge {kind or text}")


def empty_state(title: str, body: Any) -> html.Div:
    return html.Div([html.H2(title), html.P(body)], className="empty-state panel")


def digest(value: Any) -> str:
    """A short digest of what a callback sends or draws from (components, figures, JSON)."""
    return hashlib.blake2b(to_json_plotly(value).encode(), digest_size=8).hexdigest()


def changed_only(outputs: Sequence[Any], sent: list[str] | None) -> tuple[list[Any], list[str]]:
    """`outputs` with `no_update` in place of each one equal to what was sent last time
    (`sent`: the digests returned then, kept in a store beside them), and the new digests.

    A panel redrawn on every live tick re-renders in the browser even when nothing in it
    changed; this keeps a tick's cost to what did change."""
    digests = [digest(o) for o in outputs]
    if not sent or len(sent) != len(digests):
        return list(outputs), digests
    return [no_update if new == old else o for o, new, old in zip(outputs, digests, sent, strict=True)], digests

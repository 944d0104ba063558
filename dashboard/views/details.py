"""The run page's step details: where the sampler–learner mismatch lives, below the headline
charts and the hazard (docs/dashboard.md, "Step details").

- the distribution of ℓ = log π − log μ over steps, as a heatmap with its tail quantiles;
- Σℓ of each sequence against its length, with the least-squares slope per 1,000 tokens;
- the token view: a step's worst sequences, each token coloured by ℓ.

All three draw first on the page's "drawn" tick (assets/live/start.js), after the charts
above them, and again on the data tick while the run streams: at most every few seconds, and
never while the tab is hidden. A click on any chart of the page opens the token view at the
step clicked.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

from dash import ClientsideFunction, Dash, Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from dashboard.data import KeelApi
from dashboard.detail_figures import Distribution, distribution_figure, sequences_figure
from dashboard.figures import message_figure
from dashboard.layout import digest, radio
from dashboard.views import token_view
from dashboard.views.charts import X_AXIS_ONLY, zoom_range
from dashboard.views.detail_states import LOADING, NO_DETAILS, empty_text
from dashboard.views.token_view import run_of

__all__ = [
    "section",
    "register",
    "parse_step",
    "NO_DETAILS",
    "LOG_RATIO_KEY",
    "UNBOUNDED_KEY",
    "DIST_STEPS",
    "RECENT_STEPS",
]

LOG_RATIO_KEY = "mismatch/log_ratio"
UNBOUNDED_KEY = "mismatch/log_ratio_unbounded"
"""ℓ of the tokens no ratio clip bounds: negative advantage and r > 1.2 (docs/metrics.md)."""
DIST_STEPS = 500
"""Columns of the heatmap: about one per horizontal pixel of its half-width panel (the server
sums the counts of consecutive steps beyond that)."""
RECENT_STEPS = 50
"""The length scatter's default range: the run's last this many steps."""
SEQUENCE_POINTS = 3000
"""Points of the length scatter (an even subsample of the range's sequences beyond that)."""
HEIGHT = 380


def parse_step(search: str | None) -> int | None:
    """The step of a `?step=S` query string, or None."""
    from urllib.parse import parse_qs

    values = parse_qs((search or "").lstrip("?")).get("step", [])
    try:
        step = int(values[-1]) if values else None
    except ValueError:
        return None
    return step if step is not None and step >= 0 else None


def _graph(graph_id: str, filename: str) -> dcc.Graph:
    return dcc.Graph(
        id=graph_id,
        figure=message_figure(LOADING, HEIGHT),
        style={"height": f"{HEIGHT}px"},
        config={
            "displaylogo": False,
            "responsive": True,
            "modeBarButtons": [["toImage", "zoom2d", "pan2d", "resetScale2d"]],
            "toImageButtonOptions": {"format": "png", "scale": 2, "filename": filename},
        },
    )


def section(step: int | None) -> html.Div:
    """The three views; `step` opens the token view there (`/runs/<id>?step=S`)."""
    distribution = html.Div(
        [
            html.Div(
                [
                    html.H2("ℓ per step"),
                    html.Div(
                        radio("dist-variant", {"all": "all tokens", "unbounded": "unbounded only (A < 0, r > 1.2)"}),
                        id="dist-variant-field",
                        style={"display": "none"},
                    ),
                ],
                className="panel-head",
            ),
            _graph("dist-graph", "log_ratio_per_step"),
            html.Div(
                "Lines: p1 and p99 of ℓ, dotted p0.1 and p99.9. Hover a cell for its bin; click it for the step's worst sequences.",
                id="dist-readout",
                className="sub readout",
            ),
        ],
        className="panel detail-card",
    )
    lengths = html.Div(
        [
            html.Div(
                [
                    html.H2("Σℓ against length"),
                    radio("seq-range", {"recent": f"last {RECENT_STEPS} steps, or the heatmap's zoom", "step": "the token view's step"}),
                ],
                className="panel-head",
            ),
            _graph("seq-graph", "log_ratio_against_length"),
        ],
        className="panel detail-card",
    )
    return html.Div(
        [
            dcc.Store(id="dist-zoom"),
            dcc.Store(id="dist-drawn"),
            dcc.Store(id="seq-drawn"),
            dcc.Store(id="tokens-shown"),  # {"step", "explicit"}: the step the token view shows
            html.Div("step details", className="namespace"),
            html.Div([distribution, lengths], className="charts"),
            token_view.panel(step),
        ],
        id="step-details",
    )


# In the browser (assets/details.js): the heatmap's rows are bins of unequal width in ℓ (one
# row each), so the readout says which bin is hovered.
DIST_READOUT = ClientsideFunction("keel_details", "dist_readout")


def register(dash_app: Dash, api: KeelApi) -> None:
    token_view.register(dash_app, api)
    dash_app.clientside_callback(X_AXIS_ONLY, Output("dist-zoom", "data"), Input("dist-graph", "relayoutData"))
    dash_app.clientside_callback(
        DIST_READOUT, Output("dist-readout", "children"), Input("dist-graph", "hoverData"), prevent_initial_call=True
    )

    @dash_app.callback(
        Output("dist-graph", "figure"),
        Output("dist-variant-field", "style"),
        Output("dist-drawn", "data"),
        Input("page-state", "data"),
        Input("live-data-tick", "data"),
        Input("dist-variant", "value"),
        Input("dist-zoom", "data"),
        State("dist-drawn", "data"),
        prevent_initial_call=True,  # first on the "drawn" tick: after the charts above
    )
    async def draw_distribution(
        state: dict[str, Any] | None, _tick: Any, variant: str | None, zoom: dict[str, Any] | None, drawn: dict[str, Any] | None
    ) -> tuple[Any, Any, Any]:
        run_id = run_of(state)
        run = await api.run(run_id)
        if run is None:
            raise PreventUpdate
        x_range = zoom_range(zoom)
        bounds = _bounds(x_range if isinstance(x_range, tuple) else None)
        unbounded = variant == "unbounded"
        start, end = bounds if bounds is not None else (None, None)
        every, subset = await asyncio.gather(
            api.distributions(run_id, LOG_RATIO_KEY, start=start, end=end, max_steps=DIST_STEPS),
            api.distributions(run_id, UNBOUNDED_KEY, start=start, end=end, max_steps=DIST_STEPS if unbounded else 1),
        )
        # What the figure is drawn from: a live tick that brought no new histogram (a run
        # without step details, or points between them) redraws nothing in the browser.
        signature = {"variant": variant, "bounds": bounds, "data": digest([every, subset]), "started": run.get("last_step") is not None}
        if signature == drawn:
            raise PreventUpdate
        dist_all = Distribution.from_json(every or {})
        dist_unbounded = Distribution.from_json(subset or {})
        toggle = {} if not dist_unbounded.empty or unbounded else {"display": "none"}
        shown, totals = dist_all, None
        if unbounded and not dist_unbounded.empty:
            shown = dist_unbounded
            if dist_unbounded.steps == dist_all.steps:  # share of all the step's tokens
                totals = [float(sum(counts)) for counts in dist_all.counts]
        if shown.empty:
            text = empty_text(run, bounds, await _has_histograms(api, run_id) if bounds else False)
            return message_figure(text, HEIGHT), toggle, signature
        what = "unbounded tokens (A < 0, r > 1.2)" if shown is dist_unbounded else "all tokens"
        share = "of all the step's tokens" if totals is not None or shown is dist_all else "of the step's unbounded tokens"
        buckets = ", steps in buckets" if shown.bucketed else ""
        if shown.left_out:
            buckets += f", {shown.left_out} steps with other bins left out"
        title = f"<span style='font-size:11px'>{what}{buckets} · colour: share {share}</span>"
        figure = distribution_figure(
            shown,
            title=title,
            totals=totals,
            height=HEIGHT,
            render_id=uuid.uuid4().hex,
            x_range=x_range if isinstance(x_range, tuple) else None,
        )
        return figure, toggle, signature

    @dash_app.callback(
        Output("seq-graph", "figure"),
        Output("seq-drawn", "data"),
        Input("page-state", "data"),
        Input("live-data-tick", "data"),
        Input("dist-zoom", "data"),
        Input("seq-range", "value"),
        Input("tokens-shown", "data"),
        State("seq-drawn", "data"),
        prevent_initial_call=True,
    )
    async def draw_sequences(
        state: dict[str, Any] | None,
        _tick: Any,
        zoom: dict[str, Any] | None,
        mode: str | None,
        tokens_shown: dict[str, Any] | None,
        drawn: dict[str, Any] | None,
    ) -> tuple[Any, Any]:
        run_id = run_of(state)
        if ctx.triggered_id == "tokens-shown" and mode != "step":
            raise PreventUpdate
        run = await api.run(run_id)
        if run is None:
            raise PreventUpdate
        bounds = _sequence_bounds(run, mode, zoom_range(zoom), tokens_shown)
        start, end = bounds if bounds is not None else (None, None)
        payload = await api.sequences(run_id, start=start, end=end, max_points=SEQUENCE_POINTS)
        signature = {"bounds": bounds, "data": digest(payload), "started": run.get("last_step") is not None}
        if signature == drawn:
            raise PreventUpdate  # nothing new to draw (as for the distribution above)
        if not payload or not payload.get("length"):
            everything = await api.sequences(run_id, max_points=1) if payload is not None and bounds else None
            text = empty_text(run, bounds, bool(everything and everything.get("length")))
            return message_figure(text, HEIGHT), signature
        steps = sorted({int(s) for s in payload.get("steps") or []})
        span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}"
        title = f"<span style='font-size:11px'>{span}, {len(payload['length']):,} sequences · colour: step</span>"
        return sequences_figure(payload, title=title, height=HEIGHT, render_id=uuid.uuid4().hex), signature


def _bounds(x_range: tuple[float, float] | None) -> tuple[int, int] | None:
    """The steps a zoomed x range covers, or None for all."""
    if x_range is None:
        return None
    return max(0, math.floor(min(x_range))), max(0, math.ceil(max(x_range)))


def _sequence_bounds(
    run: dict[str, Any], mode: str | None, zoom: Any, tokens_shown: dict[str, Any] | None
) -> tuple[int, int] | None:
    """The steps the length scatter shows: the token view's step, the heatmap's zoom, or the
    run's last RECENT_STEPS steps; None when the run has no step yet."""
    if mode == "step" and tokens_shown and tokens_shown.get("step") is not None:
        step = int(tokens_shown["step"])
        return step, step
    if isinstance(zoom, tuple):
        return _bounds(zoom)
    last = run.get("last_step")
    return None if last is None else (max(0, int(last) - RECENT_STEPS + 1), int(last))


async def _has_histograms(api: KeelApi, run_id: str) -> bool:
    whole = await api.distributions(run_id, LOG_RATIO_KEY, max_steps=1)
    return bool(whole and whole.get("edges"))

"""The run page's token view: a step's worst sequences, each token coloured by ℓ, with the
step picker, and the clicks on the page's charts that open it (views/details.py places it).

The step shown is `tokens-shown` ({"step", "explicit"}): explicit once a step was asked for
(`?step=S`, the step box, prev/next, a click on a chart), else the run's latest step with
samples, followed while the run streams.
"""

from __future__ import annotations

from typing import Any

from dash import ALL, Dash, Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from dashboard.components import ALERT_TOKENS_TYPE, GRAPH_TYPE, HAZARD_GRAPH
from dashboard.data import KeelApi
from dashboard.tokens import colour_legend, sample_card
from dashboard.views.detail_states import LOADING, NO_DETAILS, placeholder

__all__ = ["panel", "register", "run_of", "NO_DETAILS"]


def run_of(state: dict[str, Any] | None) -> str:
    """The run of a run page's `page-state`; no update on any other page."""
    if not state or state.get("page") != "run":
        raise PreventUpdate
    return str(state["runs"][0])


def panel(step: int | None) -> html.Div:
    """The token view with its step picker; `step` is where it opens (None: the latest)."""
    return html.Div(
        [
            html.Div(
                [
                    html.H2("Worst sequences"),
                    html.Div(
                        [
                            html.Button("← prev", id="tokens-prev", n_clicks=0, className="button small"),
                            dcc.Input(
                                id="tokens-step",
                                type="number",
                                min=0,
                                step=1,
                                value=step,
                                debounce=True,
                                placeholder="latest",
                                className="step-input",
                            ),
                            html.Button("next →", id="tokens-next", n_clicks=0, className="button small"),
                            html.Button("latest", id="tokens-latest", n_clicks=0, className="button small"),
                        ],
                        className="step-picker",
                    ),
                ],
                className="panel-head",
            ),
            colour_legend(),
            html.Div(placeholder(LOADING, kind="sub"), id="tokens-view"),
            dcc.Store(id="tokens-url"),  # written by nothing: FOLLOW_URL's output
        ],
        id="tokens",
        className="panel section",
    )


# Opens the token view at `step`: the URL names it (?step=S, without a reload), the view
# scrolls in, and the step goes to the view's step field.
OPEN_AT_STEP = """
    var url = new URL(window.location.href);
    url.searchParams.set("step", String(step));
    window.history.replaceState(window.history.state, "", url.toString());
    var view = document.getElementById("tokens");
    if (view) view.scrollIntoView({behavior: "smooth", block: "start"});
    return step;
}
"""

# A click on a chart opens the token view at the clicked step: the point's x (its step) on
# the metric charts (an alert's ◆ included), the hazard and the heatmap; on the length
# scatter the step is the point's customdata. The URL follows (?step=S), without a reload.
STEP_FROM_CLICK = """
function (%s) {
    var hit = (window.dash_clientside.callback_context.triggered || [])[0];
    var point = hit && hit.value && hit.value.points && hit.value.points[0];
    var raw = point ? point.%s : null;
    if (raw === null || raw === undefined || !isFinite(Number(raw))) return window.dash_clientside.no_update;
    var step = Math.round(Number(raw));
""" + OPEN_AT_STEP

# An alert's "tokens" button (run page, alerts table) opens the token view at the alert's
# first step: the step is in the button's id.
STEP_FROM_ALERT = """
function (clicks) {
    var hit = (window.dash_clientside.callback_context.triggered || [])[0];
    if (!hit || !hit.value) return window.dash_clientside.no_update;
    var step = JSON.parse(hit.prop_id.slice(0, hit.prop_id.lastIndexOf("."))).step;
""" + OPEN_AT_STEP

# The URL names the step the token view shows, once the user picked one.
FOLLOW_URL = """
function (shown) {
    if (!shown || !shown.explicit || shown.step === null) return window.dash_clientside.no_update;
    var url = new URL(window.location.href);
    if (url.searchParams.get("step") !== String(shown.step)) {
        url.searchParams.set("step", String(shown.step));
        window.history.replaceState(window.history.state, "", url.toString());
    }
    return window.dash_clientside.no_update;
}
"""


def register(dash_app: Dash, api: KeelApi) -> None:
    _register_clicks(dash_app)
    dash_app.clientside_callback(
        FOLLOW_URL, Output("tokens-url", "data"), Input("tokens-shown", "data"), prevent_initial_call=True
    )

    @dash_app.callback(
        Output("tokens-view", "children"),
        Output("tokens-shown", "data"),
        Output("tokens-step", "value"),
        Input("page-state", "data"),
        Input("live-data-tick", "data"),
        Input("tokens-step", "value"),
        Input("tokens-prev", "n_clicks"),
        Input("tokens-next", "n_clicks"),
        Input("tokens-latest", "n_clicks"),
        State("tokens-shown", "data"),
        prevent_initial_call=True,
    )
    async def draw_tokens(
        state: dict[str, Any] | None,
        _tick: Any,
        step: float | None,
        _prev: int,
        _next: int,
        _latest: int,
        shown: dict[str, Any] | None,
    ) -> tuple[Any, Any, Any]:
        run_id = run_of(state)
        trigger = ctx.triggered_id
        drawn = None if shown is None else shown.get("step")
        if trigger in ("live-data-tick", "page-state") and step is not None and drawn is not None and int(step) != drawn:
            # A step was picked (typed, clicked, an alert's button) but not drawn: a live tick's
            # request superseded the one it made, and Dash dropped that one's answer.
            trigger = "tokens-step"
        refresh = shown is not None and trigger in ("live-data-tick", "page-state")
        if refresh and (shown or {}).get("explicit"):
            raise PreventUpdate  # a step picked stays as it is
        target = await _token_target(api, run_id, trigger, step, shown)
        explicit = target is not None
        payload = await api.samples(run_id, target)
        found = None if payload is None else payload.get("step")
        if refresh and found == (shown or {}).get("step") and (found is not None or not explicit):
            raise PreventUpdate  # the latest step with samples did not move (or there is none yet)
        if payload is None or found is None:
            steps = await api.sample_steps(run_id) if payload is not None else None
            if steps:
                text = f"No samples at or before step {target}; the first step with samples is {steps[0]}."
                view = placeholder(text, kind="note warn")
            else:
                view = placeholder(NO_DETAILS, component_id="tokens-missing")
            return view, {"step": None, "explicit": explicit}, target
        samples = list(payload.get("samples") or [])
        where = f"step {found}" + (f" (the latest step ≤ {target} with samples)" if explicit and found != target else "")
        caption = html.P(
            [html.B(where), f": the {len(samples)} worst sequence{'s' if len(samples) != 1 else ''}, worst first. Hover a token for π, μ, r and each loss's coefficient."],
            className="sub",
            id="tokens-caption",
        )
        cards = [sample_card(rank, sample) for rank, sample in enumerate(samples, start=1)]
        return [caption, *cards], {"step": found, "explicit": explicit}, found if explicit else None


def _register_clicks(dash_app: Dash) -> None:
    """Every chart's click opens the token view (one callback per kind of chart: the hazard
    chart and the metric charts come and go with the data)."""
    output = Output("tokens-step", "value", allow_duplicate=True)
    sources = [
        (Input({"type": GRAPH_TYPE, "key": ALL}, "clickData"), "x"),
        (Input(HAZARD_GRAPH, "clickData"), "x"),
        (Input("dist-graph", "clickData"), "x"),
        (Input("seq-graph", "clickData"), "customdata"),
    ]
    for source, field in sources:
        dash_app.clientside_callback(STEP_FROM_CLICK % ("clicks", field), output, source, prevent_initial_call=True)
    dash_app.clientside_callback(
        STEP_FROM_ALERT,
        output,
        Input({"type": ALERT_TOKENS_TYPE, "alert": ALL, "step": ALL}, "n_clicks"),
        prevent_initial_call=True,
    )


async def _token_target(
    api: KeelApi, run_id: str, trigger: Any, step: float | None, shown: dict[str, Any] | None
) -> int | None:
    """The step the token view is asked for (None: the latest with samples)."""
    current = None if shown is None else shown.get("step")
    if trigger == "tokens-latest":
        return None
    if trigger == "tokens-prev":
        if current is None or current <= 0:
            raise PreventUpdate
        return int(current) - 1  # the samples read answers the latest step ≤ this one
    if trigger == "tokens-next":
        steps = await api.sample_steps(run_id) or []
        later = [s for s in steps if current is None or s > current]
        if not later:
            raise PreventUpdate
        return later[0]
    if trigger == "tokens-step":
        return None if step is None else max(0, int(step))
    if shown is not None:
        return current if shown.get("explicit") else None
    return None if step is None else max(0, int(step))  # the first draw: `?step=S`, or the latest

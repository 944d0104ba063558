"""The run page's token view: a step's worst sequences, each token coloured by ℓ, with the
step picker, and the clicks on the page's charts that open it (views/details.py places it).

The browser's part (a chart's click, an alert's button, the URL) is assets/token_view.js,
the clientside namespace `keel_tokens`.

The step shown is `tokens-shown` ({"step", "explicit"}): explicit once a step was asked for
(`?step=S`, the step box, prev/next, a click on a chart), else the run's latest step with
samples, followed while the run streams.
"""

from __future__ import annotations

from typing import Any

from dash import ALL, MATCH, ClientsideFunction, Dash, Input, Output, State, ctx, dcc, html
from dash.exceptions import PreventUpdate

from dashboard.data import KeelApi
from dashboard.layout import ALERT_TOKENS_TYPE, GRAPH_TYPE, HAZARD_GRAPH
from dashboard.tokens import colour_legend, sample_card
from dashboard.topk import TOPK_PANEL, TOPK_STORE, TOPK_TOKEN, choose, token_class
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
            dcc.Store(id="tokens-url"),  # written by nothing: keel_tokens.follow_url's output
        ],
        id="tokens",
        className="panel section",
    )


def register(dash_app: Dash, api: KeelApi) -> None:
    _register_clicks(dash_app)
    dash_app.clientside_callback(
        ClientsideFunction("keel_tokens", "follow_url"),
        Output("tokens-url", "data"),
        Input("tokens-shown", "data"),
        prevent_initial_call=True,
    )

    @dash_app.callback(
        Output({"type": TOPK_PANEL, "sample": MATCH}, "children"),
        Output({"type": TOPK_TOKEN, "sample": MATCH, "position": ALL}, "className"),
        Input({"type": TOPK_TOKEN, "sample": MATCH, "position": ALL}, "n_clicks"),
        State({"type": TOPK_STORE, "sample": MATCH}, "data"),
        prevent_initial_call=True,
    )
    def choose_token(_clicks: list[int], stored: dict[str, Any] | None) -> tuple[Any, list[str]]:
        """A click on a token that carries both engines' top-k shows them."""
        trigger = ctx.triggered_id
        if not isinstance(trigger, dict) or not stored:
            raise PreventUpdate
        block = choose(int(trigger["position"]), stored)
        if block is None:
            raise PreventUpdate
        positions = [output["id"]["position"] for output in ctx.outputs_list[1]]
        return block, [token_class(p, stored.get("worst"), True, trigger["position"]) for p in positions]

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
    # The step is the clicked point's x on the metric charts (an alert's ◆ included), the
    # hazard and the heatmap; on the length scatter it is the point's customdata.
    sources = [
        (Input({"type": GRAPH_TYPE, "key": ALL}, "clickData"), "step_from_x"),
        (Input(HAZARD_GRAPH, "clickData"), "step_from_x"),
        (Input("dist-graph", "clickData"), "step_from_x"),
        (Input("seq-graph", "clickData"), "step_from_customdata"),
    ]
    for source, function in sources:
        dash_app.clientside_callback(
            ClientsideFunction("keel_tokens", function), output, source, prevent_initial_call=True
        )
    dash_app.clientside_callback(
        ClientsideFunction("keel_tokens", "step_from_alert"),
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

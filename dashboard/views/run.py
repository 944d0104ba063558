"""/runs/<id> — one run: overview, alerts, the headline charts and its collapse hazard in the
first view; then commands, config and backtest (folded) and a chart for every other metric."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from typing import Any

from dash import ALL, ClientsideFunction, Dash, Input, Output, State, dcc, html, no_update

from dashboard.data import KeelApi
from dashboard.figures import ChartOptions
from dashboard.layout import (
    ALERT_TOKENS_TYPE,
    INITIAL_SMOOTHING,
    badge,
    changed_only,
    chart_controls,
    display_status,
    empty_state,
    hazard_graph,
    live_target,
    metric_graph,
    page_state,
)
from dashboard.series import Alert
from dashboard.theme import HEADLINE_KEYS, SIGNAL_KEYS, drawn_keys, logged_charts
from dashboard.views.charts import chart_figure
from dashboard.views.details import section as details_section

__all__ = ["layout", "register", "order_keys"]

CHART_HEIGHT = 260


MISMATCH_SOURCE = "keel/mismatch_source"
"""Run config key an integration sets to say what the run's "sampler" logprobs really are."""


def mismatch_note(config: dict[str, Any]) -> html.Div | None:
    """A note over the charts when the mismatch metrics do not compare a real sampler with
    the learner (e.g. TRL without vLLM: staleness only, or nothing at all)."""
    source = str(config.get(MISMATCH_SOURCE) or "")
    if not source or source.startswith("sampler:"):
        return None
    return html.Div(
        f"mismatch/* metrics of this run are not sampler–learner numerics: {source}",
        id="mismatch-source",
        className="note warn",
    )


def order_keys(keys: list[str]) -> list[tuple[str, list[str]]]:
    """The charts of a run that logs `keys`: headline metrics first, then the signals it logs
    (theme.SIGNAL_KEYS, in that order), then every other metric by namespace (`mismatch/…`,
    `perf/…`), sorted. A metric a signal chart draws as logged has no chart of its own."""
    headline = [k for k in HEADLINE_KEYS if k in keys]
    signals = logged_charts(SIGNAL_KEYS, keys)
    sections: dict[str, list[str]] = {}
    for key in sorted(set(keys) - set(headline) - drawn_keys(signals)):
        sections.setdefault(key.split("/", 1)[0] if "/" in key else "other", []).append(key)
    ordered = [("headline", headline)] if headline else []
    ordered += [("signals", signals)] if signals else []
    return ordered + sorted(sections.items())


def layout(run_id: str, step: int | None = None) -> html.Div:
    """The run's page; `step` opens its token view at that step (`?step=S`)."""
    return html.Div(
        [
            page_state("run", [run_id], CHART_HEIGHT),
            live_target([run_id]),
            dcc.Store(id="run-keys"),
            dcc.Store(id="run-sent"),
            html.Div(html.H1("Loading run…"), id="run-header", className="page-title"),
            # The first view (1500 × 1000): the header, a compact overview and alerts, the
            # chart controls and the headline charts. Commands, config and backtest follow
            # the charts; config and backtest are folded until opened.
            html.Div(
                [
                    html.Div([html.H2("Overview"), html.Div(id="run-overview")], className="panel"),
                    html.Div([html.H2("Alerts"), html.Div(id="run-alerts")], className="panel alerts-panel"),
                ],
                className="two-col first-view",
            ),
            html.Div(chart_controls(aggregate=False, extra_metrics=False), className="section"),
            html.Div(id="run-charts"),
            commands_panel(),
            fold("Config", html.Pre(id="run-config", className="config"), "run-config-fold"),
            backtest_panel(),
            details_section(step),
            html.Div(id="run-more-charts"),
        ]
    )


def fold(title: str, body: Any, fold_id: str) -> html.Details:
    """A panel folded under its title, closed until opened (its contents keep their ids)."""
    return html.Details(
        [html.Summary(title, className="fold-title"), html.Div(body, className="fold-body")],
        id=fold_id,
        open=False,
        className="panel section fold",
    )


COMMAND_ACTION = "command-action"
"""The pattern id type of a command's button (`{"type": COMMAND_ACTION, "action": name}`)."""
USUAL_ACTIONS = {
    "checkpoint": "asks the trainer to save a checkpoint (what it does is its handler's)",
    "stop": "asks the trainer to stop (what it does is its handler's)",
}
"""What the page offers a trainer that listens to commands without saying which it takes."""


def commands_panel() -> html.Div:
    """Commands to the run's trainer: a button for each action its trainer said it takes
    (shown to an admin only, sent from the browser as the logged-in user: assets/commands.js),
    a line on why there are none, and each command's state."""
    return html.Div(
        [
            html.H2("Commands"),
            html.Div(
                [html.Span(id="command-actions", className="command-actions"), html.Span(id="command-sent", className="sub")],
                id="command-buttons",
                className="command-buttons",
                style={"display": "none"},
            ),
            html.P(id="command-note", className="sub"),
            dcc.Store(id="command-offered"),
            html.Div(id="run-commands"),
        ],
        className="panel section",
    )


def unsent_note(frames: int) -> str:
    """What a run whose trainer ended before the server acknowledged all it sent is."""
    return (
        f"its trainer ended with {frames} frame{'s' if frames != 1 else ''} not stored here: they are in its "
        "spool, and `keel sync` on the trainer's machine sends them"
    )


def offered_actions(run: dict[str, Any] | None) -> tuple[dict[str, str], str]:
    """The actions the run page offers for `run` (the run's JSON), each with what it does, and
    a line saying why (none when the trainer named its actions and the run is live)."""
    if run is None:
        return {}, ""
    status = str(run.get("status", ""))
    if status not in ("running", "silent"):
        return {}, f"The run is {status}: no trainer is there to take a command."
    actions = run.get("actions")
    if actions is None:
        return {}, (
            "This run's trainer does not listen to commands: a trainer takes them with Monitor.on_command "
            "(docs/integrate.md, \"Acting on alerts\"); keel lm --guard takes rollback, keel run takes stop."
        )
    offered = dict(actions) if actions else dict(USUAL_ACTIONS)
    said = "" if actions else "This run's trainer listens to commands without saying which it takes: "
    said += " · ".join(f"{name}: {text}" for name, text in offered.items() if text)
    if status == "silent":
        said += " — the run is silent: a command waits until its trainer is back."
    return offered, said


def _action_buttons(offered: dict[str, str]) -> list[html.Button]:
    return [
        html.Button(name.replace("_", " ").replace("-", " ").capitalize(), id={"type": COMMAND_ACTION, "action": name},
                    n_clicks=0, className="button", title=text or f"sends {name!r} to the run's trainer")
        for name, text in offered.items()
    ]  # fmt: skip


_PENDING = "not received: a trainer gets commands only while it listens to them (docs/integrate.md, \"Acting on alerts\")"


def _commands_table(commands: list[dict[str, Any]]) -> Any:
    if not commands:
        return html.P("No commands sent to this run.", className="sub")
    header = html.Tr([html.Th(h) for h in ("Action", "State", "Asked by", "When", "Answer")])
    rows = [
        html.Tr(
            [
                html.Td(c.get("action", "")),
                html.Td(badge(str(c.get("state", ""))), className=f"command-{c.get('state', '')}"),
                html.Td(str(c.get("requested_by", ""))),
                html.Td(_when(datetime.fromtimestamp(float(c["created_at"]), timezone.utc).isoformat()) if c.get("created_at") else "—"),
                html.Td(str(c.get("message") or (_PENDING if c.get("state") == "pending" else ""))),
            ]
        )
        for c in commands
    ]
    return html.Table([html.Thead(header), html.Tbody(rows)], className="plain", id="commands-table")


def backtest_panel() -> html.Details:
    return fold(
        "Backtest",
        [
            html.P(
                "Replay this run's stored points through alert rules, with the server's own "
                "detectors: where each would have fired shows on the charts as an open diamond. "
                "Nothing is written. Empty: the default rules.",
                className="sub",
            ),
            dcc.Textarea(
                id="backtest-rules",
                placeholder='[{"name": "kl high", "metric": "mismatch/kl", "detector": "threshold", '
                '"params": {"threshold": 0.05}, "severity": "critical", "for_steps": 3}]',
                className="rules-input",
            ),
            html.Button("Backtest", id="backtest-run", n_clicks=0, className="button"),
            html.Div(id="backtest-result"),
        ],
        "backtest-fold",
    )


def backtest_firings(run_id: str, result: dict[str, Any]) -> list[Alert]:
    """A backtest's episodes as the charts show alerts (state "backtest"), from its firing step."""
    return [
        Alert(
            id=f"backtest:{replay['rule']['name']}:{index}",
            run_id=run_id,
            rule=replay["rule"]["name"],
            metric=replay["rule"]["metric"],
            severity=replay["rule"].get("severity", "warning"),
            state="backtest",
            started_step=episode["fired_step"],
            resolved_step=episode.get("resolved_step"),
            message=episode.get("message", ""),
        )
        for replay in result.get("rules", [])
        for index, episode in enumerate(replay.get("episodes", []))
    ]


def _backtest_table(result: dict[str, Any], firings: list[Alert]) -> html.Div:
    replays = result.get("rules", [])
    summary = (
        f"{len(replays)} rule(s) replayed over {result.get('steps', 0)} steps: "
        f"{len(firings)} firing(s)."
    )
    parts: list[Any] = [html.P(summary, id="backtest-summary")]
    skipped = [f"{r['rule']['name']}: {r['skipped']}" for r in replays if r.get("skipped")]
    if skipped:
        parts.append(html.P("Not replayed: " + "; ".join(skipped), className="sub"))
    if firings:
        header = html.Tr([html.Th(h) for h in ("Severity", "Rule", "Fires at", "Resolves at", "Message")])
        rows = [
            html.Tr(
                [
                    html.Td(badge(f.severity)),
                    html.Td(f.rule, className="rule"),
                    html.Td(str(f.started_step)),
                    html.Td("—" if f.resolved_step is None else str(f.resolved_step)),
                    html.Td(f.message),
                ]
            )
            for f in firings
        ]
        parts.append(html.Table([html.Thead(header), html.Tbody(rows)], className="plain", id="backtest-table"))
    return html.Div(parts)


def _when(iso: str | None) -> str:
    if not iso:
        return "—"
    moment = datetime.fromisoformat(iso)
    seconds = (datetime.now(timezone.utc) - moment).total_seconds()
    ago = (
        f"{int(seconds)} s ago"
        if seconds < 90
        else f"{int(seconds // 60)} min ago"
        if seconds < 5400
        else f"{seconds / 3600:.1f} h ago"
    )
    return f"{moment.strftime('%Y-%m-%d %H:%M:%S')} UTC ({ago})"


def _short(pattern: str | None, limit: int = 40) -> str:
    if not pattern:
        return "—"
    return pattern if len(pattern) <= limit else pattern[: limit - 1] + "…"


def _alerts_table(alerts: list[Alert] | None) -> Any:
    if alerts is None:
        return html.P("Alerts are not available on this server yet.", className="sub")
    if not alerts:
        return html.P([badge("ok"), " No alerts for this run."])
    header = html.Tr(
        [html.Th(h) for h in ("Severity", "State", "Rule", "Metric", "Steps", "Message")]
    )
    rows = [
        html.Tr(
            [
                html.Td(badge(a.severity)),
                html.Td(a.state),
                html.Td(a.rule, className="rule"),
                html.Td(_short(a.metric), title=a.metric or "", className="metric"),
                html.Td(
                    [
                        f"{a.started_step} → {a.resolved_step if a.resolved_step is not None else 'now'} ",
                        html.Button(
                            "tokens",
                            id={"type": ALERT_TOKENS_TYPE, "alert": a.id, "step": a.started_step},
                            n_clicks=0,
                            className="button small",
                            title=f"the worst tokens at step {a.started_step} (the token view below)",
                        )
                        if a.started_step is not None
                        else None,
                    ]
                ),
                html.Td(a.message),
            ]
        )
        for a in sorted(alerts, key=lambda a: (a.state != "firing", -(a.started_step or 0)))
    ]
    return html.Table([html.Thead(header), html.Tbody(rows)], className="plain")


def register(dash_app: Dash, api: KeelApi) -> None:
    dash_app.clientside_callback(
        ClientsideFunction("keel_commands", "shown"),
        Output("command-buttons", "style"),
        Input("page-state", "data"),
    )
    dash_app.clientside_callback(
        ClientsideFunction("keel_commands", "send"),
        Output("command-sent", "children"),
        Input({"type": COMMAND_ACTION, "action": ALL}, "n_clicks"),
        State({"type": COMMAND_ACTION, "action": ALL}, "title"),
        State("page-state", "data"),
        prevent_initial_call=True,
    )

    @dash_app.callback(
        Output("command-actions", "children"),
        Output("command-note", "children"),
        Output("command-offered", "data"),
        Input("page-state", "data"),
        Input("live-data-tick", "data"),
        State("command-offered", "data"),
    )
    async def offer(state: dict[str, Any] | None, _tick: Any, before: Any) -> Any:
        """The buttons of the actions the run's trainer takes; drawn again only when they
        change (a click's count would be lost)."""
        if not state or state.get("page") != "run":
            return no_update, no_update, no_update
        offered, note = offered_actions(await api.run(state["runs"][0]))
        now = [[name, text] for name, text in offered.items()]
        return (no_update if now == before else _action_buttons(offered)), note, now

    @dash_app.callback(
        Output("run-commands", "children"),
        Input("page-state", "data"),
        Input("live-data-tick", "data"),
        Input("command-sent", "children"),
    )
    async def commands(state: dict[str, Any] | None, _tick: Any, _sent: Any) -> Any:
        if not state or state.get("page") != "run":
            return no_update
        return _commands_table(await api.commands(state["runs"][0]))

    @dash_app.callback(
        Output("run-header", "children"),
        Output("run-overview", "children"),
        Output("run-alerts", "children"),
        Output("run-config", "children"),
        Output("run-sent", "data"),
        Input("page-state", "data"),
        Input("live-data-tick", "data"),
        State("run-sent", "data"),
    )
    async def details(state: dict[str, Any] | None, _tick: Any, sent: list[str] | None) -> tuple[Any, ...]:
        """The header, overview, alerts and config; on a live tick only the parts that changed."""
        if not state or state.get("page") != "run":
            return no_update, no_update, no_update, no_update, no_update
        outputs, digests = changed_only(await _details(state["runs"][0]), sent)
        return (*outputs, digests)

    async def _details(run_id: str) -> tuple[Any, Any, Any, Any]:
        run = await api.run(run_id)
        if run is None:
            missing = empty_state("Run not found", f"No run with id {run_id} on this server.")
            return [html.H1("Unknown run")], missing, None, ""
        alerts = await api.alerts(run_id)
        siblings = [run_id]
        if run.get("group"):
            # the group's runs alone: this is read on every data tick
            siblings += [r["id"] for r in await api.runs(project=run.get("project"), group=run["group"]) if r["id"] != run_id]
        status = display_status(run["status"])
        header = [
            html.H1(run["name"]),
            badge(status),
            html.Span(f"group {run['group']}" if run.get("group") else "no group", className="sub"),
            html.Span(f"project {run['project']}", className="sub"),
            dcc.Link(
                f"compare with its group ({len(siblings)} runs) →"
                if len(siblings) > 1
                else "open in compare →",
                href=f"/compare?runs={','.join(siblings)}",
                className="sub",
            ),
        ]
        facts = [
            ("Run id", run["id"]),
            ("Status", status),
            ("Last step", "—" if run.get("last_step") is None else str(run["last_step"])),
            ("Started", _when(run.get("started_at"))),
            ("Last data", _when(run.get("last_seen_at"))),
            ("Finished", _when(run.get("finished_at")) if run.get("finished_at") else "—"),
            ("Tags", ", ".join(run.get("tags") or []) or "—"),
        ]
        if run.get("unsent") and run["status"] != "running":
            header.append(html.Span(unsent_note(int(run["unsent"])), className="sub warn", id="run-unsent"))
            facts.append(("Not sent", f"{run['unsent']} frames"))
        if (run.get("config") or {}).get(MISMATCH_SOURCE):
            facts.append(("Mismatch measured from", str(run["config"][MISMATCH_SOURCE])))
        overview = html.Dl(
            [part for k, v in facts for part in (html.Dt(k), html.Dd(v))], className="meta-grid"
        )
        config = (
            json.dumps(run.get("config") or {}, indent=2, sort_keys=True)
            if run.get("config")
            else "(no config logged)"
        )
        return header, overview, _alerts_table(alerts), config

    @dash_app.callback(
        Output("backtest-result", "children"),
        Output("backtest-firings", "data"),
        Input("backtest-run", "n_clicks"),
        State("backtest-rules", "value"),
        State("page-state", "data"),
        prevent_initial_call=True,
    )
    async def backtest(clicks: int | None, text: str | None, state: dict[str, Any] | None) -> tuple[Any, Any]:
        # Dash also calls this when the page's panel first appears (no click yet).
        if not clicks or not state or state.get("page") != "run":
            return no_update, no_update
        run_id = state["runs"][0]
        rules = None
        if text and text.strip():
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as exc:
                return html.P(f"The rules are not valid JSON: {exc}", className="note warn"), no_update
            rules = parsed if isinstance(parsed, list) else [parsed]
        try:
            result = await api.backtest(run_id, rules)
        except ValueError as exc:
            return html.P(f"The server refused the rules: {exc}", className="note warn"), no_update
        firings = backtest_firings(run_id, result)
        return _backtest_table(result, firings), {"run_id": run_id, "firings": [f.to_store() for f in firings]}

    @dash_app.callback(
        Output("run-charts", "children"),
        Output("run-more-charts", "children"),
        Output("run-keys", "data"),
        Input("page-state", "data"),
        Input("live-data-tick", "data"),
        State("run-keys", "data"),
    )
    async def charts(
        state: dict[str, Any] | None, _tick: Any, shown: dict[str, Any] | None
    ) -> tuple[Any, Any, Any]:
        """The headline charts (and the hazard), then the signals the run logs, first; every
        other metric's charts once the page has drawn those (the "drawn" tick,
        assets/live/start.js): a run that logs 40 metrics would otherwise queue 40 charts
        beside the five a researcher looks at first. `run-keys` holds the charts at the top
        ("top") and the logged keys whose charts are on the page ("keys"; None until the
        others are)."""
        if not state or state.get("page") != "run":
            return no_update, no_update, no_update
        run_id = state["runs"][0]
        keys = sorted(await api.keys(run_id))
        if shown is not None and keys == shown.get("keys"):
            return no_update, no_update, no_update  # a new metric appears only now and then
        if not keys:
            return empty_state(
                "No metrics yet", "Charts appear as soon as the run logs its first step."
            ), [], {"top": [], "keys": keys}
        rest = order_keys(keys)
        headline = rest.pop(0)[1] if rest and rest[0][0] == "headline" and set(rest[0][1]) <= set(HEADLINE_KEYS) else []
        signals = rest.pop(0)[1] if rest and rest[0][0] == "signals" and set(rest[0][1]) <= set(SIGNAL_KEYS) else []
        top_keys = [*headline, *signals]
        more: list[Any] = []
        for name, section_keys in rest:
            more.append(html.Div(name, className="namespace"))
            more.append(html.Div([metric_graph(k, CHART_HEIGHT) for k in section_keys], className="charts small"))
        if shown is not None and shown.get("top") == top_keys:
            return no_update, more, {"top": top_keys, "keys": keys}  # the top charts stay as drawn
        # The headline charts come drawn: the page's first view waits for one round trip, not two.
        run, *figures = await asyncio.gather(
            api.run(run_id),
            *(chart_figure(api, key, [run_id], ChartOptions(INITIAL_SMOOTHING, height=CHART_HEIGHT)) for key in headline),
        )
        note = mismatch_note((run or {}).get("config") or {})
        top: list[Any] = [note] if note is not None else []
        top.append(html.Div("headline", className="namespace"))
        graphs = [metric_graph(k, CHART_HEIGHT, figure) for k, figure in zip(headline, figures, strict=True)]
        top.append(html.Div([*graphs, hazard_graph(CHART_HEIGHT)], className="charts small"))
        if signals:
            # Below the headline charts: each asks for its figure once near the view.
            top.append(html.Div("signals", className="namespace"))
            top.append(html.Div([metric_graph(k, CHART_HEIGHT) for k in signals], className="charts small"))
        if shown is None and headline:
            return top, [], {"top": top_keys, "keys": None}  # the rest on the "drawn" tick, once these are drawn
        return top, more, {"top": top_keys, "keys": keys}

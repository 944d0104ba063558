"""/compare?runs=a,b,c — the headline charts and the collapse hazard of several runs side by
side, with a summary, and the parity of two of the runs or groups (views/parity.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import dash_ag_grid as dag
from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from dashboard.data import KeelApi
from dashboard.figures import RunLine, run_styles
from dashboard.layout import (
    GRID_COLUMN_DEFAULTS,
    chart_controls,
    data_attributes,
    empty_state,
    hazard_graph,
    live_target,
    metric_graph,
    page_state,
    tick_reasons,
    whole_name,
)
from dashboard.series import Series
from dashboard.summary import SUMMARY_KEYS, Headline, summarise_group, summarise_run
from dashboard.theme import (
    CRITICAL_HAZARD,
    HAZARD_TOOLTIP,
    HEADLINE_KEYS,
    SIGNAL_KEYS,
    drawn_keys,
    logged_charts,
)
from dashboard.views import parity
from dashboard.views.charts import HISTORY_POINTS, hazards

__all__ = ["layout", "register", "parse_runs"]

CHART_HEIGHT = 330
WHEN_LOGGED_KEYS = ("mismatch/tail_frac", *SIGNAL_KEYS)
"""Charted after the headline charts when any of the runs logs what they draw."""


SUMMARY_WAITS = (
    "Final and peak reward, first critical alert, largest KL and ratio, peak hazard: read once "
    "the charts above are drawn, then every few seconds while the runs stream."
)
"""What the summary says until its numbers come (its rows hold the runs' names until then)."""


def parse_runs(search: str | None) -> list[str]:
    """Run ids from a `?runs=a,b` query string, in order, without duplicates."""
    from urllib.parse import parse_qs

    values = parse_qs((search or "").lstrip("?")).get("runs", [])
    ids = [part.strip() for value in values for part in value.split(",")]
    return list(dict.fromkeys(i for i in ids if i))


def _number_column(field: str, header: str, **extra: Any) -> dict[str, Any]:
    return {
        "field": field,
        "headerName": header,
        "type": "rightAligned",
        "valueFormatter": {"function": "keelNumber(params.value)"},
        "cellClassRules": {"cell-nonfinite": {"function": "keelNonFinite(params.value)"}},
        **extra,
    }


SUMMARY_COLUMNS = [
    {"field": "name", "headerName": "Run / group", "flex": 2, "minWidth": 180, **whole_name("name")},
    {"field": "group", "headerName": "Group", "flex": 1, "minWidth": 100},
    _number_column("final_reward", "Final reward", flex=1),
    _number_column("peak_reward", "Peak reward", flex=1),
    {"field": "peak_step", "headerName": "Peak at step", "type": "rightAligned", "flex": 1},
    {
        "field": "first_critical_step",
        "headerName": "First critical alert (step)",
        "type": "rightAligned",
        "flex": 1,
        "cellClassRules": {"cell-critical": {"function": "params.value != null"}},
    },
    _number_column("max_kl", "Max KL", flex=1),
    _number_column("max_ratio", "Max ratio", flex=1),
    {
        "field": "nonfinite",
        "headerName": "Non-finite points",
        "type": "rightAligned",
        "flex": 1,
        "cellClassRules": {"cell-nonfinite": {"function": "params.value > 0"}},
    },
    {
        "field": "peak_hazard",
        "headerName": "Peak hazard",
        "headerTooltip": f"the highest {HAZARD_TOOLTIP} (a group: the highest of its runs)",
        "type": "rightAligned",
        "flex": 1,
        "valueFormatter": {"function": "keelPercent(params.value)"},
        "cellClassRules": {"cell-critical": {"function": f"params.value != null && params.value >= {CRITICAL_HAZARD}"}},
    },
    {"field": "peak_hazard_step", "headerName": "Peak hazard at step", "type": "rightAligned", "flex": 1},
    {
        "field": "fell",
        "headerName": "Reward fell",
        "headerTooltip": "where the reward fell by the collapse label (docs/alerts.md): the hazard speaks of the steps before",
        "flex": 1.4,
        "cellClassRules": {"cell-critical": {"function": "params.value && params.value.startsWith('collapsed')"}},
    },
]


def layout(run_ids: list[str]) -> html.Div:
    if not run_ids:
        return empty_state(
            "Nothing to compare yet",
            ["Pick runs on the ", dcc.Link("Runs", href="/"), " page and press Compare."],
        )
    return html.Div(
        [
            page_state("compare", run_ids, CHART_HEIGHT),
            live_target(run_ids),
            html.Div(
                [
                    html.H1("Compare"),
                    html.Span(
                        f"{len(run_ids)} run{'s' if len(run_ids) != 1 else ''}", className="sub"
                    ),
                    html.Div(id="compare-chips", className="chips"),
                ],
                className="page-title",
            ),
            html.Div(id="compare-notice"),
            chart_controls(aggregate=True, extra_metrics=True),
            html.Div(
                [metric_graph(key, CHART_HEIGHT) for key in HEADLINE_KEYS]
                + [hazard_graph(CHART_HEIGHT)],
                className="charts",
            ),
            html.Div(id="compare-logged", className="charts", style={"marginTop": "12px"}),
            html.Div(id="compare-extra", className="charts", style={"marginTop": "12px"}),
            # The keys the browser tallies of the points the socket pushes (assets/live/tally.js).
            html.Div(id="compare-summary-keys", hidden=True, **data_attributes(summary_keys=",".join(SUMMARY_KEYS))),
            # The summary and the parity view, once the charts are drawn (`below`).
            html.Div(id="compare-below"),
            dcc.Store(id="compare-below-shown", data=False),
        ]
    )


def summary_section(names: list[dict[str, str]]) -> html.Div:
    """The summary table, with the runs' names (`names`: its first rows, each with its run's
    id as "id") until `summary` fills in their numbers."""
    return html.Div(
        [
            html.H2("Summary"),
            html.P(SUMMARY_WAITS, id="compare-summary-status", className="sub"),
            # Set once, with the section: the summary's first read follows from it.
            dcc.Store(id="compare-summary-ready", data=True),
            # The runs' headlines as read when the section came (`summary`).
            dcc.Store(id="compare-summary-read"),
            dag.AgGrid(
                id="compare-summary",
                columnDefs=SUMMARY_COLUMNS,
                rowData=names,
                # Rows keep their identity across updates: a data tick changes the cells that
                # changed instead of building every row again.
                getRowId="params.data.id",
                defaultColDef=GRID_COLUMN_DEFAULTS,
                dashGridOptions={
                    "domLayout": "autoHeight",
                    "localeText": {"noRowsToShow": "Reading the runs…"},
                    "enableBrowserTooltips": True,
                },
                style={"height": None},
            ),
        ],
        className="panel section",
    )


def register(dash_app: Dash, api: KeelApi) -> None:
    parity.register(dash_app, api)

    @dash_app.callback(
        Output("compare-chips", "children"),
        Output("compare-notice", "children"),
        Output("opt-metrics", "options"),
        Output("compare-logged", "children"),
        Input("page-state", "data"),
    )
    async def header(state: dict[str, Any] | None) -> tuple[Any, Any, list[dict[str, str]], list[Any]]:
        """The run chips and the charts of what the runs log."""
        if not state or state.get("page") != "compare":
            return [], None, [], []
        run_ids = state["runs"]
        infos = await api.runs_by_id(run_ids)
        known = [r for r in run_ids if infos.get(r)]
        keys = (await api.keys_of_runs(known)).values()
        lines = [_identity(r, infos[r] or {}) for r in known]
        styles = run_styles(lines)
        chips = [
            dcc.Link(
                [
                    html.Span(
                        className="swatch",
                        style={
                            "borderTopColor": styles[line.run_id].colour,
                            "borderTopStyle": _css_dash(styles[line.run_id].dash),
                        },
                    ),
                    line.name,
                    html.Span(line.group or "", className="group"),
                ],
                href=f"/runs/{line.run_id}",
                title=line.name,
                className="chip",
            )
            for line in lines
        ]
        missing = [r for r in run_ids if not infos.get(r)]
        notice = (
            html.Div(f"Unknown run id(s), not shown: {', '.join(missing)}", className="notice")
            if missing
            else None
        )
        logged = {k for run_keys in keys for k in run_keys}
        shown = logged_charts(WHEN_LOGGED_KEYS, logged)
        extra = sorted(logged - set(HEADLINE_KEYS) - drawn_keys(shown))
        charts = [metric_graph(key, CHART_HEIGHT) for key in shown]
        return chips, notice, [{"label": k, "value": k} for k in extra], charts

    @dash_app.callback(
        Output("compare-below", "children"),
        Output("compare-below-shown", "data"),
        Input("live-data-tick", "data"),
        State("page-state", "data"),
        State("compare-below-shown", "data"),
        prevent_initial_call=True,
    )
    async def below(tick: dict[str, Any] | None, state: dict[str, Any] | None, shown: bool | None) -> Any:
        """The summary (the runs' names first) and the parity view, once the page's charts
        are drawn (the "drawn" tick, assets/live/start.js): a grid and three more charts
        built beside the headline charts would hold back their first draw. Each fills
        itself from there (`summary`, views/parity.py). Once per page: a flag, not the
        section itself, says it is there (the grid's rows would travel on every tick)."""
        if shown or not state or state.get("page") != "compare" or "drawn" not in tick_reasons(tick):
            return no_update, no_update
        infos = await api.runs_by_id(state["runs"])
        lines = [_identity(r, info) for r, info in infos.items() if info]
        names = [{"id": line.run_id, "name": line.name, "group": line.group or "—"} for line in lines]
        return [summary_section(names), parity.panel()], True

    @dash_app.callback(
        Output("compare-extra", "children"),
        Input("opt-metrics", "value"),
        State("page-state", "data"),
    )
    def extra_charts(keys: list[str] | None, state: dict[str, Any] | None) -> list[Any]:
        if not state or state.get("page") != "compare":
            return []
        return [metric_graph(key, CHART_HEIGHT) for key in keys or []]

    @dash_app.callback(
        Output("compare-summary", "rowData"),
        Output("compare-summary-status", "children"),
        Output("compare-summary-read", "data"),
        Input("page-state", "data"),
        Input("opt-aggregate", "value"),
        Input("live-data-tick", "data"),
        Input("compare-summary-ready", "data"),  # first when the section comes (`below`)
        State("compare-summary-read", "data"),
    )
    async def summary(
        state: dict[str, Any] | None, aggregate: str | None, tick: dict[str, Any] | None, _ready: Any, read: dict[str, Any] | None
    ) -> tuple[list[dict[str, Any]], str, Any]:
        """The runs' points are read once, when the section comes (and after a reconnect, which
        may have missed some): on a live tick the summary merges the browser's tally of the
        points the socket pushed since (Headline.merged) and reads none of them again."""
        if not state or state.get("page") != "compare":
            return [], "", None
        run_ids = state["runs"]
        infos = await api.runs_by_id(run_ids)
        known = [r for r in run_ids if infos.get(r)]
        reasons = tick_reasons(tick)
        kept = ctx.triggered_id == "live-data-tick" and "reconnect" not in reasons and isinstance(read, dict) and read.get("runs") == known
        if kept:
            assert isinstance(read, dict)
            headlines = {run_id: Headline.from_json(read["headlines"].get(run_id) or {}) for run_id in known}
            stored: Any = no_update
        else:
            by_key = await asyncio.gather(*(api.series_of_runs(known, key, max_points=HISTORY_POINTS) for key in SUMMARY_KEYS))
            headlines = {run_id: Headline.of({key: of_runs[run_id] for key, of_runs in zip(SUMMARY_KEYS, by_key, strict=True)}) for run_id in known}
            stored = {"runs": known, "headlines": {run_id: h.to_json() for run_id, h in headlines.items()}}
        tally = (tick or {}).get("tally")
        if isinstance(tally, dict):
            headlines = {run_id: h.merged(tally.get(run_id) or {}) for run_id, h in headlines.items()}
        alerts = await api.alerts(known) or []
        hazard, reads, _ = await hazards(api, known)  # what the hazard chart draws: its peak is the run's
        summaries = []
        for run_id in known:
            info = infos[run_id] or {}
            run_alerts = [a for a in alerts if a.run_id == run_id]
            summaries.append(
                summarise_run(info.get("name", run_id), info.get("group"), headlines[run_id], run_alerts, hazard[run_id], reads[run_id].fall)
            )
        rows = [{**s.row(), "id": run_id} for run_id, s in zip(known, summaries, strict=True)]
        if aggregate in ("std", "stderr"):
            groups: dict[str, list[Any]] = {}
            for s in summaries:
                groups.setdefault(s.group or s.name, []).append(s)
            rows = [
                {**summarise_group(g, members).row(), "id": f"group:{g}"} for g, members in sorted(groups.items())
            ] + rows
        return rows, "", stored


def _identity(run_id: str, info: dict[str, Any]) -> RunLine:
    """A run as the colour assignment sees it (no points needed)."""
    return RunLine(run_id, str(info.get("name", run_id)), info.get("group"), Series.empty())


def _css_dash(dash: str) -> str:
    return {"solid": "solid", "dot": "dotted"}.get(dash, "dashed")

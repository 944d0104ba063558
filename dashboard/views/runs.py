"""/ — every run in a table: status, health, collapse hazard, last step, headline metrics; filter,
select, compare."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

import dash_ag_grid as dag
import httpx
from dash import ClientsideFunction, Dash, Input, Output, State, ctx, dcc, html, no_update

from dashboard.data import KeelApi
from dashboard.layout import (
    GRID_COLUMN_DEFAULTS,
    display_status,
    live_target,
    tick_reasons,
    whole_name,
)
from dashboard.series import Alert, Series
from dashboard.summary import wire
from dashboard.text import markdown_text
from dashboard.theme import CRITICAL_HAZARD, HAZARD_TOOLTIP, HEADLINE_KEYS, metric_info

__all__ = ["layout", "register", "health", "run_rows", "filter_runs", "read_error"]

SEVERITY_RANK = {"critical": 2, "warning": 1}
GRID_STYLE = {"height": "calc(100vh - 230px)", "minHeight": "320px"}
SHORT_TITLES = {
    "reward/mean": "Reward",
    "mismatch/kl": "KL",
    "gate/frac": "Gated frac.",
    "mismatch/ratio_max": "Max ratio",
    "grad/norm": "Grad norm",
}


def health(firing: Sequence[Alert] | None) -> tuple[str, str]:
    """(label, kind) of a run's health badge from its firing alerts; None = alerts unavailable."""
    if firing is None:
        return "n/a", "unknown"
    if not firing:
        return "ok", "ok"
    worst = max(firing, key=lambda a: SEVERITY_RANK.get(a.severity, 0))
    kind = worst.severity if worst.severity in SEVERITY_RANK else "warning"
    return f"{kind} · {len(firing)}", kind


def filter_runs(
    runs: Sequence[Mapping[str, Any]], filters: Mapping[str, Sequence[str] | None]
) -> list[Mapping[str, Any]]:
    """Keep runs matching every non-empty filter (any of its values): project, group, tag, status."""

    def keep(run: Mapping[str, Any]) -> bool:
        checks = {
            "project": [run.get("project")],
            "group": [run.get("group") or "(none)"],
            "tag": list(run.get("tags") or []),
            "status": [display_status(run.get("status", ""))],
        }
        return all(
            not wanted or any(value in wanted for value in checks[name])
            for name, wanted in filters.items()
        )

    return [run for run in runs if keep(run)]


def run_rows(
    runs: Sequence[Mapping[str, Any]],
    last_values: Mapping[str, Mapping[str, Series]],
    firing: Mapping[str, Sequence[Alert]] | None,
) -> list[dict[str, Any]]:
    rows = []
    for run in runs:
        label, kind = health(None if firing is None else firing.get(run["id"], []))
        row: dict[str, Any] = {
            "id": run["id"],
            "name": f"[{markdown_text(run['name'])}](/runs/{quote(run['id'], safe='')})",
            "full_name": run["name"],  # the cell's hover (title): the name as text, not markdown
            "group": run.get("group") or "",
            "project": run.get("project", ""),
            "tags": ", ".join(run.get("tags") or []),
            "status": display_status(run.get("status", "")),
            "health": label,
            "health_kind": kind,
            # GET /runs?hazard=true: only running runs have one (None while they warm up).
            "hazard": run.get("hazard") if run.get("status") == "running" else None,
            "collapsed_at": run.get("collapsed_at") if run.get("status") == "running" else None,
            "last_step": run.get("last_step"),
            "last_seen_at": run.get("last_seen_at"),
        }
        for key in HEADLINE_KEYS:
            last = last_values.get(run["id"], {}).get(key)
            row[key] = wire(last.values[-1]) if last is not None and last.values else None
        rows.append(row)
    return rows


def _columns() -> list[dict[str, Any]]:
    columns: list[dict[str, Any]] = [
        {
            "field": "name",
            "headerName": "Run",
            "cellRenderer": "markdown",
            "minWidth": 180,
            "flex": 2,
            "pinned": "left",
            **whole_name("full_name"),
        },
        {"field": "group", "headerName": "Group", "minWidth": 90, "flex": 1},
        {
            "field": "status",
            "headerName": "Status",
            "width": 100,
            "cellClass": "cell-badge",
            "cellClassRules": {
                f"cell-{s}": {"function": f"params.value == '{s}'"}
                for s in ("live", "finished", "failed", "silent")
            },
        },
        {
            "field": "health",
            "headerName": "Health",
            "width": 120,
            "cellClass": "cell-badge",
            "cellClassRules": {
                f"cell-{k}": {"function": f"params.data.health_kind == '{k}'"}
                for k in ("ok", "warning", "critical", "unknown")
            },
        },
        {
            "field": "hazard",
            "headerName": "Hazard",
            "headerTooltip": HAZARD_TOOLTIP,
            "type": "rightAligned",
            "width": 100,
            "valueFormatter": {"function": "params.data.collapsed_at != null ? 'collapsed at ' + params.data.collapsed_at : keelPercent(params.value)"},
            "cellClassRules": {
                "cell-critical": {"function": f"params.data.collapsed_at != null || (params.value != null && params.value >= {CRITICAL_HAZARD})"}
            },
        },
        {"field": "last_step", "headerName": "Last step", "type": "rightAligned", "width": 105},
    ]
    for key in HEADLINE_KEYS:
        columns.append(
            {
                "field": key,
                "headerName": SHORT_TITLES.get(key, key),
                "headerTooltip": f"{metric_info(key).title} ({key}), last value",
                "type": "rightAligned",
                "minWidth": 100,
                "flex": 1,
                "valueFormatter": {"function": "keelNumber(params.value)"},
                "cellClassRules": {"cell-nonfinite": {"function": "keelNonFinite(params.value)"}},
            }
        )
    columns += [
        {"field": "project", "headerName": "Project", "minWidth": 90, "flex": 1},
        {"field": "tags", "headerName": "Tags", "minWidth": 90, "flex": 1},
    ]
    return columns


def _filter(caption: str, component_id: str) -> html.Div:
    return html.Div(
        [
            html.Label(caption, className="caption"),
            dcc.Dropdown(id=component_id, multi=True, placeholder="all"),
        ],
        className="field",
    )


def layout() -> html.Div:
    return html.Div(
        [
            live_target("*"),
            html.Div(
                [html.H1("Runs"), html.Span(id="runs-count", className="sub")],
                className="page-title",
            ),
            html.Div(
                [
                    _filter("Project", "filter-project"),
                    _filter("Group", "filter-group"),
                    _filter("Tag", "filter-tag"),
                    _filter("Status", "filter-status"),
                    html.Div(style={"flex": 1}),
                    dcc.Link(
                        "Select runs to compare",
                        id="compare-link",
                        href="/compare",
                        className="button disabled",
                    ),
                ],
                className="toolbar panel",
            ),
            dcc.Store(id="runs-first"),
            dcc.Store(id="runs-read-at"),  # when every run was last read (time.time())
            # Says when a read fails (the runs, or their alerts): never "Loading…" forever.
            html.Div(id="runs-error", className="notice", role="alert", hidden=True),
            dag.AgGrid(
                id="runs-grid",
                columnDefs=_columns(),
                rowData=None,  # the grid's loading overlay until the first read: not "No runs yet"
                getRowId="params.data.id",
                defaultColDef=GRID_COLUMN_DEFAULTS,
                dashGridOptions={
                    "rowSelection": {
                        "mode": "multiRow",
                        "checkboxes": True,
                        "headerCheckbox": True,
                        "enableClickSelection": False,
                    },
                    "localeText": {
                        "noRowsToShow": "No runs yet. Start a trainer with keel_rl's Monitor, or run `make demo`."
                    },
                    "selectionColumnDef": {"pinned": "left", "width": 48},
                    "enableBrowserTooltips": True,
                },
                style=GRID_STYLE,
            ),
        ]
    )


FIRST_ROWS = 100
"""The newest runs the page shows first, before it has read them all (10,000 runs take
seconds to read; their first rows should not wait for them)."""
FILTERS = ("project", "group", "tag", "status")
FULL_READ_S = 60.0
"""While runs stream, a data tick names the runs whose points came (assets/live/socket.js) and
the table reads those alone; it reads every run again on any other tick (a status, an alert,
a reconnect, a filter) and at least this often (a run gone silent, one retagged)."""
NEW_RUN_SLACK_S = 1.0
"""A run named in a tick that started this long before the last full read began, or later,
is read with every run again: it may have been stored while that read ran, and not be in the
table (a run's start time is taken before its row waits its turn to be written, which under
load can take a good part of a second)."""


async def _table(api: KeelApi, chosen: Mapping[str, Sequence[str] | None], limit: int | None) -> tuple[Any, ...]:
    """The grid's rows, the count, each filter's options, the error line and the grid's style,
    from one read of the runs (only the `limit` newest when given) and one of the firing alerts."""
    try:
        runs = await api.runs(latest=HEADLINE_KEYS, hazard=True, limit=limit)
    except Exception as exc:  # noqa: BLE001 - whatever it was, the page says so
        # The grid hidden: its loading overlay would say "Loading…" for a read that failed.
        message = f"Could not read the runs: {read_error(exc)}. Retrying on the next update."
        hidden_grid = {**GRID_STYLE, "display": "none"}
        return (no_update, "", *(no_update for _ in FILTERS), message, False, hidden_grid)
    shown = filter_runs(runs, chosen)
    # One read of every firing alert, joined here: never one run_id per shown run in the URL.
    firing = await api.firing_alerts()
    by_run = None if firing is None else _group_alerts(firing)
    options = {
        "project": sorted({r["project"] for r in runs}),
        "group": sorted({r.get("group") or "(none)" for r in runs}),
        "tag": sorted({t for r in runs for t in r.get("tags") or []}),
        "status": ["live", "finished", "failed", "silent"],
    }
    count = f"{len(shown)} of {len(runs)}" if len(shown) != len(runs) else f"{len(runs)}"
    if limit is not None and len(runs) == limit:
        count = f"the newest {len(shown)}, reading the rest…"
    error = "Could not read the alerts: health shows n/a." if firing is None else ""
    return (run_rows(shown, _latest(shown), by_run), count, *(options[name] for name in FILTERS), error, not error, GRID_STYLE)


def _latest(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Series]]:
    return {
        run["id"]: {
            key: Series.from_json({"steps": [point["step"]], "values": [point["value"]]})
            for key, point in (run.get("latest") or {}).items()
        }
        for run in runs
    }


async def _streamed_rows(
    api: KeelApi, chosen: Mapping[str, Sequence[str] | None], tick: dict[str, Any] | None, read_at: float | None
) -> list[dict[str, Any]] | None:
    """The rows of the runs a points tick names, read alone (their status, last step, hazard,
    headline values and firing alerts); None when every run is to be read again: another
    reason in the tick, no runs named (too many), no full read in FULL_READ_S, a run started
    since that read (not in the table yet), a read that failed (the full read says why)."""
    ids = (tick or {}).get("runs")
    if tick_reasons(tick) != {"points"} or not isinstance(ids, list) or read_at is None:
        return None
    if time.time() - read_at >= FULL_READ_S:
        return None
    try:
        runs = await api.runs(run_ids=[str(run_id) for run_id in ids], latest=HEADLINE_KEYS, hazard=True)
        if any(datetime.fromisoformat(run["started_at"]).timestamp() >= read_at - NEW_RUN_SLACK_S for run in runs):
            return None
        firing = await api.alerts([run["id"] for run in runs], state="firing")
    except Exception:  # noqa: BLE001 - the full read that follows says what went wrong
        return None
    shown = filter_runs(runs, chosen)
    return run_rows(shown, _latest(shown), None if firing is None else _group_alerts(firing))


def register(dash_app: Dash, api: KeelApi) -> None:
    outputs = (
        Output("runs-grid", "rowData"),
        Output("runs-count", "children"),
        *(Output(f"filter-{name}", "options") for name in FILTERS),
        Output("runs-error", "children"),
        Output("runs-error", "hidden"),
        Output("runs-grid", "style"),
    )

    # First the newest FIRST_ROWS runs, as soon as the page is there; then (runs-first set)
    # all of them, and again on each filter change and live tick.
    @dash_app.callback(
        *(Output(o.component_id, o.component_property, allow_duplicate=True) for o in outputs),
        Output("runs-first", "data"),
        Input("runs-grid", "id"),
        prevent_initial_call="initial_duplicate",
    )
    async def first_rows(_: str) -> tuple[Any, ...]:
        return (*await _table(api, {}, FIRST_ROWS), True)

    @dash_app.callback(
        *outputs,
        Output("runs-grid", "rowTransaction"),
        Output("runs-read-at", "data"),
        *(Input(f"filter-{name}", "value") for name in FILTERS),
        Input("live-data-tick", "data"),
        Input("runs-first", "data"),
        State("runs-read-at", "data"),
        prevent_initial_call=True,
    )
    async def table(*args: Any) -> tuple[Any, ...]:
        chosen = dict(zip(FILTERS, args[: len(FILTERS)], strict=True))
        tick, _first, read_at = args[len(FILTERS) :]
        if ctx.triggered_id == "live-data-tick":
            rows = await _streamed_rows(api, chosen, tick, read_at)
            if rows is not None:  # those rows changed in place, by id; the rest as they were
                return (*(no_update for _ in outputs), {"update": rows} if rows else no_update, no_update)
        started = time.time()
        return (*await _table(api, chosen, None), no_update, started)

    dash_app.clientside_callback(
        ClientsideFunction("keel_runs", "compare_link"),
        Output("compare-link", "href"),
        Output("compare-link", "className"),
        Output("compare-link", "children"),
        Input("runs-grid", "selectedRows"),
    )


def read_error(exc: BaseException) -> str:
    """What went wrong with a read, in a few words: the API's status and detail, or the error."""
    if isinstance(exc, httpx.HTTPStatusError):
        response = exc.response
        detail = ""
        try:
            payload = response.json()
            detail = str(payload.get("detail", "")) if isinstance(payload, dict) else ""
        except ValueError:
            detail = response.text[:200]
        path = response.request.url.path
        return f"HTTP {response.status_code} from GET {path}" + (f" ({detail})" if detail else "")
    first_line = str(exc).strip().split("\n", 1)[0][:200]  # not a whole SQL statement
    return f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__


def _group_alerts(alerts: Sequence[Alert]) -> dict[str, list[Alert]]:
    grouped: dict[str, list[Alert]] = {}
    for alert in alerts:
        if alert.state == "firing":
            grouped.setdefault(alert.run_id, []).append(alert)
    return grouped

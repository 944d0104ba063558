"""The compare page's parity view: is B's sampler–learner mismatch the same as A's?

A and B are two of the page's runs, or two of its groups (a group's runs are seeds of one
setting, as `keel parity A1,A2 B1,B2` takes them). The verdict is `keel parity`'s
(docs/parity.md), reached by the same code (wire/parity.py `compare_groups`), with the
same statement of what was compared and what it could have detected, on the same per-step
values, read here through the REST API
as the command reads them: every point of the scalars in the range, and the
`mismatch/log_ratio` histogram of every step (paged by DISTRIBUTION_PAGE steps). Beside it,
the two sides' histograms summed over the range and overlaid, their difference per bin, and
their tails over steps (parity_figures.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from dashboard.data import KeelApi
from dashboard.figures import message_figure
from dashboard.layout import data_attributes
from dashboard.parity_figures import (
    SIDE_COLOURS,
    HistogramSide,
    TailLine,
    difference_figure,
    overlay_figure,
    summed,
    tails_figure,
)
from dashboard.series import Series
from wire.parity import (
    DEFAULT_TAUS,
    HISTOGRAM_KEY,
    SCALAR_KEYS,
    ParityError,
    ParityReport,
    compare_groups,
    header,
    histogram_values,
    joined_pages,
)

__all__ = ["panel", "register", "side_choices"]

CHART_HEIGHT = 300
SERIES_POINTS = 100_000
"""The most points GET /series answers unbucketed: a range with more steps is refused (the
test needs every step's value, as `keel parity` reads them)."""
DISTRIBUTION_PAGE = 5000
"""The most steps GET /runs/{id}/distributions answers unbucketed."""
TAIL_KEYS = {"mismatch/tail_frac": "solid", "mismatch/low_tail_frac": "dot"}
VERDICT_TITLES = {"same": "Same", "different": "Different", "incomparable": "Cannot compare", "cannot tell": "Cannot tell"}
WAITING = "Waiting for the page's runs"
"""The charts' message until the first verdict: the choices come with the first data tick."""
GRAPHS = ("parity-overlay", "parity-difference", "parity-tails")
REDRAW_S = 60.0
"""While runs stream, the verdict is recomputed on a data tick at most this often (it reads
every point of the range): a verdict is about many steps, and the headline charts come first."""


def _field(caption: str, control: Any) -> html.Div:
    return html.Div([html.Label(caption, className="caption"), control], className="field")


def _graph(graph_id: str) -> html.Div:
    return html.Div(
        dcc.Graph(
            id=graph_id,
            figure=message_figure(WAITING, CHART_HEIGHT),
            style={"height": f"{CHART_HEIGHT}px"},
            config={"displaylogo": False, "responsive": True, "modeBarButtons": [["toImage", "zoom2d", "resetScale2d"]]},
        ),
        className="chart-card",
    )


def panel() -> html.Div:
    """The view's section of the compare page."""
    def step(component_id: str) -> dcc.Input:
        return dcc.Input(id=component_id, type="number", min=0, step=1, debounce=True, placeholder="all")

    return html.Div(
        [
            html.H2("Parity: is B's mismatch the same as A's?"),
            html.P(
                ["The verdict of ", html.Code("keel parity A B"), " (the same code, on the same per-step values): "
                 "each run cut into blocks of steps; one run a side compared block by block against a margin "
                 "that holds seed-to-seed variation (B/A within 2×), a group's runs taken as seeds (their spread "
                 "is the noise, margin 1.25×); same, different, or cannot tell."],
                className="sub",
            ),  # fmt: skip
            html.Div(
                [
                    _field("A (reference)", dcc.Dropdown(id="parity-a", clearable=False)),
                    _field("B", dcc.Dropdown(id="parity-b", clearable=False)),
                    _field("From step", step("parity-from")),
                    _field("To step", step("parity-to")),
                ],
                className="toolbar",
            ),
            dcc.Store(id="parity-ready", data=True),  # the first choices follow from it
            html.Div(id="parity-progress", className="sub"),
            html.Div(id="parity-result"),
            dcc.Store(id="parity-drawn-at"),
            dcc.Store(id="parity-redraw"),
            html.Div([_graph(graph_id) for graph_id in GRAPHS], className="charts", style={"marginTop": "12px"}),
        ],
        id="parity",
        className="panel section",
    )


def side_choices(run_ids: Sequence[str], infos: dict[str, dict[str, Any] | None]) -> tuple[list[dict[str, str]], str | None, str | None]:
    """The dropdowns' options (each run, then each group when there are two or more) and the
    first choice of A and B: the first two groups when the runs fall in two or more and a
    group has several runs, else the first two runs."""
    known = [run_id for run_id in run_ids if infos.get(run_id)]
    group_of = {r: str((infos[r] or {}).get("group") or "") for r in known}
    groups = list(dict.fromkeys(group for group in group_of.values() if group))
    options = [{"label": f"run {(infos[r] or {}).get('name', r)}", "value": f"run:{r}"} for r in known]
    if len(groups) >= 2:
        options += [{"label": f"group {group}", "value": f"group:{group}"} for group in groups]
        if len(set(group_of.values())) < len(known):
            return options, f"group:{groups[0]}", f"group:{groups[1]}"
    if len(known) >= 2:
        return options, f"run:{known[0]}", f"run:{known[1]}"
    return options, None, None


def _members(choice: str, run_ids: Sequence[str], infos: dict[str, dict[str, Any] | None]) -> list[str]:
    kind, _, name = choice.partition(":")
    known = [run_id for run_id in run_ids if infos.get(run_id)]
    if kind == "group":
        return [r for r in known if str((infos[r] or {}).get("group")) == name]
    return [name] if name in known else []


@dataclass
class RunRead:
    """What one run has in the range, as `keel parity` reads it (keel/parity.py read_run)."""

    name: str
    values: dict[str, list[float]] = field(default_factory=dict)
    tails: dict[str, Series] = field(default_factory=dict)
    edges: list[float] = field(default_factory=list)
    counts: list[list[int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


async def _distributions(api: KeelApi, run_id: str, start: int | None, end: int | None) -> tuple[list[float], list[list[int]], list[int], int]:
    """Edges, per-step counts and NaN counts of the histogram in start..end, every step on its
    own (windows of DISTRIBUTION_PAGE steps when the range holds more)."""
    found = await api.distributions(run_id, HISTOGRAM_KEY, start=start, end=end, max_steps=DISTRIBUTION_PAGE)
    if not found or not found.get("steps"):
        return [], [], [], int((found or {}).get("left_out") or 0)
    if not found["bucketed"]:
        return found["edges"], found["counts"], found["nan"], found["left_out"]
    low, high = start or 0, end if end is not None else int(found["steps"][-1])
    parts = await asyncio.gather(*(
        api.distributions(run_id, HISTOGRAM_KEY, start=window, end=min(window + DISTRIBUTION_PAGE - 1, high), max_steps=DISTRIBUTION_PAGE)
        for window in range(low, high + 1, DISTRIBUTION_PAGE)
    ))  # fmt: skip
    return joined_pages(parts)


async def read_runs(
    api: KeelApi, run_ids: list[str], names: dict[str, str], start: int | None, end: int | None
) -> dict[str, RunRead]:
    """Each run's per-step parity values in start..end, its tails and its histograms."""
    stored = {run_id: set(found) for run_id, found in (await api.keys_of_runs(run_ids)).items()}
    scalars = await asyncio.gather(*(
        api.series_of_runs([r for r in run_ids if key in stored[r]], key, max_points=SERIES_POINTS, start=start, end=end)
        for key in SCALAR_KEYS
    ))  # fmt: skip
    histograms = await asyncio.gather(*(_distributions(api, run_id, start, end) for run_id in run_ids))
    reads = {}
    for run_id, (edges, counts, nans, left_out) in zip(run_ids, histograms, strict=True):
        read = RunRead(names[run_id], edges=edges, counts=counts)
        for key, of_runs in zip(SCALAR_KEYS, scalars, strict=True):
            series = of_runs.get(run_id)
            if series is None:
                continue
            if series.downsampled:
                read.notes.append(f"{key}: more than {SERIES_POINTS} steps in the range: not compared (narrow the range)")
                continue
            read.values[key] = list(series.values)
            if key in TAIL_KEYS:
                read.tails[key] = series
        if left_out:
            read.notes.append(f"{left_out} step(s) of {HISTOGRAM_KEY} have other bin edges than the newest: left out")
        if counts:
            from_histograms, histogram_notes = histogram_values(edges, counts, nans, DEFAULT_TAUS)
            read.values.update(from_histograms)
            read.notes += histogram_notes
        reads[run_id] = read
    return reads


@dataclass(frozen=True)
class Parity:
    """The view's content: the verdict (a report, or why there is none) and the figures."""

    label_a: str
    label_b: str
    report: ParityReport | None
    error: str | None
    figures: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


def parity_of(label_a: str, label_b: str, reads_a: Sequence[RunRead], reads_b: Sequence[RunRead]) -> Parity:
    """The verdict on A's runs against B's (a side's runs taken as seeds), and the figures."""
    report: ParityReport | None = None
    error: str | None = None
    try:
        report = compare_groups([r.values for r in reads_a], [r.values for r in reads_b])
    except ParityError as exc:
        error = str(exc)
    run_notes = [
        f"run {side}{f' ({read.name})' if len(reads) > 1 else ''}: {note}"
        for side, reads in (("A", reads_a), ("B", reads_b))
        for read in reads
        for note in dict.fromkeys(read.notes)
    ]
    if report is not None:
        report.notes = run_notes + report.notes
        report.runs = {"a": {"name": label_a}, "b": {"name": label_b}}
    figure_notes, overlay, difference = _histogram_figures(label_a, label_b, reads_a, reads_b)
    if report is not None:
        report.notes += figure_notes
    lines = [
        TailLine(f"{side.upper()} {read.name}{' (low)' if dash == 'dot' else ''}", SIDE_COLOURS[side], dash,
                 list(read.tails[key].steps), list(read.tails[key].values))
        for side, reads in (("a", reads_a), ("b", reads_b))
        for read in reads
        for key, dash in TAIL_KEYS.items()
        if key in read.tails
    ]  # fmt: skip
    return Parity(label_a, label_b, report, error, (overlay, difference, tails_figure(lines, CHART_HEIGHT)))


def _histogram_figures(
    label_a: str, label_b: str, reads_a: Sequence[RunRead], reads_b: Sequence[RunRead]
) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Each side's histograms summed over its steps and runs, on the edges of the first run
    that has any (a run on other edges is left out of the charts, with a note)."""
    edges = next((read.edges for read in [*reads_a, *reads_b] if read.counts), [])
    notes = []
    sides = []
    for side, label, reads in (("a", label_a, reads_a), ("b", label_b, reads_b)):
        counts = [0] * max(len(edges) - 1, 0)
        for read in reads:
            if not read.counts:
                continue
            if read.edges != edges:
                notes.append(f"{read.name}: other {HISTOGRAM_KEY} bin edges than {label_a}'s: left out of the charts")
                continue
            counts = [total + count for total, count in zip(counts, summed(read.counts, len(counts)), strict=True)]
        sides.append(HistogramSide(f"{side.upper()}: {label}", SIDE_COLOURS[side], counts))
    return notes, overlay_figure(edges, sides, CHART_HEIGHT), difference_figure(edges, sides[0], sides[1], CHART_HEIGHT)


def verdict_view(parity: Parity) -> html.Div:
    """The verdict as `keel parity` says it (its summary line), what was compared (its method
    line), its table (with what each metric could have detected) and its notes."""
    report = parity.report
    verdict = "incomparable" if report is None else report.verdict
    if report is None:
        line = f"{parity.label_a} and {parity.label_b}: {parity.error}"
    else:
        line = report.summary()
    children: list[Any] = [
        html.Div(
            [html.Strong(VERDICT_TITLES[verdict]), html.Span(line, className="parity-summary")],
            id="parity-verdict",
            className=f"parity-verdict {verdict.replace(' ', '-')}",
            **data_attributes(verdict=verdict),
        )
    ]
    if report is not None:
        children.append(html.P(f"method: {report.method}", id="parity-method", className="sub"))
        rows = [
            html.Tr(
                [html.Td(cell) for cell in row],
                className=f"parity-metric {metric.verdict.replace(' ', '-')}",
                **data_attributes(key=metric.key),
            )
            for metric, row in zip(report.metrics, report.rows(), strict=True)
        ]
        columns = html.Thead(html.Tr([html.Th(h) for h in header(report.alpha)]))
        children.append(html.Table([columns, html.Tbody(rows)], className="parity-table"))
        if report.notes:
            children.append(html.Ul([html.Li(note) for note in report.notes], className="parity-notes"))
    return html.Div(children)


def register(dash_app: Dash, api: KeelApi) -> None:
    # The choices (and so the first verdict) come with the panel, which the compare page adds
    # once its headline charts are drawn (views/compare.py `below`), so the parity reads never
    # compete with them; later data ticks change nothing unless the page's runs did.
    @dash_app.callback(
        Output("parity-a", "options"),
        Output("parity-a", "value"),
        Output("parity-b", "options"),
        Output("parity-b", "value"),
        Input("live-data-tick", "data"),
        Input("parity-ready", "data"),
        State("page-state", "data"),
        State("parity-a", "options"),
    )
    async def choices(_tick: Any, _ready: Any, state: dict[str, Any] | None, shown: list[dict[str, str]] | None) -> tuple[Any, Any, Any, Any]:
        if not state or state.get("page") != "compare":
            return [], None, [], None
        run_ids = state["runs"]
        options, a, b = side_choices(run_ids, await api.runs_by_id(run_ids))
        if options == shown:
            return no_update, no_update, no_update, no_update
        return options, a, options, b

    # A data tick asks for a new verdict only when one is drawn and older than REDRAW_S: the
    # first comes from the choices above, and a tick that changes nothing runs no reads.
    @dash_app.callback(
        Output("parity-redraw", "data"),
        Input("live-data-tick", "data"),
        State("parity-a", "value"),
        State("parity-b", "value"),
        State("parity-drawn-at", "data"),
        prevent_initial_call=True,
    )
    def due(_tick: Any, a: str | None, b: str | None, drawn_at: float | None) -> Any:
        if not a or not b or drawn_at is None or time.time() - drawn_at < REDRAW_S:
            return no_update
        return time.time()

    @dash_app.callback(
        Output("parity-result", "children"),
        *(Output(graph_id, "figure") for graph_id in GRAPHS),
        Output("parity-drawn-at", "data"),
        Input("parity-a", "value"),
        Input("parity-b", "value"),
        Input("parity-from", "value"),
        Input("parity-to", "value"),
        Input("parity-redraw", "data"),
        State("page-state", "data"),
        # While the reads and the test run, say so: never a stale prompt while A and B are picked.
        running=[(Output("parity-progress", "children"), "Comparing A and B: reading every step of the range…", "")],
        prevent_initial_call=True,
    )
    async def draw(
        a: str | None, b: str | None, start: Any, end: Any, _redraw: Any, state: dict[str, Any] | None
    ) -> tuple[Any, ...]:
        if not state or state.get("page") != "compare" or not a or not b:
            message = message_figure("Pick A and B: two runs, or two groups", CHART_HEIGHT)
            return (html.Div("Pick A and B: two runs, or two groups.", className="sub"), message, message, message, None)
        run_ids = state["runs"]
        infos = await api.runs_by_id(run_ids)
        members_a, members_b = _members(a, run_ids, infos), _members(b, run_ids, infos)
        names = {r: str((infos[r] or {}).get("name", r)) for r in [*members_a, *members_b]}
        first = None if start in (None, "") else max(0, int(start))
        last = None if end in (None, "") else max(0, int(end))
        if first is not None and last is not None and first > last:
            first, last = last, first
        reads = await read_runs(api, list(dict.fromkeys([*members_a, *members_b])), names, first, last)
        label_a, label_b = (_label(choice, names) for choice in (a, b))
        parity = parity_of(label_a, label_b, [reads[r] for r in members_a], [reads[r] for r in members_b])
        return (verdict_view(parity), *parity.figures, time.time())


def _label(choice: str, names: dict[str, str]) -> str:
    kind, _, name = choice.partition(":")
    return f"group {name}" if kind == "group" else names.get(name, name)

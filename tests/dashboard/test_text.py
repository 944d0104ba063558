"""What a trainer sends is text: every figure builder, the runs table and the token view show a
planted key, name, group, rule or message as its characters (dashboard.text); the browser
side is tests/dashboard/test_browser_markup.py."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dashboard.detail_figures import Distribution, distribution_figure, sequences_figure
from dashboard.figures import ChartOptions, hazard_figure, message_figure, metric_figure
from dashboard.series import Alert, Series
from dashboard.text import markdown_text, plot_text
from dashboard.tokens import sample_card
from dashboard.traces import RunLine
from dashboard.views.runs import run_rows

LINK = '<a href="https://evil.example/phish">click-me</a>'
LOOK = "<span style='color:red;font-size:40px'>big</span>"
TEMPLATE = "%{y} 100%{meta.key}<br>"
KEY = f"probe/{LINK}{TEMPLATE}"
NAME = f"{LOOK} & {TEMPLATE}"
GROUP = f"grp {LINK}"
PLANTED = (LINK, LOOK, TEMPLATE)

# plotly.js's own entity table (src/constants/string_mappings.js): what its text decodes.
_PLOTLY_ENTITIES = {"mu": "μ", "amp": "&", "lt": "<", "gt": ">", "nbsp": "\u00a0", "times": "×", "plusmn": "±", "deg": "°"}


def plotly_decode(text: str) -> str:
    """Text as Plotly draws it once any tags are gone: its entities decoded (convertEntities)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name.startswith("#x"):
            return chr(int(name[2:], 16))
        if name.startswith("#"):
            return chr(int(name[1:]))
        return _PLOTLY_ENTITIES.get(name, match.group(0))

    return re.sub(r"&(#\d+|#x[\da-fA-F]+|[a-z]+);", one, text)


def _markup_free(text: str) -> bool:
    """No tag Plotly would render and no %{...} it would fill."""
    return "<" not in text and ">" not in text and "%{" not in text


@given(st.text())
def test_plot_text_leaves_no_tag_or_template_and_plotly_draws_the_characters_sent(value: str) -> None:
    shown = plot_text(value)
    assert _markup_free(shown)
    assert plotly_decode(shown) == value


def test_plot_text_examples() -> None:
    assert plot_text(LINK) == '&lt;a href="https://evil.example/phish"&gt;click-me&lt;/a&gt;'
    assert plot_text("a &lt; b") == "a &amp;lt; b"  # an entity sent is shown as typed
    assert plot_text("100%{y}") == "100&#37;{y}"
    assert plot_text("Sampler–learner KL (μ‖π)") == "Sampler–learner KL (μ‖π)"


@given(st.text())
def test_markdown_text_escapes_every_ascii_punctuation(value: str) -> None:
    escaped = markdown_text(value)
    assert re.sub(r"\\(.)", r"\1", escaped, flags=re.S) == value
    assert not re.search(r"(?<!\\)[<>\[\]()&*_`!]", escaped.replace("\\\\", ""))


def _shown_texts(figure: dict[str, Any]) -> list[str]:
    """Every string Plotly draws as text in a figure: titles, axis titles, annotations, and each
    trace's name, hover template and text."""
    layout = figure["layout"]
    texts = [layout["title"]["text"], layout["xaxis"]["title"]["text"], layout["yaxis"]["title"]["text"]]
    texts += [a["text"] for a in layout["annotations"]]
    for trace in figure["data"]:
        texts += [trace.get("name") or "", trace.get("hovertemplate") or ""]
        texts += [t for t in trace.get("text") or [] if isinstance(t, str)]
    return texts


def _assert_text_only(figure: dict[str, Any]) -> None:
    """None of the planted markup reaches the figure's text as markup; and no hover template
    holds a trainer's string in any form (it comes in as data that the template names)."""
    for text in _shown_texts(figure):
        for planted in PLANTED:
            assert planted not in text, (planted, text)
    for trace in figure["data"]:
        template = trace.get("hovertemplate") or ""
        assert "evil.example" not in template and "40px" not in template and "meta.key" not in template, template


def _lines() -> list[RunLine]:
    return [
        RunLine("a", NAME, GROUP, Series([0, 1, 2, 3], [1.0, 2.0, float("nan"), 4.0], mins=[0.5] * 4, maxs=[1.5] * 4)),
        RunLine("b", "b", GROUP, Series([0, 1, 2, 3], [1.0, 1.5, 2.0, float("inf")])),
    ]


def _alerts(key: str) -> list[Alert]:
    return [
        Alert("1", "a", f"rule {LINK}", key, "critical", "firing", 1, None, f"non-finite {KEY}=nan at step 1"),
        Alert("2", "a", f"rule {LOOK}", key, "warning", "resolved", 0, 2, TEMPLATE),
    ]


def test_metric_figure_shows_a_planted_key_names_groups_and_alerts_as_text() -> None:
    figure = metric_figure(KEY, _lines(), _alerts(KEY), ChartOptions(smoothing=0.6), backtest=_alerts(KEY))
    _assert_text_only(figure)
    layout = figure["layout"]
    assert layout["title"]["text"] == f"<b>{plot_text(KEY)}</b>"  # our <b> around their text
    assert layout["yaxis"]["title"]["text"] == plot_text(KEY.rsplit("/", 1)[-1])
    names = {(t["meta"].get("role"), t["name"]) for t in figure["data"] if t["meta"].get("run") == "a"}
    assert names >= {("raw", plot_text(NAME)), ("smooth", plot_text(NAME)), ("nonfinite", plot_text(NAME))}
    assert ("envelope", plot_text(f"{NAME} min–max")) in names
    alerts = next(t for t in figure["data"] if t["meta"]["role"] == "alerts")
    assert alerts["hovertemplate"] == "%{text}<extra>alert</extra>"
    assert alerts["text"][0] == plot_text(f"critical · rule {LINK} · {NAME} (firing)") + "<br>" + plot_text(f"non-finite {KEY}=nan at step 1")
    assert plotly_decode(alerts["text"][1].split("<br>")[1]) == TEMPLATE  # their <br> is text, ours breaks the line
    backtest = next(t for t in figure["data"] if t["meta"]["role"] == "backtest")
    assert plot_text(f"rule {LINK}") in backtest["text"][0]
    # A known metric's own title says "<" as text too ("μ < 1e-3").
    known = metric_figure("mismatch/log_ratio_abs_rare", _lines())
    assert plotly_decode(known["layout"]["title"]["text"]).startswith("<b>Mean |log ratio|, μ < 1e-3</b>")
    assert _markup_free(known["layout"]["title"]["text"].replace("<b>", "").replace("</b>", "").split("<span")[0])


def test_metric_figure_groups_and_empty_notes_as_text() -> None:
    grouped = metric_figure(KEY, _lines(), options=ChartOptions(smoothing=0.0, aggregate="std"))
    _assert_text_only(grouped)
    mean = next(t for t in grouped["data"] if t["meta"]["role"] == "mean")
    assert mean["name"] == plot_text(f"{GROUP} (n=2)")
    members = [t["name"] for t in grouped["data"] if t["meta"]["role"] == "member"]
    assert plot_text(NAME) in members
    empty = metric_figure(KEY, [RunLine("a", NAME, None, Series.empty())])
    _assert_text_only(empty)
    assert empty["layout"]["annotations"][0]["text"] == f"No points for {plot_text(KEY)} yet — waiting for data"


def test_hazard_figure_names_runs_as_text() -> None:
    figure = hazard_figure(_lines(), 50)
    _assert_text_only(figure)
    assert [t["name"] for t in figure["data"]] == [plot_text(NAME), "b"]


def test_message_figure_shows_its_message_as_text() -> None:
    figure = message_figure(f"No run {NAME}")
    _assert_text_only(figure)
    assert plotly_decode(figure["layout"]["annotations"][0]["text"]) == f"No run {NAME}"


def test_step_detail_figures_hold_no_trainer_text() -> None:
    """The heatmap's key (a histogram key the trainer chose) is only its meta; the length
    scatter has no trainer string at all."""
    edges = [-1.0, 0.0, 1.0]
    dist = Distribution(KEY, edges, [1, 2], [[1, 2], [3, 4]], nans=[0, 1])
    figure = distribution_figure(dist, title="t")
    _assert_text_only(figure)
    assert figure["layout"]["meta"]["key"] == KEY
    assert all(KEY not in text and plot_text(KEY) not in text for text in _shown_texts(figure))
    scatter = sequences_figure(
        {"steps": [1, 2], "length": [10, 20], "log_ratio": [0.1, 0.2], "fit": {"slope_per_1k": 1.0, "intercept": 0.0, "n": 2}},
        title="t",
    )
    _assert_text_only(scatter)


def test_the_runs_table_links_a_run_by_its_name_as_text() -> None:
    run = {"id": "r/1", "name": f"{LINK}](https://evil.example) *x*", "group": GROUP, "tags": [LOOK], "status": "running"}
    (row,) = run_rows([run], {}, {})
    label, target = re.fullmatch(r"\[(.*)\]\((.*)\)", row["name"], flags=re.S).groups()  # type: ignore[union-attr]
    assert re.sub(r"\\(.)", r"\1", label) == run["name"] and target == "/runs/r%2F1"
    assert row["group"] == GROUP and row["tags"] == LOOK  # plain cells: the grid writes text


def _strings(component: Any) -> list[str]:
    """Every string child of a Dash component tree (React writes each as a text node)."""
    if isinstance(component, str):
        return [component]
    if isinstance(component, (list, tuple)):
        return [s for child in component for s in _strings(child)]
    children = getattr(component, "children", None)
    return _strings(children) if children is not None else []


def test_the_token_view_shows_tokens_as_text() -> None:
    token = f" {LINK}"
    sample = {"seq_id": LOOK, "length": 2, "start": 0, "worst": 0, "advantage": 1.0, "tokens": [token, "x"], "log_ratio": [0.5, 0.0]}
    card = sample_card(1, sample)
    strings = _strings(card)
    assert token in strings and LOOK in strings  # children as sent: text nodes, not markup
    spans = card.children[1].children
    assert spans[0].title.startswith(repr(token))

"""The signals beside the headline charts in headless Chromium: the entropy with each run's
learned level and start, the loss's magnitude, the length against its cap and the share of answers cut
at it; drawn when a run logs them (and appended live), absent when it does not."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import pytest

from tests.support.browser import (
    chart_order,
    console_errors,
    drawn_charts,
    line_styles,
    live_state,
    live_stats,
    screenshot,
    set_viewport,
    text_of,
    wait_until,
)
from tests.support.toy_runs import HEADLINE, LiveRun

pytestmark = pytest.mark.browser

SIGNALS = ["policy/entropy", "|loss|", "response/length_mean", "response/truncated_frac"]
LEARNED_AT = 100
"""The reward steps from 0 to 1 at this step, its spread 0.1: its EWMA (0.3) is 3 initial spreads
above its start at once, so the run has learned here (the alert detector's RewardGain)."""
CAP = 512.0

CHART_JS = """
var key = arguments[0];
var gd = Array.from(document.querySelectorAll('.keel-graph .js-plotly-plot')).find(function (g) {
  return g.layout && g.layout.meta && g.layout.meta.key === key;
});
if (!gd || !gd.layout.meta.render_id || !gd._fullLayout) return null;
return {
  render: gd.layout.meta.render_id,
  meta: JSON.parse(JSON.stringify(gd.layout.meta)),
  title: gd._fullLayout.title.text,
  ytitle: gd._fullLayout.yaxis.title.text,
  yaxis: gd._fullLayout.yaxis.type,
  yrange: gd._fullLayout.yaxis.range.slice(),
  notes: (gd.layout.annotations || []).map(function (a) { return a.text; }),
  shapes: (gd.layout.shapes || []).map(function (s) {
    return {name: s.name || null, y0: s.y0, y1: s.y1, dash: s.line ? s.line.dash : null,
            colour: s.line ? s.line.color : null, label: s.label ? s.label.text : null};
  }),
  traces: (gd.data || []).map(function (t) {
    var m = t.meta || {};
    return {role: m.role || null, run: m.run || null, key: m.key || null,
            dash: t.line ? t.line.dash : null, colour: t.line ? t.line.color : null,
            x: Array.from(t.x || []), y: Array.from(t.y || [])};
  }),
};
"""


def chart(browser: Any, key: str) -> dict[str, Any] | None:
    """The chart of `key` as drawn from server data (None while loading or absent)."""
    return browser.execute_script(CHART_JS, key)  # type: ignore[no-any-return]


def trace(found: dict[str, Any], role: str, run_id: str) -> dict[str, Any]:
    return next(t for t in found["traces"] if t["role"] == role and t["run"] == run_id)


def level_lines(found: dict[str, Any], kind: str = "level") -> dict[str, dict[str, Any]]:
    """Run id -> its learned level's line (`kind` "start": its start's)."""
    return {s["name"][len(kind) + 1 :]: s for s in found["shapes"] if (s["name"] or "").startswith(f"{kind}:")}


def signal_values(step: int, *, learned_at: int | None = LEARNED_AT, loss_key: str = "loss/total") -> dict[str, Any]:
    """A run that learns at `learned_at` (None: logs no reward) and then collapses onto one answer:
    entropy 3.0 over its first 50 steps, 1.5 until it learns, then 0.2; a negative loss
    growing in size; answers growing to the cap."""
    if learned_at is None:
        entropy = 0.5 + step / 100
        values: dict[str, Any] = {}
    else:
        entropy = 3.0 if step < 50 else 1.5 if step <= learned_at else 0.2
        values = {"reward/mean": 0.0 if step < learned_at else 1.0, "reward/std": 0.1}
    length = min(CAP, 100.0 + 3.0 * step)  # at the cap from step 138
    return {
        **values,
        "policy/entropy": entropy,
        loss_key: -0.01 * (1 + step / 10),
        "response/length_mean": length,
        "response/length_cap": CAP,
        "response/truncated_frac": 1.0 if length >= CAP else 0.0,
        "policy/clip_frac": 0.02,
    }


def send(run: LiveRun, steps: range, **kwargs: Any) -> None:
    run.send([{"step": s, "values": signal_values(s, **kwargs)} for s in steps])


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_run_page_draws_the_signals_a_run_logs_beside_the_headline_charts(server, browser, artifacts) -> None:
    run = LiveRun(server, "signals", "grpo")
    send(run, range(200))
    set_viewport(browser, 1280, 2000)
    browser.get(f"{server.url}/runs/{run.id}")
    drawn_charts(browser, 8)  # reward/mean (its only headline metric), 4 signals, 3 others
    assert chart_order(browser) == ["reward/mean", "hazard", *SIGNALS, "loss/total", "policy/clip_frac", "reward/std"]
    namespaces = browser.execute_script(
        "return Array.from(document.querySelectorAll('.namespace')).map(function (e) { return e.textContent; })"
    )
    assert namespaces == ["headline", "signals", "step details", "loss", "policy", "reward"]

    # Entropy, on a log axis, with the learned level: the median of the 50 values before
    # the reward rose (1.5), not the first steps' (3.0) nor the collapse after (0.2).
    entropy = wait_until(lambda: chart(browser, "policy/entropy"), message="entropy chart")
    assert entropy["yaxis"] == "log" and entropy["ytitle"] == "nats / token"
    assert trace(entropy, "raw", run.id)["y"] == [signal_values(s)["policy/entropy"] for s in range(200)]
    (level,) = level_lines(entropy).values()
    assert level["y0"] == level["y1"] == pytest.approx(1.5, rel=1e-12)
    assert level["dash"] == "dash" and level["label"] == "learned level 1.5"
    assert entropy["meta"]["levels"] == {run.id: pytest.approx(1.5, rel=1e-12)} and entropy["meta"]["pending"] == []
    # And its start, dotted: the median of its first 10 values ("entropy far above its start").
    (start,) = level_lines(entropy, "start").values()
    assert start["y0"] == start["y1"] == 3.0 and start["dash"] == "dot" and start["label"] == "start 3"
    assert entropy["meta"]["starts"] == {run.id: 3.0} and entropy["meta"]["pending_start"] == []
    low, high = entropy["yrange"]  # the axis holds the line and the lines (log10 units)
    assert low < math.log10(0.2) and high > math.log10(3.0)

    # The loss's magnitude: |loss/total| on a log axis, titled as such.
    loss = chart(browser, "|loss|")
    assert loss is not None and loss["yaxis"] == "log" and loss["ytitle"] == "|loss| (sign dropped)"
    assert "Loss magnitude" in loss["title"] and "|loss/total|" in loss["title"]
    raw = trace(loss, "raw", run.id)
    assert raw["key"] == "loss/total"
    assert raw["y"] == pytest.approx([0.01 * (1 + s / 10) for s in range(200)], rel=1e-9)

    # Length with its cap as a dashed line, and the share of answers cut at the cap.
    length = chart(browser, "response/length_mean")
    assert length is not None and length["ytitle"] == "tokens (mean per answer)"
    assert trace(length, "raw", run.id)["y"] == [signal_values(s)["response/length_mean"] for s in range(200)]
    cap = trace(length, "companion", run.id)
    assert cap["key"] == "response/length_cap" and cap["dash"] == "dash" and set(cap["y"]) == {CAP}
    truncated = chart(browser, "response/truncated_frac")
    assert truncated is not None and truncated["ytitle"] == "share of answers (0–1)"
    assert trace(truncated, "raw", run.id)["y"] == [0.0] * 138 + [1.0] * 62
    clip = chart(browser, "policy/clip_frac")
    assert clip is not None and "PPO clip fraction" in clip["title"] and clip["ytitle"] == "share of tokens clipped"
    screenshot(browser, artifacts / "run-signals.png")
    set_viewport(browser, 1280, 2000)  # the signal charts in view: charts out of view draw nothing

    # Live: each chart takes its run's points in (the magnitude as |x|, the cap beside the length).
    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    renders = {key: chart(browser, key)["render"] for key in SIGNALS}  # type: ignore[index]
    send(run, range(200, 210))

    def appended(key: str, role: str = "raw") -> dict[str, Any] | None:
        found = chart(browser, key)
        return found if found and trace(found, role, run.id)["x"][-1] == 209 else None

    loss = wait_until(lambda: appended("|loss|"), timeout=30)
    assert trace(loss, "raw", run.id)["y"][-10:] == pytest.approx([0.01 * (1 + s / 10) for s in range(200, 210)], rel=1e-9)
    entropy = wait_until(lambda: appended("policy/entropy"), timeout=30)
    assert trace(entropy, "raw", run.id)["y"][-10:] == [0.2] * 10
    length = wait_until(lambda: appended("response/length_mean", "companion"), timeout=30)
    assert trace(length, "companion", run.id)["y"][-10:] == [CAP] * 10
    # Appended by the browser, not redrawn by the server.
    assert {key: chart(browser, key)["render"] for key in SIGNALS} == renders  # type: ignore[index]
    assert console_errors(browser) == []
    run.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_run_that_logs_none_of_the_signals_gets_no_signal_chart(server, browser) -> None:
    run = LiveRun(server, "headline-only", "grpo")
    run.send([{"step": s, "values": {key: 0.1 + s / 100 for key in HEADLINE}} for s in range(60)])
    browser.get(f"{server.url}/runs/{run.id}")
    drawn_charts(browser, 5)
    assert chart_order(browser) == [*HEADLINE, "hazard"]
    assert "signals" not in text_of(browser, "run-charts").lower()
    browser.get(f"{server.url}/compare?runs={run.id}")
    drawn_charts(browser, 5)
    assert chart_order(browser) == [*HEADLINE, "hazard"]
    assert browser.execute_script("return document.getElementById('compare-logged').children.length") == 0
    assert console_errors(browser) == []
    run.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_compare_page_draws_each_runs_learned_level_in_its_colour(server, browser, artifacts) -> None:
    """Two runs that log the signals and one that does not: one entropy line and one learned
    level per run that logs entropy (the run without reward: its first 50 values), the loss
    magnitude of each from the loss it logs."""
    learning = LiveRun(server, "learning", "grpo")
    send(learning, range(200))
    rewardless = LiveRun(server, "no-reward", "ppo")
    send(rewardless, range(120), learned_at=None, loss_key="loss/pg")
    plain = LiveRun(server, "plain", "ppo", seed=1)
    plain.send([{"step": s, "values": {"reward/mean": 0.5, "mismatch/kl": 1e-3}} for s in range(60)])
    set_viewport(browser, 1280, 3000)
    browser.get(f"{server.url}/compare?runs={learning.id},{rewardless.id},{plain.id}")
    drawn_charts(browser, 9)
    assert chart_order(browser) == [*HEADLINE, "hazard", *SIGNALS]

    entropy = wait_until(lambda: chart(browser, "policy/entropy"), message="entropy chart")
    assert {t["run"] for t in entropy["traces"] if t["role"] == "raw"} == {learning.id, rewardless.id, plain.id}
    levels = level_lines(entropy)
    first_50 = math.exp(statistics.median(math.log(0.5 + s / 100) for s in range(50)))
    assert set(levels) == {learning.id, rewardless.id}
    assert levels[learning.id]["y0"] == pytest.approx(1.5, rel=1e-12)
    assert levels[rewardless.id]["y0"] == pytest.approx(first_50, rel=1e-12)
    styles = line_styles(browser, "policy/entropy")
    for run in (learning, rewardless):
        assert levels[run.id]["colour"] == styles[run.id][0] and levels[run.id]["dash"] == "dash"
        assert levels[run.id]["label"] == f"learned level {levels[run.id]['y0']:.3g} ({run.run['name']})"
    assert levels[learning.id]["colour"] != levels[rewardless.id]["colour"]
    assert entropy["meta"]["pending"] == [plain.id]  # logs no entropy: no level, and no note
    assert not any("not yet" in note for note in entropy["notes"])
    starts = level_lines(entropy, "start")
    assert set(starts) == {learning.id, rewardless.id} and entropy["meta"]["pending_start"] == [plain.id]
    assert starts[learning.id]["y0"] == 3.0 and starts[rewardless.id]["y0"] == pytest.approx(statistics.median(0.5 + s / 100 for s in range(10)))
    for run in (learning, rewardless):
        assert starts[run.id]["colour"] == styles[run.id][0] and starts[run.id]["dash"] == "dot"
        assert starts[run.id]["label"] == f"start {starts[run.id]['y0']:.3g} ({run.run['name']})"

    loss = chart(browser, "|loss|")
    assert loss is not None and "|loss/total|, |loss/pg|" in loss["title"]
    assert trace(loss, "raw", learning.id)["key"] == "loss/total"
    assert trace(loss, "raw", rewardless.id)["key"] == "loss/pg"
    assert trace(loss, "raw", rewardless.id)["y"] == pytest.approx([0.01 * (1 + s / 10) for s in range(120)], rel=1e-9)
    length = chart(browser, "response/length_mean")
    assert length is not None and {t["run"] for t in length["traces"] if t["role"] == "companion"} == {learning.id, rewardless.id}
    # The metrics the signal charts draw as logged are not offered again under "Add metrics".
    browser.find_element("css selector", "#opt-metrics").click()
    options = wait_until(
        lambda: browser.execute_script(
            "return Array.from(document.querySelectorAll('[role=option]')).map(function (e) { return e.textContent; })"
            ".filter(function (text) { return text.indexOf('/') > 0; })"  # not the radio buttons'
        ),
        message="the metric picker's options",
    )
    assert sorted(options) == ["loss/pg", "loss/total", "policy/clip_frac", "reward/std"]
    screenshot(browser, artifacts / "compare-signals.png")
    assert console_errors(browser) == []
    for run in (learning, rewardless, plain):
        run.close()


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_learned_level_appears_once_the_run_learns_while_it_streams(server, browser) -> None:
    run = LiveRun(server, "learning-live", "grpo")
    send(run, range(6), learned_at=10_000)  # the reward has not risen yet
    set_viewport(browser, 1280, 2000)
    browser.get(f"{server.url}/runs/{run.id}")
    entropy = wait_until(lambda: chart(browser, "policy/entropy"), timeout=30, message="entropy chart")
    assert level_lines(entropy) == {} and entropy["meta"]["pending"] == [run.id]
    assert level_lines(entropy, "start") == {} and entropy["meta"]["pending_start"] == [run.id]
    assert "learned level: not yet" in entropy["notes"]
    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    # Its tenth point sets its start: the server draws the chart again, with the start's line.
    send(run, range(6, 80), learned_at=10_000)

    def with_start() -> dict[str, Any] | None:
        found = chart(browser, "policy/entropy")
        return found if found and level_lines(found, "start") else None

    entropy = wait_until(with_start, timeout=30, message="the start drawn")
    assert level_lines(entropy, "start")[run.id]["y0"] == 3.0 and entropy["meta"]["pending_start"] == []
    assert level_lines(entropy) == {} and entropy["meta"]["pending"] == [run.id]
    wait_until(lambda: (lambda found: found and trace(found, "raw", run.id)["x"][-1] == 79)(chart(browser, "policy/entropy")),
               timeout=30, message="points to step 79")  # fmt: skip
    time.sleep(6)  # a redraw asked for with the last points settles
    entropy = chart(browser, "policy/entropy")
    asks = live_stats(browser)["chartAsks"]
    assert entropy is not None and asks >= 1
    # Points before it learns: appended in the browser; the chart asks the server once whether
    # a level came, and with none it is not drawn again.
    send(run, range(80, 95))
    wait_until(lambda: (lambda found: found and trace(found, "raw", run.id)["x"][-1] == 94)(chart(browser, "policy/entropy")),
               timeout=30, message="points appended")  # fmt: skip
    wait_until(lambda: live_stats(browser)["chartAsks"] > asks, timeout=30, message="the level asked for")
    time.sleep(2)  # the server's answer: no change
    assert chart(browser, "policy/entropy")["render"] == entropy["render"]
    send(run, range(95, 140))  # learns at LEARNED_AT: the chart is drawn again, with its level

    def with_level() -> dict[str, Any] | None:
        found = chart(browser, "policy/entropy")
        return found if found and level_lines(found) else None

    entropy = wait_until(with_level, timeout=30, message="the learned level drawn")
    (level,) = level_lines(entropy).values()
    assert level["y0"] == pytest.approx(1.5, rel=1e-12)
    assert entropy["meta"]["pending"] == [] and not any("not yet" in note for note in entropy["notes"])
    assert trace(entropy, "raw", run.id)["x"][-1] == 139
    assert console_errors(browser) == []
    run.close()

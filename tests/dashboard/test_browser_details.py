"""The run page's step details in headless Chromium, fed through the real ingest path
(POST /api/v1/runs/{id}/points with `histograms`, `samples` and `sequences` on the rows)."""

from __future__ import annotations

import math
from typing import Any

import httpx
import numpy as np
import pytest
from selenium.common.exceptions import StaleElementReferenceException

from dashboard.distributions import histogram_quantile
from tests.support.browser import (
    chart_message,
    click_at_x,
    console_errors,
    detail_chart,
    drawn_charts,
    live_state,
    screenshot,
    set_viewport,
    text_of,
    wait_until,
)
from tests.support.step_details import detail_rows
from tests.support.toy_runs import LiveRun

STEPS = range(0, 60)
SAMPLES_EVERY = 5
NO_DETAILS = "No step details: this run's client does not send them (Monitor.log_batch does)"


def _post(server: Any, run_id: str, rows: list[dict[str, Any]]) -> None:
    for first in range(0, len(rows), 20):
        response = httpx.post(f"{server.url}/api/v1/runs/{run_id}/points", json={"rows": rows[first : first + 20]}, timeout=60)
        assert response.status_code == 200, response.text


def _detailed_run(server: Any, name: str = "details") -> tuple[LiveRun, list[dict[str, Any]]]:
    run = LiveRun(server, name, "cispo")
    rows = detail_rows(STEPS, samples_every=SAMPLES_EVERY, sequences_per_step=40)  # 2,000 in 50 steps: all drawn
    _post(server, run.id, rows)
    return run, rows


def _drawn(browser: Any, graph_id: str, key: str | None = None) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        chart = detail_chart(browser, graph_id)
        return chart if chart and (key is None or chart["meta"].get("key") == key) else None

    return wait_until(ready, 40, message=f"{graph_id} drawn{f' ({key})' if key else ''}")  # type: ignore[no-any-return]


def _check_shares(heat: dict[str, Any], first_bin: int, counts: list[list[int]], totals: list[int]) -> None:
    """Each drawn cell is 10^(log10 share): the stored count over its step's tokens; empty cells are gaps."""
    for row_index, row in enumerate(heat["z"]):
        for column, z in enumerate(row):
            count = counts[column][first_bin + row_index]
            if count == 0:
                assert z is None, (row_index, column)
            else:
                assert 10**z == pytest.approx(count / totals[column], rel=5e-3), (row_index, column)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_heatmap_token_view_and_length_scatter_show_the_stored_details(server, browser, artifacts) -> None:
    run, rows = _detailed_run(server)
    browser.get(f"{server.url}/runs/{run.id}")

    # The heatmap: one column per step, one row per occupied bin, shares of each step's tokens.
    chart = _drawn(browser, "dist-graph", "mismatch/log_ratio")
    counts = [row["histograms"]["mismatch/log_ratio"]["counts"] for row in rows]
    occupied = [i for i in range(len(counts[0])) if any(c[i] for c in counts)]
    heat, *lines = chart["traces"]
    assert heat["type"] == "heatmap" and chart["meta"]["steps"] == list(STEPS) and not chart["meta"]["bucketed"]
    assert chart["meta"]["first_bin"] == occupied[0] and len(heat["z"]) == occupied[-1] - occupied[0] + 1
    assert all(len(row) == len(STEPS) for row in heat["z"])
    _check_shares(heat, occupied[0], counts, [sum(c) for c in counts])
    edges = rows[0]["histograms"]["mismatch/log_ratio"]["edges"]
    p99 = next(t for t in lines if t["name"] == "p99")
    expected = histogram_quantile(edges, counts[30], 0.99)
    assert expected is not None and p99["customdata"][30] == pytest.approx(expected.value, rel=1e-3)

    # The unbounded split: shares of all the step's tokens, not of the unbounded ones.
    browser.find_element("css selector", "#dist-variant input[value='unbounded']").click()
    chart = _drawn(browser, "dist-graph", "mismatch/log_ratio_unbounded")
    subset = [row["histograms"]["mismatch/log_ratio_unbounded"]["counts"] for row in rows]
    _check_shares(chart["traces"][0], chart["meta"]["first_bin"], subset, [sum(c) for c in counts])

    # The token view: the latest step with samples, its worst sequence first.
    latest = max(s for s in STEPS if s % SAMPLES_EVERY == 0)
    wait_until(lambda: f"step {latest}" in text_of(browser, "tokens-caption"), 40, message="token view")
    first = browser.find_elements("css selector", "#tokens-view .sample")[0]
    planted = next(row for row in rows if row["step"] == latest)["samples"][0]
    assert f"seq {planted['seq_id']}" in first.find_element("css selector", ".sample-head").text
    tokens = [t.get_attribute("textContent") for t in first.find_elements("css selector", ".tok")]
    assert tokens == [t.replace("\n", "↵\n") for t in planted["tokens"]]
    worst = first.find_element("css selector", ".tok.worst")
    assert worst.text.strip() == "WORST0"
    hover = worst.get_attribute("title")
    ell = planted["log_ratio"][planted["worst"] - planted["start"]]
    for part in ("π = e^(log π) = ", "μ = e^(log μ) = ", "r = π/μ = e^ℓ = ", f"ℓ = {ell:.4g}"):
        assert part in hover, (part, hover)
    lines_by_loss = {line.split()[0]: line for line in hover.splitlines() if line.startswith("  ")}
    importance = -0.75 * math.exp(ell)
    assert lines_by_loss["importance_sampling"].split()[1] == f"{importance:.4g}".replace("-", "−")
    assert lines_by_loss["cispo"].split()[1] == "−3"  # clip(r, 0, 4)·A with A = −0.75
    assert lines_by_loss["tis"].split()[1] == "−1.5"
    assert lines_by_loss["reinforce"].split()[1] == "−0.75"

    # Σℓ against length: the last 50 steps, and the least-squares slope numpy finds.
    chart = _drawn(browser, "seq-graph")
    window = [row for row in rows if row["step"] >= STEPS[-1] - 49]
    lengths = [n for row in window for n in row["sequences"]["length"]]
    sums = [s for row in window for s in row["sequences"]["log_ratio"]]
    slope = float(np.polyfit(lengths, sums, 1)[0]) * 1000
    assert chart["meta"]["steps"] == [row["step"] for row in window]
    assert chart["meta"]["fit"]["slope_per_1k"] == pytest.approx(slope, rel=1e-6)
    assert f"−{abs(slope):.3g} per 1,000 tokens" in chart["notes"][0]
    screenshot(browser, artifacts / "run_step_details.png")

    # Live: the heatmap grows by the new steps; the token view follows the latest step.
    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    _post(server, run.id, detail_rows(range(60, 66), samples_every=SAMPLES_EVERY, seed=1))
    wait_until(lambda: (detail_chart(browser, "dist-graph") or {"meta": {}})["meta"].get("steps", [0])[-1] == 65, 30, message="heatmap redrawn live")
    wait_until(lambda: text_of(browser, "tokens-caption").startswith("step 65"), 30, message="token view at the new latest step")
    assert console_errors(browser) == []
    run.close()


def _click_until(browser: Any, selector: str, x: float, caption: str) -> None:
    """Click the first chart matching `selector` at step `x` until the token view shows
    `caption` (a click that lands while the server redraws the chart, as it does once the
    live socket connects, is lost; a person clicks again)."""
    for _ in range(3):
        click_at_x(browser, browser.find_element("css selector", selector), x)
        try:
            wait_until(lambda: text_of(browser, "tokens-caption").startswith(caption), 8, message=f"token view at {caption}")
            return
        except AssertionError:
            continue
    raise AssertionError(f"three clicks at {x} on {selector} did not open the token view at {caption}")


@pytest.mark.slow
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_step_in_the_url_or_a_click_on_a_chart_opens_the_token_view_there(server, browser) -> None:
    run, _ = _detailed_run(server, "clicks")
    browser.get(f"{server.url}/runs/{run.id}?step=22")
    wait_until(
        lambda: "step 20 (the latest step ≤ 22 with samples)" in text_of(browser, "tokens-caption"),
        40,
        message="token view at ?step=22",
    )
    step_input = browser.find_element("id", "tokens-step")
    assert step_input.get_attribute("value") == "20"
    browser.find_element("id", "tokens-next").click()
    wait_until(lambda: text_of(browser, "tokens-caption").startswith("step 25"), message="next step")
    wait_until(lambda: "step=25" in browser.current_url, message="URL follows the step")

    # An alert's "tokens" button (the alerts table) opens the view at the alert's first step.
    alerted = STEPS.stop  # a step after the run's details
    run.send([{"step": alerted, "values": {"mismatch/kl": "nan"}}])  # the non-finite rule fires at once
    buttons = wait_until(
        lambda: browser.find_elements("css selector", "#run-alerts button"), 30, message="the alert's tokens button"
    )
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", buttons[0])  # off the sticky header
    buttons[0].click()
    latest = (alerted - 1) // SAMPLES_EVERY * SAMPLES_EVERY
    wait_until(
        lambda: f"step {latest} (the latest step ≤ {alerted} with samples)" in text_of(browser, "tokens-caption"),
        message="token view at the alert's step",
    )
    wait_until(lambda: f"step={latest}" in browser.current_url, message="URL names the step shown")

    # A click on a metric chart (reward/mean) at step 41: the latest step ≤ 41 with samples.
    set_viewport(browser, 1280, 1400)
    drawn_charts(browser, 3)  # reward/mean and mismatch/kl (headline), mismatch/tail_frac
    wait_until(lambda: live_state(browser) == "live", message="live websocket")
    _click_until(browser, ".keel-graph .js-plotly-plot", 41, "step 40")
    wait_until(lambda: "step=40" in browser.current_url, message="URL names the step shown")

    # And on the heatmap, whose hovered cell says its bin of ℓ.
    _drawn(browser, "dist-graph")
    click_at_x(browser, browser.find_element("css selector", "#dist-graph .js-plotly-plot"), 30, click=False)
    wait_until(lambda: text_of(browser, "dist-readout").startswith("step 30: "), message="hover readout")
    assert "of the tokens have ℓ in [" in text_of(browser, "dist-readout")
    _click_until(browser, "#dist-graph .js-plotly-plot", 12, "step 10")

    # A zoom on the heatmap re-reads those steps, and the length scatter follows it.
    browser.execute_script(
        "window.Plotly.relayout(document.querySelector('#dist-graph .js-plotly-plot'), {'xaxis.range[0]': 20, 'xaxis.range[1]': 40});"
    )
    wait_until(lambda: (detail_chart(browser, "dist-graph") or {"meta": {}})["meta"].get("steps") == list(range(20, 41)), message="zoomed heatmap")
    wait_until(lambda: (detail_chart(browser, "seq-graph") or {"meta": {}})["meta"].get("steps") == list(range(20, 41)), message="scatter of the zoom")
    assert console_errors(browser) == []
    run.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_run_without_step_details_says_so(server, browser) -> None:
    run = LiveRun(server, "plain", "cispo")
    run.history(40)
    browser.get(f"{server.url}/runs/{run.id}")
    wait_until(lambda: NO_DETAILS in text_of(browser, "tokens-view"), 40, message="token view empty state")
    wait_until(lambda: NO_DETAILS in chart_message(browser, "dist-graph"), message="heatmap empty state")
    wait_until(lambda: NO_DETAILS in chart_message(browser, "seq-graph"), message="scatter empty state")
    assert console_errors(browser) == []
    run.close()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_compare_page_charts_tail_frac_when_a_run_logs_it(server, browser) -> None:
    detailed, rows = _detailed_run(server, "with-details")
    plain = LiveRun(server, "plain", "ppo")
    plain.history(40)
    browser.get(f"{server.url}/compare?runs={detailed.id},{plain.id}")
    charts = {chart["key"]: chart for chart in drawn_charts(browser, 7)}  # and the entropy the plain run logs
    assert list(charts)[5:] == ["mismatch/tail_frac", "policy/entropy"]
    tail = charts["mismatch/tail_frac"]
    raw = next(t for t in tail["traces"] if t["role"] == "raw" and t["run"] == detailed.id)
    assert raw["x"] == list(STEPS)
    logged = [row["values"]["mismatch/tail_frac"] for row in rows]
    assert [y is None for y in raw["y"]] == [v == 0 for v in logged]  # a log axis: 0 is a gap
    assert [y for y in raw["y"] if y is not None] == pytest.approx([v for v in logged if v > 0], rel=1e-3)
    assert console_errors(browser) == []
    detailed.close()
    plain.close()


def _topk_entry(position: int, sampled: int, shift: float) -> dict[str, Any]:
    """Both engines' top-4 at a token: the sampler's μ, and a learner that moved `shift` of
    the mass from the sampler's first token to the sampled one (its third)."""
    mu = [0.5, 0.25, 0.15, 0.05]
    pi_of_sampler = [0.5 - shift, 0.25, 0.15 + shift, 0.05]
    ids = [7, 8, sampled, 9]
    learner = sorted(zip(pi_of_sampler, ids, strict=True), reverse=True)
    return {
        "position": position,
        "tv": shift,
        "kl": sum(m * math.log(m / p) for m, p in zip(mu, pi_of_sampler, strict=True)),
        "sampler_token_ids": ids,
        "sampler_tokens": [" cat", " dog", f" tok{sampled}", " eel"],
        "sampler_logprobs": [math.log(m) for m in mu],
        "learner_logprobs_of_sampler_ids": [math.log(p) for p in pi_of_sampler],
        "learner_token_ids": [i for _, i in learner],
        "learner_tokens": [{7: " cat", 8: " dog", 9: " eel"}.get(i, f" tok{i}") for _, i in learner],
        "learner_logprobs": [math.log(p) for p, _ in learner],
    }


def _table_rows(block: Any, side: str) -> list[list[str]]:
    rows = block.find_elements("css selector", f".topk-{side} tbody tr")
    return [[cell.text for cell in row.find_elements("css selector", "td")] for row in rows]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_token_view_shows_both_engines_top_k_of_a_chosen_token(server, browser, artifacts) -> None:
    run = LiveRun(server, "topk", "cispo")
    rows = detail_rows(range(0, 3), samples_every=1)
    sample = rows[-1]["samples"][0]
    worst_at = sample["worst"] - sample["start"]
    other = sample["worst"] + 2
    sample["topk"] = [
        _topk_entry(sample["worst"], sample["token_ids"][worst_at], 0.3),
        _topk_entry(other, sample["token_ids"][worst_at + 2], 0.1),
    ]
    _post(server, run.id, rows)
    browser.get(f"{server.url}/runs/{run.id}")
    wait_until(lambda: "step 2" in text_of(browser, "tokens-caption"), 40, message="token view")
    card = browser.find_elements("css selector", "#tokens-view .sample")[0]
    chosen = card.find_elements("css selector", ".tok.has-topk")
    assert [t.text.strip() for t in chosen] == [sample["tokens"][worst_at].strip(), sample["tokens"][worst_at + 2].strip()]
    assert "topk-chosen" in chosen[0].get_attribute("class")

    # The worst token's: the sampler's top-k with μ and π of each id, the learner's with π and
    # μ; the sampled token marked on both sides.
    block = card.find_element("css selector", ".topk-block")
    sampled = f"' tok{sample['token_ids'][worst_at]}'"
    assert f"position {sample['worst']} · top-k TV 0.3 · KL" in block.find_element("css selector", ".topk-facts").text
    assert _table_rows(block, "sampler") == [
        ["1", "' cat'", "0.5000", "0.2000", ""],
        ["2", "' dog'", "0.2500", "0.2500", ""],
        ["3", sampled, "0.1500", "0.4500", "◀ sampled"],
        ["4", "' eel'", "0.0500", "0.0500", ""],
    ]
    assert _table_rows(block, "learner")[0] == ["1", sampled, "0.4500", "0.1500", "◀ sampled"]
    assert [r[0:3] for r in _table_rows(block, "learner")[1:]] == [["2", "' dog'", "0.2500"], ["3", "' cat'", "0.2000"], ["4", "' eel'", "0.0500"]]
    screenshot(browser, artifacts / "token_view_topk.png")

    # A click on the other underlined token shows its own top-k. The view is found again at
    # each look: a live tick's late answer may draw the same step again (a fresh card, the
    # worst token chosen), so the click is repeated until the panel shows the token's top-k.
    def first_card() -> Any:
        return browser.find_elements("css selector", "#tokens-view .sample")[0]

    def chose_other() -> bool:
        try:
            if f"position {other} ·" in first_card().find_element("css selector", ".topk-facts").text:
                return True
            target = first_card().find_elements("css selector", ".tok.has-topk")[1]
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", target)
            target.click()
        except (StaleElementReferenceException, IndexError):
            pass
        return False

    wait_until(chose_other, 20, message="the chosen token's top-k")
    card = first_card()
    chosen = card.find_elements("css selector", ".tok.has-topk")
    block = card.find_element("css selector", ".topk-block")
    # The other samples carry none: no panel.
    assert all(not c.find_elements("css selector", ".topk-block") for c in browser.find_elements("css selector", "#tokens-view .sample")[1:])
    assert console_errors(browser) == []
    run.close()

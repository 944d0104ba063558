"""Backtest: the pure replay, rule files, and replaying stored runs (loader, REST)."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from server.alerts.backtest import (
    Replay,
    backtest,
    backtest_runs,
    parse_rules,
    rule_from_json,
    stored_rules,
)
from server.alerts.catalog import DEFAULT_RULES, RuleSpec
from server.alerts.hazard import MODEL, HazardModel, hazard_series
from tests.support.hazard import RISING, collapsing_values, rising_model_file
from tests.support.raw_client import hello, new_run, open_ingest, points, recv
from wire import Row


def _rows(values: list[dict[str, float]], start: int = 0) -> list[Row]:
    return [Row(step=start + i, time=None, values=v) for i, v in enumerate(values)]


THRESHOLD = RuleSpec("kl high", "mismatch/kl", "threshold", "critical", for_steps=3, keep_firing_for=2,
                     params={"threshold": 1.0, "resolve_at": 0.5})  # fmt: skip


def test_episodes_follow_the_engine_lifecycle() -> None:
    kl = [0.1] * 5 + [2.0] * 2 + [0.1] + [2.0] * 4 + [0.8, 0.4, 0.4, 0.1] + [2.0] * 3
    (result,) = backtest([THRESHOLD], _rows([{"mismatch/kl": v} for v in kl]))
    # 5-6: pending, cleared before for_steps: cancelled. 8-11: pending at 8, fires at 10;
    # 12 (0.8) is still above resolve_at, 13-14 clear: resolved at 14. 16-18 fires at 18, open.
    assert result.cancelled == 1
    assert [(e.started_step, e.fired_step, e.resolved_step) for e in result.episodes] == [(8, 10, 14), (16, 18, None)]
    assert result.fired_steps == [10, 18] and result.evaluated_steps == len(kl)
    assert result.episodes[0].message.startswith("mismatch/kl = 2 >") and result.episodes[0].value == 2.0


def test_a_replay_fed_a_row_at_a_time_says_what_fires_now() -> None:
    """What a loop beside training asks after each step (bench/guard.py): the episode firing
    now, from the step it started at; at the end, the same episodes as the whole backtest."""
    kl = [0.1] * 5 + [2.0] * 2 + [0.1] + [2.0] * 4 + [0.8, 0.4, 0.4, 0.1] + [2.0] * 3
    replay = Replay(THRESHOLD)
    open_at = {}
    for row in _rows([{"mismatch/kl": v} for v in kl]):
        replay.feed(row)
        open_at[row.step] = None if replay.firing is None else replay.firing.started_step
    assert [step for step, started in open_at.items() if started is not None] == [10, 11, 12, 13, 18]
    assert [open_at[step] for step in (10, 11, 12, 13, 18)] == [8, 8, 8, 8, 16]
    (whole,) = backtest([THRESHOLD], _rows([{"mismatch/kl": v} for v in kl]))
    assert replay.finish().episodes == whole.episodes and replay.firing is None


def test_repeated_steps_and_other_metrics_are_skipped_and_silent_rules_are_not_replayed() -> None:
    rows = _rows([{"mismatch/kl": 2.0}] * 3) + _rows([{"mismatch/kl": 2.0}], start=1) + _rows([{"other": 1.0}], start=3)
    silent = RuleSpec("run went silent", "*", "silent", "warning")
    threshold, skipped = backtest([THRESHOLD, silent], rows)
    assert threshold.evaluated_steps == 3 and threshold.fired_steps == [2]
    assert skipped.skipped and skipped.episodes == []


def test_default_rules_backtest_a_nan() -> None:
    values = [{"reward/mean": 0.5, "grad/norm": 1.0}] * 10 + [{"reward/mean": 0.5, "grad/norm": math.nan}]
    results = {r.rule.name: r for r in backtest(DEFAULT_RULES, _rows(values))}
    assert results["non-finite value"].fired_steps == [10]
    assert results["collapse risk"].fired_steps == []


def test_rule_files_json_yaml_and_the_rules_api_output() -> None:
    api_rule = {"id": 4, "project": "default", "group": None, "run_id": None, "enabled": True, "builtin": False,
                "name": "kl", "metric": "mismatch/kl", "detector": "climb", "params": {"h": 20}, "severity": "warning",
                "for_steps": 3, "keep_firing_for": 30}  # fmt: skip
    (rule,) = parse_rules(json.dumps([api_rule]))
    assert rule == RuleSpec("kl", "mismatch/kl", "climb", "warning", 3, 30, {"h": 20})
    yaml_text = "rules:\n  - name: big grad\n    metric: grad/norm\n    detector: threshold\n    params: {threshold: 10}\n"
    pytest.importorskip("yaml")
    assert parse_rules(yaml_text)[0].params == {"threshold": 10}
    for bad, why in (
        ({"name": "x", "metric": "m", "detector": "nope"}, "unknown detector"),
        ({"name": "x", "metric": "m", "detector": "climb", "params": {"k": -1}}, "positive"),
        ({"name": "x", "metric": "m", "detector": "climb", "severity": "page"}, "severity"),
        ({"name": "x", "metric": "m", "detector": "climb", "colour": 1}, "unknown rule field"),
        ({"name": "x", "detector": "climb"}, "needs"),
    ):
        with pytest.raises(ValueError, match=why):
            rule_from_json(bad)
    with pytest.raises(ValueError, match="non-empty list"):
        parse_rules("[]")


def _stream(server, run: dict, values: list[dict]) -> None:  # type: ignore[no-untyped-def]
    with open_ingest(server) as ws:
        hello(ws, run)
        for i in range(0, len(values), 25):
            ws.send(points(i // 25, [{"step": i + j, "values": v} for j, v in enumerate(values[i:i + 25])]))
            assert recv(ws)["type"] == "ack"


def test_stored_runs_replay_as_the_engine_fired(server_factory, database_url) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(database_url)
    run = new_run("bt-run")
    values = [{"reward/mean": 0.5, "grad/norm": 1.0, "mismatch/kl": 0.1}] * 40
    values[12] = {**values[12], "grad/norm": "nan"}
    values[20:26] = [{**values[20], "mismatch/kl": 3.0}] * 6
    _stream(server, run, values)
    alerts = httpx.get(f"{server.url}/api/v1/alerts", params={"run_id": run["id"]}).json()
    engine_fired = sorted((a["rule"], a["fired_step"]) for a in alerts if a["fired_step"] is not None)

    response = httpx.post(f"{server.url}/api/v1/backtest", json={"run_ids": [run["id"]]}, timeout=30)
    assert response.status_code == 200, response.text
    (replayed,) = response.json()["runs"]
    assert replayed["run_name"] == "bt-run" and replayed["steps"] == 40
    backtest_fired = sorted((r["rule"]["name"], e["fired_step"]) for r in replayed["rules"] for e in r["episodes"])
    assert backtest_fired == engine_fired and ("non-finite value", 12) in backtest_fired

    rule = {"name": "kl above 1", "metric": "mismatch/kl", "detector": "threshold", "params": {"threshold": 1.0},
            "severity": "critical", "for_steps": 2, "keep_firing_for": 3}  # fmt: skip
    body = httpx.post(f"{server.url}/api/v1/backtest", json={"run_ids": [run["id"]], "rules": [rule]}).json()
    (episode,) = body["runs"][0]["rules"][0]["episodes"]
    assert (episode["started_step"], episode["fired_step"], episode["resolved_step"]) == (20, 21, 28)
    # Stored rules by id, and the errors.
    rules = httpx.get(f"{server.url}/api/v1/rules").json()
    nonfinite = next(r["id"] for r in rules if r["name"] == "non-finite value")
    by_id = httpx.post(f"{server.url}/api/v1/backtest", json={"run_ids": [run["id"]], "rule_ids": [nonfinite]}).json()
    assert [e["fired_step"] for e in by_id["runs"][0]["rules"][0]["episodes"]] == [12]
    assert httpx.post(f"{server.url}/api/v1/backtest", json={"run_ids": ["nope"]}).status_code == 404
    assert httpx.post(f"{server.url}/api/v1/backtest", json={"run_ids": [run["id"]], "rule_ids": [99999]}).status_code == 404
    bad = {**rule, "params": {"threshold": "high"}}
    assert httpx.post(f"{server.url}/api/v1/backtest", json={"run_ids": [run["id"]], "rules": [bad]}).status_code == 422
    assert httpx.post(f"{server.url}/api/v1/backtest", json={"run_ids": []}).status_code == 422


def test_a_hazard_rule_fires_under_the_servers_model_in_the_engine_and_the_backtest(server_factory, sqlite_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The server's one model (KEEL_HAZARD_MODEL) is what its engine and its backtest compute
    a `hazard` rule with: both fire where hazard_series under that model first passes p, which
    is not where the built-in model would."""
    server = server_factory(sqlite_url, hazard_model=rising_model_file(tmp_path))
    values = [collapsing_values(step) for step in range(230)]
    first = {name: next(step for step, h in enumerate(hazard_series(values, model)) if h is not None and h > 0.5)
             for name, model in (("rising", RISING), ("built-in", HazardModel(MODEL)))}  # fmt: skip
    assert first["rising"] != first["built-in"]
    rule = {"name": "collapse hazard", "metric": "reward/mean", "detector": "hazard", "params": {"p": 0.5},
            "severity": "critical", "for_steps": 1, "keep_firing_for": 50}  # fmt: skip
    created = httpx.post(f"{server.url}/api/v1/rules", json={**rule, "project": "default"})
    assert created.status_code == 201, created.text
    run = new_run("drifting")
    _stream(server, run, values)
    alerts = httpx.get(f"{server.url}/api/v1/alerts", params={"run_id": run["id"]}).json()
    assert [a["fired_step"] for a in alerts if a["rule"] == "collapse hazard"] == [first["rising"]]
    body = httpx.post(f"{server.url}/api/v1/backtest", json={"run_ids": [run["id"]], "rules": [rule]}, timeout=30).json()
    assert [e["fired_step"] for e in body["runs"][0]["rules"][0]["episodes"]] == [first["rising"]]


def test_the_loader_pages_through_long_runs(server_factory, sqlite_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from server import db
    from server.alerts import backtest as backtest_module
    from server.storage import Store

    server = server_factory(sqlite_url)
    run = new_run("long")
    _stream(server, run, [{"mismatch/kl": 2.0 if 50 <= i < 60 else 0.1, "x": float(i)} for i in range(100)])
    monkeypatch.setattr(backtest_module, "ROWS_PER_READ", 15)  # 7 rows of 2 points per read

    async def replay() -> tuple[list, list]:
        store = Store(db.create_engine(sqlite_url))
        try:
            rules = await stored_rules(store, [])
            return rules, await backtest_runs(store, [THRESHOLD], [run["id"]], HazardModel(MODEL))
        finally:
            await store.close()

    rules, (result,) = asyncio.run(replay())
    assert rules == [] and result.steps == 100
    assert [(e.started_step, e.fired_step, e.resolved_step) for e in result.results[0].episodes] == [(50, 52, 61)]

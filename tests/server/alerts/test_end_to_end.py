"""Alerts end to end: ingest -> engine -> alerts API / live push -> signed webhook at a real receiver."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from server.alerts.catalog import DEFAULT_RULES
from server.webhooks import signing
from tests.support.raw_client import hello, new_run, open_ingest, points, recv
from tests.support.webhook_receiver import Receiver

FAST = {"allow_private_webhooks": True, "webhook_retry_base_s": 0.05}


@pytest.fixture
def receiver():  # type: ignore[no-untyped-def]
    r = Receiver()
    yield r
    r.close()


def _hook(server, url: str, fmt: str = "generic") -> dict:  # type: ignore[no-untyped-def]
    response = httpx.post(f"{server.url}/api/v1/webhooks", json={"url": url, "format": fmt})
    assert response.status_code == 201, response.text
    return dict(response.json())


def _stream(server, run: dict, values_by_step: list[dict], seq0: int = 0, step0: int = 0) -> None:  # type: ignore[no-untyped-def]
    with open_ingest(server) as ws:
        hello(ws, run)
        for i in range(0, len(values_by_step), 10):
            ws.send(points(seq0 + i // 10, [{"step": step0 + i + j, "values": v} for j, v in enumerate(values_by_step[i:i + 10])]))
            assert recv(ws)["type"] == "ack"


def _alerts(server, **params) -> list[dict]:  # type: ignore[no-untyped-def]
    return list(httpx.get(f"{server.url}/api/v1/alerts", params=params).json())


def _wait(predicate, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_non_finite_fires_critical_then_resolves_and_webhooks_arrive_signed(server_factory, database_url, receiver) -> None:
    server = server_factory(database_url, **FAST)
    hook = _hook(server, receiver.url)
    assert hook["secret"].startswith("whsec_") and "secret" not in httpx.get(f"{server.url}/api/v1/webhooks").json()[0]
    run = new_run("nan-run", group="is")
    series = [{"reward/mean": 0.5, "grad/norm": 1.0}] * 20 + [{"reward/mean": 0.5, "grad/norm": "nan"}] + [{"reward/mean": 0.5, "grad/norm": 1.0}] * 29
    _stream(server, run, series)

    # Evaluation follows each frame's ack: wait for the last frame's, which resolves it.
    alert = _wait(lambda: [a for a in _alerts(server, run_id=run["id"]) if a["rule"] == "non-finite value" and a["state"] == "resolved"])[0]
    assert alert["severity"] == "critical" and alert["started_step"] == 20 and alert["metric"] == "grad/norm" and alert["keys"] == ["grad/norm"]
    assert alert["state"] == "resolved" and alert["resolved_step"] == 40  # keep_firing_for = 20 clear steps
    receiver.wait_for(lambda: len(receiver.delivered()) == 2)
    firing, resolved = receiver.delivered()
    for received, state in ((firing, "firing"), (resolved, "resolved")):
        assert signing.verify(hook["secret"], received.headers["webhook-id"], received.headers["webhook-timestamp"], received.body, received.headers["webhook-signature"])
        body = received.json
        assert body["type"] == f"alert.{state}"
        assert body["alert"]["run_id"] == run["id"] and body["alert"]["run_name"] == "nan-run"
        assert body["alert"]["rule"] == "non-finite value" and body["alert"]["severity"] == "critical"
        assert body["alert"]["url"].endswith(f"/compare?runs={run['id']}")
        assert body["alert"]["run_url"] == f"{server.url}/runs/{run['id']}"
        # The link an admin POSTs a command to (docs/alerts.md, "Acting on an alert").
        command = httpx.post(body["alert"]["commands_url"], json={"action": "checkpoint"})
        assert command.status_code == 202 and command.json()["run_id"] == run["id"]
    assert firing.json["alert"]["step"] == 20 and firing.json["alert"]["value"] == "nan"
    assert resolved.json["alert"]["step"] == 40
    assert firing.headers["webhook-id"] != resolved.headers["webhook-id"]


def test_retries_until_the_receiver_recovers_and_delivers_once_per_event(server_factory, sqlite_url, receiver) -> None:
    receiver.script = [(500, {}), (503, {"Retry-After": "1"}), (429, {})]
    server = server_factory(sqlite_url, **FAST)
    hook = _hook(server, receiver.url)
    assert httpx.post(f"{server.url}/api/v1/webhooks/{hook['id']}/test").status_code == 202
    receiver.wait_for(lambda: len(receiver.delivered()) == 1)
    time.sleep(0.5)
    assert [r.status for r in receiver.requests] == [500, 503, 429, 200]
    assert len({r.headers["webhook-id"] for r in receiver.requests}) == 1  # stable across retries
    assert receiver.requests[2].at - receiver.requests[1].at >= 1.0  # Retry-After honoured
    deliveries = httpx.get(f"{server.url}/api/v1/webhooks/{hook['id']}/deliveries").json()
    assert [(d["status"], d["attempts"]) for d in deliveries] == [("delivered", 4)]


def test_410_disables_the_webhook_and_redirects_are_not_followed(server_factory, sqlite_url, receiver) -> None:
    server = server_factory(sqlite_url, **FAST)
    receiver.script = [(307, {"Location": "http://169.254.169.254/latest"}), (410, {})]
    hook = _hook(server, receiver.url)
    httpx.post(f"{server.url}/api/v1/webhooks/{hook['id']}/test")
    receiver.wait_for(lambda: len(receiver.requests) == 1)
    _wait(lambda: httpx.get(f"{server.url}/api/v1/webhooks/{hook['id']}/deliveries").json()[0]["status"] == "failed")
    httpx.post(f"{server.url}/api/v1/webhooks/{hook['id']}/test")
    _wait(lambda: not httpx.get(f"{server.url}/api/v1/webhooks").json()[0]["enabled"])
    assert len(receiver.requests) == 2
    assert "410" in httpx.get(f"{server.url}/api/v1/webhooks").json()[0]["disabled_reason"]


def test_outbox_survives_a_restart(server_factory, sqlite_url, receiver) -> None:
    receiver.script = [(503, {"Retry-After": "2"})]
    first = server_factory(sqlite_url, **FAST)
    hook = _hook(first, receiver.url)
    httpx.post(f"{first.url}/api/v1/webhooks/{hook['id']}/test")
    receiver.wait_for(lambda: len(receiver.requests) == 1)
    # Stop the server before the retry is due; a new process on the same database delivers it.
    first.stop()
    second = server_factory(sqlite_url, **FAST)
    receiver.wait_for(lambda: len(receiver.delivered()) == 1, timeout=20)
    ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert len(ids) == 2 and ids[0] == ids[1]
    deliveries = httpx.get(f"{second.url}/api/v1/webhooks/{hook['id']}/deliveries").json()
    assert [(d["status"], d["attempts"]) for d in deliveries] == [("delivered", 2)]


def test_webhook_ssrf_refused_at_creation_unless_allowed(server_factory, sqlite_url) -> None:
    strict = server_factory(sqlite_url)
    for url in ("http://127.0.0.1:9/x", "http://localhost/x", "http://169.254.169.254/latest/meta-data", "http://[::ffff:10.0.0.1]/x", "http://10.0.0.8/x"):
        response = httpx.post(f"{strict.url}/api/v1/webhooks", json={"url": url})
        assert response.status_code == 422 and "non-public" in response.json()["detail"][0]["msg"], (url, response.text)
    assert httpx.post(f"{strict.url}/api/v1/webhooks", json={"url": "ftp://example.com/x"}).status_code == 422
    assert httpx.post(f"{strict.url}/api/v1/webhooks", json={"url": "http://127.0.0.1/x", "format": "teams"}).status_code == 422


def test_default_rules_are_installed_per_project_and_rules_are_editable(server) -> None:
    run = new_run("r", project="alpha")
    _stream(server, run, [{"reward/mean": 0.1}])
    rules = _wait(lambda: httpx.get(f"{server.url}/api/v1/rules", params={"project": "alpha"}).json())
    assert {r["name"] for r in rules} == {
        "non-finite value", "mismatch climbing", "ratio tail climbing", "collapse risk", "mismatch drift", "run went silent",
        "entropy running away", "entropy far above its start", "loss growing", "policy ratio jumping", "answers at the length cap", "answers cut at the cap",
        "no learning signal", "loss gated out",
    }
    assert all(r["builtin"] and r["project"] == "alpha" for r in rules)
    created = httpx.post(f"{server.url}/api/v1/rules", json={
        "name": "kl too high", "metric": "mismatch/kl", "detector": "threshold", "params": {"threshold": 0.5, "resolve_at": 0.1},
        "severity": "critical", "project": "alpha", "for_steps": 2, "keep_firing_for": 1,
    })
    assert created.status_code == 201, created.text
    bad = httpx.post(f"{server.url}/api/v1/rules", json={"name": "x", "metric": "m", "detector": "climb", "params": {"k": -1}})
    assert bad.status_code == 422 and "positive" in bad.text
    # The new rule applies to the next steps of the same run: 2 steps above 0.5 -> firing at the second.
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(1, [{"step": s, "values": {"mismatch/kl": v}} for s, v in [(1, 0.6), (2, 0.7), (3, 0.3), (4, 0.05)]]))
        recv(ws)
    alert = _wait(lambda: _alerts(server, run_id=run["id"], state="resolved"))[0]
    assert (alert["rule"], alert["started_step"], alert["fired_step"], alert["resolved_step"]) == ("kl too high", 1, 2, 4)
    patched = httpx.patch(f"{server.url}/api/v1/rules/{created.json()['id']}", json={"enabled": False})
    assert patched.json()["enabled"] is False
    assert httpx.delete(f"{server.url}/api/v1/rules/{created.json()['id']}").status_code == 204
    assert httpx.delete(f"{server.url}/api/v1/rules/99999").status_code == 404


def test_silenced_alerts_fire_without_notifying_and_can_be_acknowledged(server_factory, sqlite_url, receiver) -> None:
    server = server_factory(sqlite_url, **FAST)
    _hook(server, receiver.url)
    silence = httpx.post(f"{server.url}/api/v1/silences", json={"matchers": {"run_name": "noisy-*"}, "duration_s": 600, "comment": "known bad"})
    assert silence.status_code == 201 and silence.json()["active"]
    noisy, loud = new_run("noisy-1"), new_run("loud-1")
    for run in (noisy, loud):
        _stream(server, run, [{"loss/total": "inf"}])
    firing = _wait(lambda: len(_alerts(server, state="firing")) == 2 and _alerts(server, state="firing"))
    by_run = {a["run_id"]: a for a in firing}
    assert by_run[noisy["id"]]["silenced"] is True and by_run[loud["id"]]["silenced"] is False
    receiver.wait_for(lambda: len(receiver.delivered()) == 1)
    time.sleep(0.5)
    assert [r.json["alert"]["run_id"] for r in receiver.delivered()] == [loud["id"]]
    acked = httpx.post(f"{server.url}/api/v1/alerts/{by_run[loud['id']]['id']}/ack", json={"by": "ana"}).json()
    assert acked["acknowledged_by"] == "ana" and acked["acknowledged_at"]
    assert httpx.delete(f"{server.url}/api/v1/silences/{silence.json()['id']}").json()["active"] is False


def test_alert_changes_are_pushed_live(server) -> None:
    run = new_run("live-alert")
    with connect(f"{server.ws_url}/api/v1/live?runs={run['id']}") as live:
        _stream(server, run, [{"loss/total": "-inf"}])
        messages = []
        while not any(m["type"] == "alert" and m["alert"]["state"] == "firing" for m in messages):
            messages.append(json.loads(live.recv(timeout=10)))
    alert = next(m for m in messages if m["type"] == "alert" and m["alert"]["state"] == "firing")
    assert alert["run_id"] == run["id"] and alert["alert"]["rule"] == "non-finite value" and alert["alert"]["value"] == "-inf"


def test_detector_state_survives_a_restart(server_factory, database_url) -> None:
    """A climb that starts before a restart and continues after it fires once, at the same step as without restart."""
    import math
    import random

    rng = random.Random(3)
    kl = [1e-3 * math.exp(rng.gauss(0, 0.2)) for _ in range(80)] + [1e-3 * math.exp(0.05 * i) for i in range(80)]
    rows = [{"mismatch/kl": v} for v in kl]
    reference = server_factory(database_url)
    ref_run = new_run("reference")
    _stream(reference, ref_run, rows)
    expected = _wait(lambda: [a for a in _alerts(reference, run_id=ref_run["id"]) if a["rule"] == "mismatch climbing"])
    run = new_run("restarted")
    _stream(reference, run, rows[:90])
    reference.stop()
    second = server_factory(database_url)
    _stream(second, run, rows[90:], seq0=9, step0=90)
    got = _wait(lambda: [a for a in _alerts(second, run_id=run["id"]) if a["rule"] == "mismatch climbing"])
    assert [(a["started_step"], a["fired_step"]) for a in got] == [(a["started_step"], a["fired_step"]) for a in expected]


def test_concurrent_first_runs_of_a_project_install_rules_once_and_lose_no_evaluation(server) -> None:
    import asyncio

    from websockets.asyncio.client import connect as aconnect

    async def one(index: int) -> str:
        run = new_run(f"race-{index}", project="race")
        async with aconnect(f"{server.ws_url}/api/v1/ingest") as ws:
            await ws.send(json.dumps({"type": "hello", "protocol": 1, "run": run}))
            await ws.recv()
            await ws.send(points(0, [{"step": 0, "values": {"loss/total": "nan"}}]))
            assert json.loads(await ws.recv())["type"] == "ack"
        return str(run["id"])

    async def all_runs() -> list[str]:
        return list(await asyncio.gather(*(one(i) for i in range(8))))

    run_ids = asyncio.run(all_runs())
    firing = _wait(lambda: len(_alerts(server, project="race", state="firing")) == 8 and _alerts(server, project="race", state="firing"))
    assert sorted(a["run_id"] for a in firing) == sorted(run_ids)
    assert len(httpx.get(f"{server.url}/api/v1/rules", params={"project": "race"}).json()) == len(DEFAULT_RULES)


def test_run_gone_silent_fires_a_warning_and_resolves_when_data_returns(server_factory, database_url) -> None:
    server = server_factory(database_url, silent_run_check_s=0.2)
    run = new_run("quiet", project="silent-runs")
    _stream(server, run, [{"reward/mean": 0.5}])
    rule = _wait(lambda: [r for r in httpx.get(f"{server.url}/api/v1/rules", params={"project": "silent-runs"}).json() if r["detector"] == "silent"])[0]
    assert httpx.patch(f"{server.url}/api/v1/rules/{rule['id']}", json={"params": {"after_s": 0.5}}).status_code == 200
    firing = _wait(lambda: _alerts(server, run_id=run["id"], state="firing"))
    assert firing[0]["rule"] == "run went silent" and firing[0]["severity"] == "warning"
    _stream(server, run, [{"reward/mean": 0.5}] * 2, seq0=1)
    resolved = _wait(lambda: _alerts(server, run_id=run["id"], state="resolved"))
    assert resolved[0]["id"] == firing[0]["id"]


def test_a_start_rule_that_joins_a_streaming_run_stays_silent_there_and_pages_a_run_it_saw_begin(server_factory, database_url) -> None:
    """"entropy far above its start" measures from a run's first values: a rule edited (or
    added) while a run streams has not seen them, and must not take a start from the middle
    of the run (an entropy that sharpened, then burst). The edited rule and a new one are both
    silent on the run that streamed before them, and both page a run they saw from step 0."""
    server = server_factory(database_url, **FAST)
    sharp = [{"reward/mean": 0.5, "policy/entropy": 0.25}] * 30
    runaway = [{"reward/mean": 0.5, "policy/entropy": 1.0}] * 30

    def evaluated_to(run: dict, step: int) -> bool:  # a non-finite grad norm logged there was paged
        return any(a["rule"] == "non-finite value" and a["started_step"] == step for a in _alerts(server, run_id=run["id"]))

    seen = new_run("seen-from-its-start")
    _stream(server, seen, sharp + runaway)
    alert = _wait(lambda: [a for a in _alerts(server, run_id=seen["id"]) if a["rule"] == "entropy far above its start"])[0]
    # 11 of the last 20 entropies at 1.0: their median is 4x the start 0.25.
    assert alert["severity"] == "critical" and alert["started_step"] == 40 and "4.0× its start 0.25" in alert["message"]

    # A run that starts at 1 nat, sharpens to 0.25 and comes back to 1: never 3x its start.
    joined = new_run("joined-mid-way")
    _stream(server, joined, [*runaway[:-1], {**runaway[-1], "grad/norm": "nan"}])
    _wait(lambda: evaluated_to(joined, 29))
    rules = {r["name"]: r for r in httpx.get(f"{server.url}/api/v1/rules", params={"project": "default"}).json()}
    builtin = rules["entropy far above its start"]
    edited = httpx.patch(f"{server.url}/api/v1/rules/{builtin['id']}", json={"params": {**builtin["params"], "factor": 2.9}})
    assert edited.status_code == 200, edited.text
    mine = httpx.post(f"{server.url}/api/v1/rules", json={
        "name": "entropy above start (mine)", "metric": "policy/entropy", "detector": "above_start",
        "params": {"factor": 3.0, "floor": 0.2}, "severity": "warning",
    })
    assert mine.status_code == 201, mine.text
    # Had the rules taken their start where they joined it (0.25), its return to 1 would page.
    _stream(server, joined, sharp[:20] + [*runaway[:-1], {**runaway[-1], "grad/norm": "nan"}], seq0=3, step0=30)
    _wait(lambda: evaluated_to(joined, 79))
    assert not [a for a in _alerts(server, run_id=joined["id"]) if "start" in a["rule"]]

    fresh = new_run("seen-after-the-edit")
    _stream(server, fresh, sharp + runaway)
    _wait(lambda: {a["rule"] for a in _alerts(server, run_id=fresh["id"])} >= {"entropy far above its start", "entropy above start (mine)"})

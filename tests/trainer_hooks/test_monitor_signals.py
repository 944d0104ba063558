"""The Monitor in the trainer hears what the server says of its run: `alerts`, `hazard` and the
commands handed to `on_command`, through a real `keel serve` (restarted, too)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

from tests.support.hazard import collapsing_values
from tests.support.monitor import FAST, servers, wait_until
from trainer_hooks import Command, Monitor

make_server = pytest.fixture(name="make_server")(servers)


def _rule(server: Any, **fields: Any) -> None:
    body = {"name": "m high", "metric": "m", "detector": "threshold", "params": {"op": ">", "threshold": 1.0}, "severity": "critical", **fields}
    assert httpx.post(f"{server.url}/api/v1/rules", json=body).status_code == 201


def _commands(server: Any, run_id: str) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in httpx.get(f"{server.url}/api/v1/runs/{run_id}/commands").json()}


def _command(server: Any, run_id: str, action: str, **payload: Any) -> str:
    response = httpx.post(f"{server.url}/api/v1/runs/{run_id}/commands", json={"action": action, "payload": payload})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_the_monitor_knows_its_firing_alerts_and_its_hazard(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    _rule(server)
    monitor = Monitor(server.url, run_name="alerts", spool_dir=tmp_path, sender_config=FAST)
    assert monitor.alerts == [] and monitor.hazard is None
    for step in range(60):
        monitor.log(step, {**collapsing_values(step), "m": 5.0 if 20 <= step < 40 else 0.0})
        if step == 30:
            wait_until(lambda: [a.rule for a in monitor.alerts] == ["m high"], what="the firing alert")
            (alert,) = monitor.alerts
            assert (alert.severity, alert.started_step) == ("critical", 20) and "m = 5" in alert.message
        time.sleep(0.01)
    wait_until(lambda: monitor.alerts == [], what="the alert resolved")
    wait_until(lambda: monitor._signals.hazard_step == 59, what="the hazard of the last step")
    hazard = httpx.get(f"{server.url}/api/v1/runs/{monitor.run_id}/hazard").json()
    assert hazard["steps"][-1] == 59 and monitor.hazard == pytest.approx(hazard["hazard"][-1])
    assert monitor.finish(timeout=30)


def test_commands_reach_the_handler_once_and_its_answer_reaches_the_server(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    monitor = Monitor(server.url, run_name="commands", spool_dir=tmp_path, sender_config=FAST)
    monitor.log(0, {"m": 0.0})
    wait_until(lambda: server.last_step(monitor.run_id) == 0, what="the run")
    early = _command(server, monitor.run_id, "checkpoint")
    time.sleep(1.0)  # no handler yet: nothing asks for commands, so it stays pending
    assert _commands(server, monitor.run_id)[early]["state"] == "pending"

    seen: list[Command] = []
    threads: set[str] = set()

    def handle(command: Command) -> str:
        seen.append(command)
        threads.add(threading.current_thread().name)
        if command.action == "explode":
            raise RuntimeError("no such thing")
        return f"done {command.action} {command.payload.get('n', '')}".strip()

    monitor.on_command(handle)
    wait_until(lambda: _commands(server, monitor.run_id)[early]["state"] == "acked", what="the early command acked")
    late = _command(server, monitor.run_id, "stop", n=3)
    bad = _command(server, monitor.run_id, "explode")
    wait_until(lambda: all(c["state"] in ("acked", "failed") for c in _commands(server, monitor.run_id).values()), what="answers")
    listed = _commands(server, monitor.run_id)
    assert (listed[early]["state"], listed[early]["message"]) == ("acked", "done checkpoint")
    assert (listed[late]["state"], listed[late]["message"]) == ("acked", "done stop 3")
    assert (listed[bad]["state"], listed[bad]["message"]) == ("failed", "RuntimeError: no such thing")
    assert [c.id for c in seen] == [early, late, bad] and seen[1].payload == {"n": 3}
    assert threads and threading.current_thread().name not in threads
    assert monitor.finish(timeout=30)


def test_commands_go_on_reaching_the_trainer_after_a_server_restart(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    monitor = Monitor(server.url, run_name="restart", spool_dir=tmp_path, sender_config=FAST)
    seen: list[str] = []
    monitor.on_command(lambda command: seen.append(command.id))
    monitor.log(0, {"m": 0.0})
    wait_until(lambda: server.last_step(monitor.run_id) == 0, what="the run")
    first = _command(server, monitor.run_id, "checkpoint")
    wait_until(lambda: seen == [first], what="the first command")
    server.kill()
    for step in range(1, 20):
        monitor.log(step, {"m": 0.0})  # spooled while the server is away; never blocks
    server.start()
    second = _command(server, monitor.run_id, "checkpoint")
    wait_until(lambda: seen == [first, second], timeout=60, what="the command after the restart")
    wait_until(lambda: _commands(server, monitor.run_id)[second]["state"] == "acked", what="its answer")
    assert monitor.finish(timeout=30)
    assert server.last_step(monitor.run_id) == 19


def test_handlers_that_name_their_actions_get_only_those_and_the_run_says_which(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    monitor = Monitor(server.url, run_name="actions", spool_dir=tmp_path, sender_config=FAST)
    monitor.log(0, {"m": 0.0})
    wait_until(lambda: server.last_step(monitor.run_id) == 0, what="the run")
    run_url = f"{server.url}/api/v1/runs/{monitor.run_id}"
    assert httpx.get(run_url).json()["actions"] is None
    saved: list[str] = []
    rolled: list[str] = []
    monitor.on_command(lambda command: saved.append(command.id) or "saved", {"checkpoint": "saves the weights"})
    monitor.on_command(lambda command: rolled.append(command.id) or "rolled back", {"rollback": "restores the last good weights"})
    wait_until(lambda: httpx.get(run_url).json()["actions"] == {"checkpoint": "saves the weights", "rollback": "restores the last good weights"},
               what="the run's actions")  # fmt: skip
    refused = httpx.post(f"{run_url}/commands", json={"action": "stop"})
    assert refused.status_code == 409 and "takes checkpoint, rollback, not 'stop'" in refused.json()["detail"]
    checkpoint = _command(server, monitor.run_id, "checkpoint")
    rollback = _command(server, monitor.run_id, "rollback")
    wait_until(lambda: all(c["state"] == "acked" for c in _commands(server, monitor.run_id).values()), what="answers")
    listed = _commands(server, monitor.run_id)
    assert (saved, rolled) == ([checkpoint], [rollback])
    assert (listed[checkpoint]["message"], listed[rollback]["message"]) == ("saved", "rolled back")
    with pytest.raises(ValueError, match="name at least one action"):
        monitor.on_command(lambda command: None, {})
    assert monitor.finish(timeout=30)

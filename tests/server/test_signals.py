"""The server tells a trainer on its own ingest socket: alert changes, the hazard, commands
(docs/protocol.md, "Signals"), written from the docs with a raw client."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support.hazard import collapsing_values, rising_model_file
from tests.support.raw_client import new_run, open_ingest, points


def _hello(ws: Any, run: dict[str, Any], listen: list[str] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "hello", "protocol": 1, "run": run}
    if listen is not None:
        message["listen"] = listen
    ws.send(json.dumps(message))
    return dict(json.loads(ws.recv(timeout=10)))


def _until(ws: Any, kind: str, timeout: float = 10.0, **match: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The first message of `kind` (whose fields equal `match`), and what came before it."""
    before: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if message["type"] == kind and all(message.get(k) == v for k, v in match.items()):
            return message, before
        before.append(message)


def _rule(server: Any, **fields: Any) -> dict[str, Any]:
    body = {"name": "m high", "metric": "m", "detector": "threshold", "params": {"op": ">", "threshold": 1.0}, "severity": "critical", **fields}
    response = httpx.post(f"{server.url}/api/v1/rules", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def _commands(server: Any, run_id: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{server.url}/api/v1/runs/{run_id}/commands")
    assert response.status_code == 200, response.text
    return list(response.json())


def _send_command(server: Any, run_id: str, action: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/api/v1/runs/{run_id}/commands", json={"action": action, "payload": payload or {}})
    assert response.status_code == 202, response.text
    return dict(response.json())


def test_a_client_that_does_not_listen_gets_acks_only(server) -> None:  # type: ignore[no-untyped-def]
    _rule(server, run_id=None)
    run = new_run()
    with open_ingest(server) as ws:
        welcome = _hello(ws, run)
        assert welcome["signals"] == ["alerts", "hazard", "commands"]
        _send_command(server, run["id"], "checkpoint")
        for seq, value in enumerate([0.5, 5.0, 5.0]):
            ws.send(points(seq, [{"step": seq, "values": {"m": value}}]))
        received = [json.loads(ws.recv(timeout=10)) for _ in range(3)]
        assert [m["type"] for m in received] == ["ack", "ack", "ack"]
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1.0)
    assert httpx.get(f"{server.url}/api/v1/alerts", params={"run_id": run["id"], "state": "firing"}).json()
    assert [c["state"] for c in _commands(server, run["id"])] == ["pending"]


def test_a_listening_client_is_told_its_alerts_as_they_fire_and_resolve(server) -> None:  # type: ignore[no-untyped-def]
    _rule(server)
    run = new_run()
    with open_ingest(server) as ws:
        _hello(ws, run, ["alerts"])
        snapshot, _ = _until(ws, "alerts")
        assert snapshot["firing"] == []
        ws.send(points(0, [{"step": 0, "values": {"m": 0.5}}, {"step": 1, "values": {"m": 3.0}}]))
        fired, before = _until(ws, "alert")
        assert {"type": "ack", "seq": 0} in before or _until(ws, "ack", seq=0)
        assert fired["alert"]["state"] == "firing" and fired["alert"]["rule"] == "m high"
        assert fired["alert"]["severity"] == "critical" and fired["alert"]["started_step"] == 1
        ws.send(points(1, [{"step": 2, "values": {"m": 0.1}}]))
        resolved, _ = _until(ws, "alert")
        assert resolved["alert"]["state"] == "resolved" and resolved["alert"]["id"] == fired["alert"]["id"]
    # A new connection that listens is told what is firing now, at once.
    with open_ingest(server) as ws:
        _hello(ws, run)  # nothing asked yet
        ws.send(points(2, [{"step": 3, "values": {"m": 9.0}}]))
        _until(ws, "ack", seq=2)
        time.sleep(0.5)  # the alert fires meanwhile; this socket is not listening
        ws.send(json.dumps({"type": "listen", "listen": ["alerts", "something-newer"]}))
        snapshot, before = _until(ws, "alerts")
        assert [a["rule"] for a in snapshot["firing"]] == ["m high"]
        assert all(m["type"] != "alert" for m in before)


def test_commands_reach_a_listening_trainer_at_least_once_and_its_answer_is_kept(server) -> None:  # type: ignore[no-untyped-def]
    run = new_run()
    with open_ingest(server) as ws:
        _hello(ws, run)
    early = _send_command(server, run["id"], "checkpoint", {"tag": "before-listen"})
    assert early["state"] == "pending" and early["requested_by"] == "local"
    with open_ingest(server) as ws:
        _hello(ws, run, ["commands"])
        message, _ = _until(ws, "command")
        assert message["command"]["id"] == early["id"] and message["command"]["payload"] == {"tag": "before-listen"}
        deadline = time.monotonic() + 10
        while _commands(server, run["id"])[0]["state"] != "delivered":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # not answered: the connection drops, the next one is sent it again
    with open_ingest(server) as ws:
        _hello(ws, run, ["commands"])
        again, _ = _until(ws, "command")
        assert again["command"]["id"] == early["id"]
        ws.send(json.dumps({"type": "command_result", "id": early["id"], "ok": True, "message": "saved step 40"}))
        later = _send_command(server, run["id"], "stop")
        stop, _ = _until(ws, "command")
        assert stop["command"]["id"] == later["id"] and stop["command"]["action"] == "stop"
        ws.send(json.dumps({"type": "command_result", "id": later["id"], "ok": False, "message": "RuntimeError: disk full"}))
        ws.send(json.dumps({"type": "command_result", "id": early["id"], "ok": False, "message": "a repeat"}))
        ws.send(points(0, [{"step": 0, "values": {"m": 0.0}}]))
        _until(ws, "ack", seq=0)  # frames are handled in order: both answers are stored
    listed = {c["id"]: c for c in _commands(server, run["id"])}
    assert (listed[early["id"]]["state"], listed[early["id"]]["message"]) == ("acked", "saved step 40")
    assert (listed[later["id"]]["state"], listed[later["id"]]["message"]) == ("failed", "RuntimeError: disk full")
    assert listed[later["id"]]["delivered_at"] is not None and listed[later["id"]]["finished_at"] is not None
    # Nothing answered is sent again.
    with open_ingest(server) as ws:
        _hello(ws, run, ["commands"])
        ws.send(points(1, [{"step": 1, "values": {"m": 0.0}}]))
        _, before = _until(ws, "ack", seq=1)
        assert all(m["type"] != "command" for m in before)


def test_a_rule_with_an_action_sends_it_as_a_command_when_it_fires(server) -> None:  # type: ignore[no-untyped-def]
    rule = _rule(server, action="checkpoint")
    assert rule["action"] == "checkpoint"
    run = new_run()
    with open_ingest(server) as ws:
        _hello(ws, run, ["commands", "alerts"])
        ws.send(points(0, [{"step": step, "values": {"m": 2.0 if step >= 5 else 0.0}} for step in range(10)]))
        command, _ = _until(ws, "command")
    assert command["command"]["action"] == "checkpoint"
    assert command["command"]["requested_by"] == "rule m high"
    assert command["command"]["payload"]["step"] == 5 and command["command"]["payload"]["severity"] == "critical"
    # The action can be taken away again.
    patched = httpx.patch(f"{server.url}/api/v1/rules/{rule['id']}", json={"action": ""})
    assert patched.status_code == 200 and patched.json()["action"] is None


def test_a_listening_client_is_sent_the_hazard_once_a_step(server_factory, database_url, tmp_path) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(database_url, hazard_model=rising_model_file(tmp_path))
    run = new_run()
    with open_ingest(server) as ws:
        _hello(ws, run, ["hazard"])
        hazards: list[dict[str, Any]] = []
        for seq in range(8):
            steps = range(seq * 10, seq * 10 + 10)
            ws.send(points(seq, [{"step": s, "values": collapsing_values(s)} for s in steps]))
            while True:
                message = json.loads(ws.recv(timeout=10))
                if message["type"] == "hazard":
                    hazards.append(message)
                elif message == {"type": "ack", "seq": seq}:
                    break
        deadline = time.monotonic() + 5
        while not hazards or hazards[-1]["step"] < 79:
            try:
                message = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            except TimeoutError:
                break
            if message["type"] == "hazard":
                hazards.append(message)
        read = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/hazard", params={"max_points": 1000}).json()
    steps = [h["step"] for h in hazards]
    assert steps == sorted(set(steps)) and steps[-1] == 79 and steps[0] >= 30  # past the warm-up, never twice
    by_step = dict(zip(read["steps"], read["hazard"], strict=True))
    assert all(h["hazard"] == pytest.approx(by_step[h["step"]]) for h in hazards if h["step"] < 79)


def test_commands_need_an_admin_token_and_a_known_run(server_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(sqlite_url, auth=True, bootstrap_token="keel_admin_bootstrap_token_0123456789")
    admin = {"Authorization": "Bearer keel_admin_bootstrap_token_0123456789"}
    run = new_run()
    created = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json={"action": "stop"}, headers=admin)
    assert created.status_code == 404
    with open_ingest_as(server, admin) as ws:
        _hello(ws, run)
    assert httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json={"action": "stop"}).status_code == 401
    for bad in ({"action": "no spaces"}, {"action": ""}, {"action": "x" * 65}, {"action": "stop", "extra": 1}):
        assert httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json=bad, headers=admin).status_code == 422, bad
    created = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json={"action": "stop"}, headers=admin)
    assert created.status_code == 202 and created.json()["requested_by"] == "bootstrap"


def test_a_command_payload_is_judged_as_a_run_config_is(server) -> None:  # type: ignore[no-untyped-def]
    """At most 32 levels deep and no NUL in any key or value: 422 saying why, on both
    databases (a payload 300 deep was a 500, one 253 deep was accepted and then jammed the
    delivery of every command after it)."""
    run = new_run()
    with open_ingest_as(server, {}) as ws:
        _hello(ws, run)
    url = f"{server.url}/api/v1/runs/{run['id']}/commands"

    def nested(depth: int) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        for _ in range(depth - 1):
            payload = {"a": payload}
        return payload

    assert httpx.post(url, json={"action": "x", "payload": nested(32)}).status_code == 202
    for payload, why in ((nested(33), "nests deeper than 32"), (nested(300), "nests deeper than 32"),
                         ({"why": "a\x00b"}, "NUL"), ({"a\x00": 1}, "NUL")):  # fmt: skip
        refused = httpx.post(url, json={"action": "x", "payload": payload})
        assert refused.status_code == 422 and why in refused.text, (why, refused.status_code, refused.text[:300])
    listed = httpx.get(url).json()
    assert len(listed) == 1 and listed[0]["action"] == "x"


def test_pending_commands_are_capped_replaced_by_action_and_all_delivered_oldest_first(server) -> None:  # type: ignore[no-untyped-def]
    """A run holds at most MAX_PENDING pending commands (429 past it); a newer command replaces
    a pending one with the same action; a trainer that starts listening gets every unanswered
    command, oldest first, in pages, however many there are; one that cannot be encoded (a
    payload stored before payloads were judged) is marked failed with why, and the rest go."""
    import time as clock

    from sqlalchemy import create_engine, text

    from server.db import async_url
    from server.run_commands import MAX_PENDING, PAGE

    run = new_run()
    with open_ingest(server) as ws:
        _hello(ws, run)
    first_stop = _send_command(server, run["id"], "stop")
    made = [_send_command(server, run["id"], f"a{i}") for i in range(MAX_PENDING - 2)]
    # One whose payload no JSON encoder takes, written as an old server could have.
    url = async_url(server.database_url)
    engine = create_engine(url.set(drivername="sqlite" if url.get_backend_name() == "sqlite" else "postgresql+psycopg"))
    deep: Any = {}
    for _ in range(300):
        deep = {"a": deep}
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO commands (id, run_id, action, payload, state, requested_by, created_at, message) "
                 "VALUES ('bad', :run, 'deep', :payload, 'pending', 'old', :at, '')"),  # fmt: skip
            {"run": run["id"], "payload": json.dumps(deep), "at": clock.time()},
        )
    engine.dispose()
    refused = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json={"action": "one-too-many"})
    assert refused.status_code == 429 and f"{MAX_PENDING} commands pending" in refused.text, refused.text
    second_stop = _send_command(server, run["id"], "stop")  # replaces the first: allowed at the cap
    listed = {c["id"]: c for c in _commands(server, run["id"])}
    assert listed[first_stop["id"]]["state"] == "failed" and second_stop["id"] in listed[first_stop["id"]]["message"]
    assert MAX_PENDING > PAGE  # the delivery below takes more than one page
    with open_ingest(server) as ws:
        _hello(ws, run, ["commands"])
        received = []
        while len(received) < MAX_PENDING - 1:
            message, _ = _until(ws, "command")
            received.append(message["command"]["id"])
    assert received == [c["id"] for c in made] + [second_stop["id"]]
    deadline = clock.monotonic() + 10
    while (bad := next(c for c in _commands(server, run["id"]) if c["id"] == "bad"))["state"] != "failed":
        assert clock.monotonic() < deadline
        clock.sleep(0.05)
    assert bad["message"].startswith("cannot be sent to a trainer:"), bad


def test_a_rule_that_fires_again_and_again_leaves_one_pending_command_of_its_action(server) -> None:  # type: ignore[no-untyped-def]
    """A rule's action obeys what a command over REST does: a newer one replaces the one still
    pending with the same action, so a flapping metric on a run whose trainer is away leaves
    one `stop` (the newest), not one per firing past the run's cap; the trainer that comes back
    is sent that one."""
    import time as clock

    from server.run_commands import MAX_PENDING

    _rule(server, action="stop", keep_firing_for=1)
    run = new_run()
    steps = 2 * MAX_PENDING + 50
    with open_ingest(server) as ws:
        _hello(ws, run)
        ws.send(points(0, [{"step": step, "values": {"m": 5.0 if step % 2 else 0.0}} for step in range(steps)]))
        _until(ws, "ack", seq=0)
        deadline = clock.monotonic() + 30
        while not any(c["payload"].get("step") == steps - 1 for c in _commands(server, run["id"])):
            assert clock.monotonic() < deadline, "the last firing's command"
            clock.sleep(0.1)
        commands = _commands(server, run["id"])
        pending = [c for c in commands if c["state"] == "pending"]
        assert [c["payload"]["step"] for c in pending] == [steps - 1], [(c["state"], c["payload"]) for c in commands[:5]]
        replaced = [c for c in commands if c["state"] == "failed"]
        assert len(replaced) == len(commands) - 1 and all(c["message"].startswith("replaced by ") for c in replaced)
        ws.send(json.dumps({"type": "listen", "listen": ["commands"]}))
        sent, _ = _until(ws, "command")
        assert sent["command"]["id"] == pending[0]["id"]
        ws.send(points(1, [{"step": steps, "values": {"m": 0.0}}]))
        _, before = _until(ws, "ack", seq=1)
        assert all(m["type"] != "command" for m in before)


def open_ingest_as(server: Any, headers: dict[str, str]) -> Any:
    from websockets.sync.client import connect

    return connect(f"{server.ws_url}/api/v1/ingest", additional_headers=headers, open_timeout=10)


def test_a_malformed_listen_closes_4400(server) -> None:  # type: ignore[no-untyped-def]
    with open_ingest(server) as ws:
        _hello(ws, new_run())
        ws.send(json.dumps({"type": "listen", "listen": "alerts"}))
        error = json.loads(ws.recv(timeout=10))
        assert error["type"] == "error"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400


def test_a_trainer_says_which_actions_it_takes_and_no_other_is_left_pending(server) -> None:  # type: ignore[no-untyped-def]
    run = new_run()
    run_url = f"{server.url}/api/v1/runs/{run['id']}"
    with open_ingest(server) as ws:
        _hello(ws, run)
        ws.send(points(0, [{"step": 0, "values": {"m": 0.5}}]))
        _until(ws, "ack")
        assert httpx.get(run_url).json()["actions"] is None  # nothing of it listens to commands
        ws.send(json.dumps({"type": "listen", "listen": ["commands"], "actions": {"rollback": "restores the last good weights"}}))
        # The listen is stored before the next frame is read: an ack after it follows it.
        ws.send(points(1, [{"step": 1, "values": {"m": 0.5}}]))
        _until(ws, "ack", seq=1)
        assert httpx.get(run_url).json()["actions"] == {"rollback": "restores the last good weights"}
        refused = httpx.post(f"{run_url}/commands", json={"action": "stop"})
        assert refused.status_code == 409, refused.text
        assert "takes rollback, not 'stop'" in refused.json()["detail"]
        taken = _send_command(server, run["id"], "rollback")
        command, _ = _until(ws, "command")
        assert command["command"]["id"] == taken["id"]
        # A command delivered and not answered when the run ends will not be answered.
        ws.send(json.dumps({"type": "finish", "status": "finished"}))
        _until(ws, "bye")
    assert [(c["action"], c["state"], c["message"]) for c in _commands(server, run["id"])] == [
        ("rollback", "failed", "the run ended (finished) before its trainer answered")
    ]
    ended = httpx.post(f"{run_url}/commands", json={"action": "rollback"})
    assert ended.status_code == 409 and "is finished: no trainer is there" in ended.json()["detail"], ended.text


def test_a_trainer_that_listens_without_naming_actions_takes_any(server) -> None:  # type: ignore[no-untyped-def]
    run = new_run()
    with open_ingest(server) as ws:
        _hello(ws, run, ["commands"])
        ws.send(points(0, [{"step": 0, "values": {"m": 0.5}}]))
        _until(ws, "ack")
        assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["actions"] == {}
        made = _send_command(server, run["id"], "my-own-action")
        command, _ = _until(ws, "command")
        assert command["command"]["action"] == "my-own-action" and made["state"] == "pending"


def test_a_rule_action_no_trainer_takes_is_stored_failed_with_why(server) -> None:  # type: ignore[no-untyped-def]
    _rule(server, action="stop")
    run = new_run()
    with open_ingest(server) as ws:
        hello: dict[str, Any] = {"type": "hello", "protocol": 1, "run": run, "listen": ["commands"], "actions": {"checkpoint": "saves"}}
        ws.send(json.dumps(hello))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        ws.send(points(0, [{"step": 0, "values": {"m": 0.5}}, {"step": 1, "values": {"m": 5.0}}]))
        _until(ws, "ack")
        deadline = time.monotonic() + 10
        while not (listed := _commands(server, run["id"])) and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(TimeoutError):  # nothing is sent to the trainer
            _until(ws, "command", timeout=1.0)
    assert [(c["action"], c["state"], c["message"]) for c in listed] == [
        ("stop", "failed", "this run's trainer takes checkpoint, not 'stop'")
    ]


def test_malformed_actions_close_4400(server) -> None:  # type: ignore[no-untyped-def]
    run = new_run()
    with open_ingest(server) as ws:
        _hello(ws, run)
        ws.send(json.dumps({"type": "listen", "listen": ["commands"], "actions": {"bad name!": "x"}}))
        error = json.loads(ws.recv(timeout=10))
        assert error["type"] == "error" and "not an action name" in error["message"]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4400


def test_a_finish_with_frames_it_never_got_ends_the_run_and_counts_them(server) -> None:  # type: ignore[no-untyped-def]
    """A trainer that gives up waiting for acks still says how its run ended, with the seq of
    its last frame: the run is finished (not silent), with the frames it never got counted."""
    run = new_run()
    with open_ingest(server) as ws:
        _hello(ws, run)
        for seq in range(3):
            ws.send(points(seq, [{"step": seq, "values": {"m": 0.5}}]))
        ws.send(json.dumps({"type": "finish", "status": "finished", "last_seq": 7}))
        _until(ws, "bye")
    shown = httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()
    assert (shown["status"], shown["unsent"], shown["last_step"]) == ("finished", 5, 2)
    # `keel sync` sends the rest later, then a finish with nothing left out: none unsent.
    with open_ingest(server) as ws:
        _hello(ws, run)
        for seq in range(3, 8):
            ws.send(points(seq, [{"step": seq, "values": {"m": 0.5}}]))
        ws.send(json.dumps({"type": "finish", "status": "finished"}))
        _until(ws, "bye")
    shown = httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()
    assert (shown["status"], shown["unsent"], shown["last_step"]) == ("finished", None, 7)


def test_the_outbox_holds_each_signal_as_its_wire_message() -> None:
    """What the hub hands a listening socket is read once into its wire message: a malformed
    one is dropped, a type no trainer reads is left out; sending is the tests above (real
    sockets), this is what is held in between."""
    from server.live import LiveHub
    from server.signals import SignalSources, TrainerSignals
    from wire.signals import Alert, AlertMessage, Command, CommandMessage

    alert = AlertMessage("r", Alert(1, "r", "m high", "m", "critical", "firing", 3, None, value=math.inf))
    command = CommandMessage("r", Command("c1", "stop", {"why": "kl"}, "ops", 1.5))

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError("nothing is sent before the socket's turn")

    signals = TrainerSignals(SignalSources(None, LiveHub(), None), "r", send)  # type: ignore[arg-type]  # no store read
    for message in (alert.to_json(), {"type": "alert", "run_id": "r"}, command.to_json(), {"type": "later"}):
        signals._deliver(message)
    assert list(signals._outbox) == [alert, command]

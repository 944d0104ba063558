"""Who speaks for a run (docs/security.md): with auth on, a run belongs to the name of the
token that made it. Another team's token can neither say hello for it (4403: so it can
neither write nor listen to its commands nor answer them) nor write to it over REST (403),
and nothing of the run changes; the ranks of a job sharing one token, a resumed run, a
rotated token (a new one of the same name) and an admin keep working; a run made before
owners (or with auth off) is claimed by the first token that writes to it. Real server,
real sockets, both databases."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.support.raw_client import hello, new_run, points, recv

ADMIN = "keel_test_admin_token_ownership_0123456789"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}


def _token(server: Any, name: str, scopes: tuple[str, ...] = ("ingest", "read")) -> dict[str, str]:
    made = httpx.post(f"{server.url}/api/v1/tokens", json={"name": name, "scopes": list(scopes)}, headers=AS_ADMIN)
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def _socket(server: Any, headers: dict[str, str]) -> ClientConnection:
    return connect(f"{server.ws_url}/api/v1/ingest", additional_headers=headers, open_timeout=10)


def _hello(ws: ClientConnection, run: dict[str, Any], *, writer: str = "", listen: list[str] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "hello", "protocol": 1, "run": run, "writer": writer}
    if listen is not None:
        message["listen"] = listen
    ws.send(json.dumps(message))
    return dict(json.loads(ws.recv(timeout=10)))


def _closed(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=10)
    return closed.value.rcvd.code if closed.value.rcvd else None


def _series(server: Any, run_id: str, key: str) -> list[float]:
    got = httpx.get(f"{server.url}/api/v1/runs/{run_id}/series", params={"key": key}, headers=AS_ADMIN)
    assert got.status_code == 200, got.text
    return list(got.json()["values"])


def _write(ws: ClientConnection, seq: int, step: int, value: float) -> None:
    ws.send(points(seq, [{"step": step, "values": {"m": value}}]))
    assert recv(ws) == {"type": "ack", "seq": seq}


def test_another_teams_token_cannot_speak_for_a_run(server_factory, database_url) -> None:
    server = server_factory(database_url, host="127.0.0.1", auth=True, bootstrap_token=ADMIN)
    team_a, team_b = _token(server, "team-a"), _token(server, "team-b")
    run = new_run("a-run")
    with _socket(server, team_a) as trainer:
        assert _hello(trainer, run, writer="rank0", listen=["commands"])["type"] == "welcome"
        _write(trainer, 0, 0, 1.0)
        # The intruder: a hello for the run's id, another writer, listening to its commands.
        with _socket(server, team_b) as intruder:
            refusal = _hello(intruder, run, writer="rank9", listen=["commands"])
            assert refusal["type"] == "error" and refusal["code"] == "forbidden", refusal
            assert _closed(intruder) == 4403
        stop = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/commands", json={"action": "stop"}, headers=AS_ADMIN).json()
        message = recv(trainer)
        assert message["type"] == "command" and message["command"]["id"] == stop["id"]
        trainer.send(json.dumps({"type": "command_result", "id": stop["id"], "ok": True, "message": "stopping"}))
        _write(trainer, 1, 1, 2.0)  # handled in order: the answer is stored
    answered = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/commands", headers=AS_ADMIN).json()[0]
    assert (answered["state"], answered["message"], answered["answered_by"]) == ("acked", "stopping", "team-a")
    # Over REST: team B's points and config are refused, nothing of the run changes.
    for method, path, body in (("POST", "points", {"rows": [{"step": 5, "values": {"m": 99.0}}]}), ("PATCH", "", {"config": {"x": 1}})):
        url = f"{server.url}/api/v1/runs/{run['id']}" + (f"/{path}" if path else "")
        refused = httpx.request(method, url, json=body, headers=team_b)
        assert refused.status_code == 403 and "another token" in refused.text, (method, refused.text)
    assert _series(server, run["id"], "m") == [1.0, 2.0]
    assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}", headers=AS_ADMIN).json()["config"] == {}
    # Team A's REST write and an admin's go through.
    assert httpx.post(f"{server.url}/api/v1/runs/{run['id']}/points", json={"rows": [{"step": 2, "values": {"m": 3.0}}]}, headers=team_a).status_code == 200
    assert httpx.post(f"{server.url}/api/v1/runs/{run['id']}/points", json={"rows": [{"step": 3, "values": {"m": 4.0}}]}, headers=AS_ADMIN).status_code == 200
    assert _series(server, run["id"], "m") == [1.0, 2.0, 3.0, 4.0]


def test_ranks_sharing_a_token_a_resumed_run_and_a_rotated_token_keep_writing(server_factory, database_url) -> None:
    server = server_factory(database_url, host="127.0.0.1", auth=True, bootstrap_token=ADMIN)
    old = _token(server, "team-a")
    run = new_run("shared")
    with _socket(server, old) as rank0, _socket(server, old) as rank1:
        assert _hello(rank0, run, writer="rank0")["type"] == "welcome"
        assert _hello(rank1, run, writer="rank1")["type"] == "welcome"
        _write(rank0, 0, 0, 1.0)
        _write(rank1, 0, 1, 2.0)
    with _socket(server, old) as resumed:  # the job restarts from its checkpoint
        assert _hello(resumed, run, writer="rank0")["acked_seq"] == 0
        _write(resumed, 1, 2, 3.0)
    # Rotation: the old token revoked, a new one of the same name made.
    assert httpx.delete(f"{server.url}/api/v1/tokens/team-a", headers=AS_ADMIN).status_code == 200
    rotated = _token(server, "team-a")
    with _socket(server, rotated) as again:
        assert _hello(again, run, writer="rank0")["acked_seq"] == 1
        _write(again, 2, 3, 4.0)
    assert _series(server, run["id"], "m") == [1.0, 2.0, 3.0, 4.0]


def test_a_run_made_before_owners_is_claimed_by_the_first_token_that_writes(server_factory, database_url) -> None:
    open_server = server_factory(database_url)  # auth off: runs get no owner
    run = new_run("legacy")
    with connect(f"{open_server.ws_url}/api/v1/ingest", open_timeout=10) as ws:
        assert hello(ws, run)["type"] == "welcome"
    open_server.stop()
    server = server_factory(database_url, host="127.0.0.1", auth=True, bootstrap_token=ADMIN)
    team_a, team_b = _token(server, "team-a"), _token(server, "team-b")
    with _socket(server, team_a) as ws:
        assert _hello(ws, run)["type"] == "welcome"  # claims it
    with _socket(server, team_b) as ws:
        assert _hello(ws, run)["code"] == "forbidden"


def test_a_rules_action_fires_only_on_points_the_runs_own_writers_wrote(server_factory, database_url) -> None:
    """An admin's rule whose action is `stop`; another team's token posts the metric past the
    rule's threshold to the run's /points (403) and says hello for the run to stream it (4403):
    nothing fires. The run's own trainer is told to stop once its own point is past it, and
    only then: one command, for its own step."""
    server = server_factory(database_url, host="127.0.0.1", auth=True, bootstrap_token=ADMIN)
    team_a, team_b = _token(server, "team-a"), _token(server, "team-b")
    rule = {"name": "m high", "metric": "m", "detector": "threshold", "params": {"op": ">", "threshold": 1.0}, "action": "stop"}
    assert httpx.post(f"{server.url}/api/v1/rules", json=rule, headers=AS_ADMIN).status_code == 201
    run = new_run("guarded")
    with _socket(server, team_a) as trainer:
        assert _hello(trainer, run, writer="rank0", listen=["commands"])["type"] == "welcome"
        _write(trainer, 0, 0, 0.5)
        foreign = httpx.post(f"{server.url}/api/v1/runs/{run['id']}/points", json={"rows": [{"step": 1, "values": {"m": 5.0}}]}, headers=team_b)
        assert foreign.status_code == 403, foreign.text
        with _socket(server, team_b) as intruder:
            assert _hello(intruder, run, writer="rank9")["code"] == "forbidden"
            assert _closed(intruder) == 4403
        _write(trainer, 1, 2, 0.5)
        trainer.send(points(2, [{"step": 3, "values": {"m": 5.0}}]))
        received = [recv(trainer) for _ in range(2)]
    command = next(message["command"] for message in received if message["type"] == "command")
    assert {"type": "ack", "seq": 2} in received and (command["action"], command["payload"]["step"]) == ("stop", 3), received
    listed = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/commands", headers=AS_ADMIN).json()
    assert [(c["action"], c["payload"]["step"]) for c in listed] == [("stop", 3)], listed
    assert _series(server, run["id"], "m") == [0.5, 0.5, 5.0]

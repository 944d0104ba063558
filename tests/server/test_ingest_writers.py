"""An ack means "these rows are stored", whatever the client does: gaps, a second writer,
a superseded connection, a hello that does not match the run (docs/protocol.md)."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support.raw_client import hello, new_run, open_ingest, points, recv, series


def _rows(steps: range, m: float) -> list[dict[str, object]]:
    return [{"step": step, "values": {"m": m}} for step in steps]


def _closed_with(ws, close_code: int, error_code: str) -> None:  # type: ignore[no-untyped-def]
    message = recv(ws)
    assert message["type"] == "error" and message["code"] == error_code, message
    assert isinstance(message["message"], str) and message["message"]
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == close_code


def _hello_as(ws, run: dict[str, object], writer: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    ws.send(json.dumps({"type": "hello", "protocol": 1, "run": run, "writer": writer}))
    return dict(json.loads(ws.recv(timeout=10)))


def test_a_seq_that_skips_ahead_is_refused_and_the_frames_after_it_are_stored(server) -> None:
    """The tester's 0, 10**15, 1: the gap closes 4409 unacknowledged; 1 is stored later."""
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, _rows(range(0, 2), m=0.0)))
        assert recv(ws) == {"type": "ack", "seq": 0}
        ws.send(points(10**15, _rows(range(2, 4), m=9.0)))
        _closed_with(ws, 4409, "seq_gap")
    with open_ingest(server) as ws:
        assert hello(ws, run)["acked_seq"] == 0
        ws.send(points(1, _rows(range(4, 6), m=1.0)))
        assert recv(ws) == {"type": "ack", "seq": 1}
    stored = series(server, run["id"], "m")
    assert (stored["steps"], stored["values"]) == ([0, 1, 4, 5], [0.0, 0.0, 1.0, 1.0])
    assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["acked_seq"] == 1


def test_a_second_connection_of_a_writer_supersedes_the_first(server) -> None:
    """Two sockets on one run, both welcomed before sending seq 0: only the newer may write,
    so nothing the older sends is acknowledged (before writers, it was acked and dropped)."""
    run = new_run()
    with open_ingest(server) as first, open_ingest(server) as second:
        assert hello(first, run)["acked_seq"] == -1
        assert hello(second, run)["acked_seq"] == -1
        first.send(points(0, _rows(range(0, 3), m=1.0)))
        _closed_with(first, 4409, "superseded")
        second.send(points(0, _rows(range(10, 13), m=2.0)))
        assert recv(second) == {"type": "ack", "seq": 0}
    stored = series(server, run["id"], "m")
    assert (stored["steps"], stored["values"]) == ([10, 11, 12], [2.0, 2.0, 2.0])


def test_writers_number_their_frames_apart_and_every_acked_row_is_stored_once(server) -> None:
    """Two trainers streaming one run id (a resume on another machine while the first still
    runs): each writer's seq 0, 1, 2 are its own, none taken for the other's resend."""
    run = new_run()
    with open_ingest(server) as a, open_ingest(server) as b:
        assert _hello_as(a, run, "writer-a")["acked_seq"] == -1
        assert _hello_as(b, run, "writer-b")["acked_seq"] == -1
        for seq in range(3):
            a.send(points(seq, _rows(range(seq * 10, seq * 10 + 2), m=1.0)))
            b.send(points(seq, _rows(range(100 + seq * 10, 100 + seq * 10 + 2), m=2.0)))
            assert recv(a) == {"type": "ack", "seq": seq}
            assert recv(b) == {"type": "ack", "seq": seq}
        a.send(points(1, _rows(range(10, 12), m=7.0)))  # a resend: acked, not written again
        assert recv(a) == {"type": "ack", "seq": 1}
    with open_ingest(server) as a_again:
        assert _hello_as(a_again, run, "writer-a")["acked_seq"] == 2
    stored = series(server, run["id"], "m")
    expected = [s * 10 + i for s in range(3) for i in range(2)] + [100 + s * 10 + i for s in range(3) for i in range(2)]
    assert stored["steps"] == expected
    assert stored["values"] == [1.0] * 6 + [2.0] * 6


def test_a_hello_for_a_run_of_another_project_is_refused(server) -> None:
    run = new_run(project="vision")
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, _rows(range(2), m=1.0)))
        assert recv(ws) == {"type": "ack", "seq": 0}
    with open_ingest(server) as ws:
        ws.send(json.dumps({"type": "hello", "protocol": 1, "run": {**run, "project": "language"}}))
        _closed_with(ws, 4409, "run_conflict")
    stored = httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()
    assert stored["project"] == "vision"


def test_a_hello_alone_does_not_reopen_a_finished_run_and_new_frames_do(server) -> None:
    run = new_run()
    url = f"{server.url}/api/v1/runs/{run['id']}"
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, _rows(range(2), m=1.0)))
        assert recv(ws) == {"type": "ack", "seq": 0}
        ws.send(json.dumps({"type": "finish", "status": "finished"}))
        assert recv(ws) == {"type": "bye"}
    with open_ingest(server) as ws:
        assert hello(ws, run)["acked_seq"] == 0
        ws.send(points(0, _rows(range(2), m=1.0)))  # a resend of what the run holds
        assert recv(ws) == {"type": "ack", "seq": 0}
    assert httpx.get(url).json()["status"] == "finished"
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(1, _rows(range(2, 4), m=1.0)))  # the run resumed: new data
        assert recv(ws) == {"type": "ack", "seq": 1}
        assert httpx.get(url).json()["status"] == "running"


@pytest.mark.parametrize("depth", [300, 1000])
def test_a_config_nested_too_deep_is_refused_at_hello_and_the_runs_stay_readable(server, depth: int) -> None:
    run = new_run()
    nested = '{"a":' * depth + "{}" + "}" * depth
    hello_json = json.dumps({"type": "hello", "protocol": 1, "run": run}).replace('"config": {}', f'"config": {nested}')
    with open_ingest(server) as ws:
        ws.send(hello_json)
        _closed_with(ws, 4400, "malformed")
    assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").status_code == 404
    assert httpx.get(f"{server.url}/api/v1/runs").status_code == 200


def test_a_huge_frame_is_written_in_several_transactions_and_acked_whole(server_factory, sqlite_url) -> None:
    """POINTS_PER_TRANSACTION at a time; the ack comes after the last, every row stored."""
    from server.storage import POINTS_PER_TRANSACTION

    steps = 3 * POINTS_PER_TRANSACTION // 4 + 7  # x 4 keys: three transactions
    server = server_factory(sqlite_url, max_rows_per_frame=steps)
    run = new_run()
    rows = [{"step": step, "values": {"a": step, "b": -step, "c": 0.5, "d": 1.5}} for step in range(steps)]
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, rows))
        assert recv(ws) == {"type": "ack", "seq": 0}
    stored = series(server, run["id"], "b", max_points=steps)
    assert stored["steps"] == list(range(steps)) and stored["values"] == [-float(s) for s in range(steps)]

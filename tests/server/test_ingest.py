"""The ingest websocket over real sockets, on SQLite and PostgreSQL."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support.raw_client import hello, new_run, open_ingest, points, recv, series


def _rows(steps: range, **values: object) -> list[dict[str, object]]:
    return [{"step": s, "time": 1_700_000_000.0 + s, "values": {k: (v(s) if callable(v) else v) for k, v in values.items()}} for s in steps]


def test_stream_stores_exact_values_and_acks_in_order(server) -> None:
    run = new_run("exact", group="cispo", config={"lr": 2.0}, tags=["toy"])
    with open_ingest(server) as ws:
        welcome = hello(ws, run)
        assert welcome == {"type": "welcome", "run_id": run["id"], "acked_seq": -1, "accepts": ["histograms", "samples", "sequences"], "signals": ["alerts", "hazard", "commands"]}
        # Several frames in flight before reading any ack.
        for seq in range(5):
            ws.send(points(seq, _rows(range(seq * 10, seq * 10 + 10), **{"reward/mean": lambda s: s / 100, "grad/norm": lambda s: 2.5 * s})))
        assert [recv(ws) for _ in range(5)] == [{"type": "ack", "seq": s} for s in range(5)]
        ws.send(json.dumps({"type": "finish", "status": "finished"}))
        assert recv(ws) == {"type": "bye"}
    reward = series(server, run["id"], "reward/mean")
    assert reward["downsampled"] is False
    assert reward["steps"] == list(range(50))
    assert reward["values"] == [s / 100 for s in range(50)]
    assert series(server, run["id"], "grad/norm")["values"] == [2.5 * s for s in range(50)]
    detail = httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()
    assert detail["status"] == "finished"
    assert detail["last_step"] == 49
    assert detail["config"] == {"lr": 2.0}
    assert detail["group"] == "cispo" and detail["tags"] == ["toy"]
    keys = httpx.get(f"{server.url}/api/v1/runs/{run['id']}/keys").json()
    assert keys == [
        {"key": "grad/norm", "count": 50, "last_step": 49},
        {"key": "reward/mean", "count": 50, "last_step": 49},
    ]


def test_non_finite_values_round_trip_distinctly(server) -> None:
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [
            {"step": 0, "values": {"x": "nan"}},
            {"step": 1, "values": {"x": "inf"}},
            {"step": 2, "values": {"x": "-inf"}},
            {"step": 3, "values": {"x": 1e308}},
            {"step": 4, "values": {"x": -0.0}},
            {"step": 5, "values": {"x": 7}},
        ]))
        assert recv(ws) == {"type": "ack", "seq": 0}
    assert series(server, run["id"], "x")["values"] == ["nan", "inf", "-inf", 1e308, -0.0, 7.0]


def test_resent_frame_is_acked_again_and_not_stored_twice(server) -> None:
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, _rows(range(3), m=1.0)))
        assert recv(ws) == {"type": "ack", "seq": 0}
        # Same seq, different content: acknowledged, ignored.
        ws.send(points(0, _rows(range(3), m=9.0)))
        assert recv(ws) == {"type": "ack", "seq": 0}
        # New seq carrying an already stored (key, step): the first value is kept.
        ws.send(points(1, _rows(range(2, 5), m=2.0)))
        assert recv(ws) == {"type": "ack", "seq": 1}
    data = series(server, run["id"], "m")
    assert data["steps"] == [0, 1, 2, 3, 4]
    assert data["values"] == [1.0, 1.0, 1.0, 2.0, 2.0]


def test_reconnect_resumes_from_acked_seq(server) -> None:
    run = new_run("resume", config={"a": 1})
    with open_ingest(server) as ws:
        hello(ws, run)
        for seq in range(3):
            ws.send(points(seq, _rows(range(seq, seq + 1), m=float(seq))))
        assert [recv(ws)["seq"] for _ in range(3)] == [0, 1, 2]
    with open_ingest(server) as ws:
        # A hello for an existing id resumes it: same run, config kept.
        welcome = hello(ws, {**run, "config": {"a": 2}})
        assert welcome == {"type": "welcome", "run_id": run["id"], "acked_seq": 2, "accepts": ["histograms", "samples", "sequences"], "signals": ["alerts", "hazard", "commands"]}
        ws.send(points(2, _rows(range(2, 3), m=99.0)))  # resend of an acked frame
        ws.send(points(3, _rows(range(3, 4), m=3.0)))
        assert [recv(ws)["seq"] for _ in range(2)] == [2, 3]
    assert series(server, run["id"], "m")["values"] == [0.0, 1.0, 2.0, 3.0]
    runs = httpx.get(f"{server.url}/api/v1/runs").json()
    assert [r["id"] for r in runs] == [run["id"]]
    assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["config"] == {"a": 1}


def _expect_close(ws, code: int, error_code: str) -> dict[str, object]:  # type: ignore[no-untyped-def]
    message = recv(ws)
    assert message["type"] == "error" and message["code"] == error_code, message
    assert isinstance(message["message"], str) and message["message"]
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code
    return message


@pytest.mark.parametrize(
    "frame, error_code, close_code",
    [
        ("{not json", "malformed", 4400),
        ('["a list"]', "malformed", 4400),
        (json.dumps({"type": "points", "seq": "1", "rows": []}), "malformed", 4400),
        (json.dumps({"type": "points", "seq": 2**63, "rows": []}), "malformed", 4400),
        (json.dumps({"type": "teleport"}), "malformed", 4400),
        (json.dumps({"type": "finish", "status": "exploded"}), "malformed", 4400),
    ],
)
def test_bad_frame_closes_with_code_and_keeps_acked_data(server, frame: str, error_code: str, close_code: int) -> None:
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, _rows(range(4), m=0.5)))
        assert recv(ws) == {"type": "ack", "seq": 0}
        ws.send(frame)
        _expect_close(ws, close_code, error_code)
    assert series(server, run["id"], "m")["values"] == [0.5] * 4
    assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["acked_seq"] == 0


@pytest.mark.parametrize(
    "rows, error_code",
    [
        ([{"step": -1, "values": {}}], "malformed"),
        ([{"step": 2**62, "values": {"x": 1}}], "malformed"),
        ([{"step": 5, "values": {"x": "big"}}], "malformed"),
        ([{"step": 5, "values": {"x": True}}], "malformed"),
        ([{"step": 5, "values": {"bad\u0000key": 1.0}}], "malformed"),
        ([{"step": s, "values": {"x": 1}} for s in range(10_001)], "too_large"),
    ],
)
def test_a_frame_with_bad_rows_is_rejected_and_the_stream_goes_on(server, rows: list, error_code: str) -> None:
    """Its seq is readable: the server answers `reject`, uses the seq up, keeps the socket."""
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, _rows(range(4), m=0.5)))
        assert recv(ws) == {"type": "ack", "seq": 0}
        ws.send(json.dumps({"type": "points", "seq": 1, "rows": rows}))
        rejected = recv(ws)
        assert rejected["type"] == "reject" and rejected["seq"] == 1 and rejected["code"] == error_code
        assert isinstance(rejected["message"], str) and rejected["message"]
        ws.send(points(2, _rows(range(4, 6), m=2.0)))
        assert recv(ws) == {"type": "ack", "seq": 2}
    assert series(server, run["id"], "m")["values"] == [0.5] * 4 + [2.0] * 2
    assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["acked_seq"] == 2


def test_frame_over_byte_limit_is_refused_with_4413(server_factory, sqlite_url: str) -> None:
    server = server_factory(sqlite_url, max_frame_bytes=10_000)
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, _rows(range(2), m=1.0)))
        assert recv(ws)["type"] == "ack"
        ws.send(points(1, _rows(range(2, 1000), m=1.0)))
        _expect_close(ws, 4413, "too_large")
    assert series(server, run["id"], "m")["steps"] == [0, 1]


def test_hello_must_come_first_and_be_valid(server) -> None:
    with open_ingest(server) as ws:
        ws.send(points(0, []))
        _expect_close(ws, 4400, "malformed")
    with open_ingest(server) as ws:
        ws.send(json.dumps({"type": "hello", "protocol": 99, "run": new_run()}))
        _expect_close(ws, 4400, "unsupported_protocol")
    with open_ingest(server) as ws:
        ws.send(json.dumps({"type": "hello", "protocol": 1, "run": {"name": "no id"}}))
        _expect_close(ws, 4400, "malformed")
    assert httpx.get(f"{server.url}/api/v1/runs").json() == []


def test_a_hello_whose_config_holds_nul_is_refused_like_a_patch(server) -> None:
    """On SQLite it was stored (what PostgreSQL refuses), on PostgreSQL a server fault (1011)."""
    for config in ({"note": "a\x00b"}, {"nested": {"k\x00": [1]}}):
        with open_ingest(server) as ws:
            ws.send(json.dumps({"type": "hello", "protocol": 1, "run": new_run(config=config)}))
            message = _expect_close(ws, 4400, "malformed")
        assert "run.config must not contain NUL" in str(message["message"])
    assert httpx.get(f"{server.url}/api/v1/runs").json() == []


def test_invalid_frame_in_a_pipeline_leaves_earlier_and_later_frames_committed(server) -> None:
    run = new_run()
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, _rows(range(0, 5), m=1.0)))
        ws.send(points(1, _rows(range(5, 10), m=2.0)))
        ws.send(points(2, [{"step": 10, "values": {"m": {"nested": 1}}}]))
        ws.send(points(3, _rows(range(11, 12), m=3.0)))
        assert recv(ws) == {"type": "ack", "seq": 0}
        assert recv(ws) == {"type": "ack", "seq": 1}
        assert recv(ws)["type"] == "reject"
        assert recv(ws) == {"type": "ack", "seq": 3}
    assert series(server, run["id"], "m")["values"] == [1.0] * 5 + [2.0] * 5 + [3.0]
    with open_ingest(server) as ws:
        assert hello(ws, run)["acked_seq"] == 3


def test_finish_statuses(server) -> None:
    for status in ("finished", "failed", "killed"):
        run = new_run(status)
        with open_ingest(server) as ws:
            hello(ws, run)
            ws.send(json.dumps({"type": "finish", "status": status}))
            assert recv(ws) == {"type": "bye"}
        assert httpx.get(f"{server.url}/api/v1/runs/{run['id']}").json()["status"] == status

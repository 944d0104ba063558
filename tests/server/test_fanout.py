"""Live fan-out across replicas (PostgreSQL LISTEN/NOTIFY): a page on one replica sees the
points, alerts and status changes of a run ingested by another, once each."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import psycopg
from websockets.sync.client import ClientConnection, connect

from server.fanout import CHANNEL, MAX_PAYLOAD, Fanout, libpq_url
from tests.support.raw_client import hello, new_run, open_ingest, points, recv


def _until(condition: Any, timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return value


def _collect(live: ClientConnection, done: Any, timeout: float = 15.0) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not done(messages):
        assert time.monotonic() < deadline, f"timed out; got {messages}"
        messages.append(json.loads(live.recv(timeout=timeout)))
    return messages


def _complete(messages: list[dict[str, Any]]) -> bool:
    steps = [row["step"] for m in messages if m["type"] == "points" for row in m["rows"]]
    fired = any(m["type"] == "alert" and m["alert"]["state"] == "firing" for m in messages)
    finished = any(m["type"] == "status" for m in messages)
    return set(steps) >= {0, 1, 2, 3} and fired and finished


def test_pages_on_every_replica_see_a_run_ingested_by_one(postgres_url, server_factory) -> None:
    replicas = [server_factory(postgres_url) for _ in range(2)]
    _until(lambda: all(r.app.state.components.fanout.listening.is_set() for r in replicas))  # type: ignore[attr-defined]
    # Anything else on the channel is ignored, and does not stop the replicas listening.
    import psycopg

    from server.fanout import CHANNEL

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        junks = ("not json", '{"t": "points"}', '{"o": "x", "r": "y", "t": "points", "a": "z"}', '{"o": "x", "n": [{"r": "y", "t": "points", "a": "z"}, 7]}')
        for junk in junks:
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, junk))
    run = new_run("fanned")
    url = "{}/api/v1/live?runs=" + run["id"]
    # The far page watches every run (so the junk above would reach it, were it not ignored).
    with connect(url.format(replicas[0].ws_url)) as near, connect(f"{replicas[1].ws_url}/api/v1/live") as far:
        time.sleep(0.2)  # the subscriptions are registered once the sockets are accepted
        with open_ingest(replicas[0]) as ws:
            hello(ws, run)
            ws.send(points(0, [{"step": s, "values": {"m": s / 3, "n": "inf" if s == 2 else 0.5}} for s in range(3)]))
            ws.send(points(1, [{"step": 3, "values": {"loss/total": "nan"}}]))  # non-finite: an alert
            assert [recv(ws)["seq"] for _ in range(2)] == [0, 1]
            ws.send(json.dumps({"type": "finish", "status": "finished"}))
            assert recv(ws)["type"] == "bye"
        seen = {name: _collect(live, _complete) for name, live in (("near", near), ("far", far))}
    for name, messages in seen.items():
        rows = [row for m in messages if m["type"] == "points" for row in m["rows"]]
        assert [row["step"] for row in rows] == [0, 1, 2, 3], name  # each step once, in order
        assert [row["values"].get("m") for row in rows[:3]] == [0.0, 1 / 3, 2 / 3], name
        assert [row["values"].get("n") for row in rows[:3]] == [0.5, 0.5, "inf"], name
        assert rows[3]["values"] == {"loss/total": "nan"}, name
        (alert,) = [m["alert"] for m in messages if m["type"] == "alert" and m["alert"]["state"] == "firing"]
        assert alert["rule"] == "non-finite value" and alert["run_id"] == run["id"], name
        assert [m["status"] for m in messages if m["type"] == "status"] == ["finished"], name


def test_notes_queued_together_reach_the_other_replicas_packed_in_order(postgres_url) -> None:
    """What the hub relays together goes out in one statement, many notes to a notification
    (each under PostgreSQL's payload limit), every note once and in the order relayed."""

    async def scenario() -> list[dict[str, Any]]:
        fanout = Fanout(store=None, database_url=postgres_url)  # type: ignore[arg-type]
        async with await psycopg.AsyncConnection.connect(libpq_url(postgres_url), autocommit=True) as listener:
            await listener.execute(f"LISTEN {CHANNEL}")
            for i in range(2500):  # more than one statement's worth, all queued before the sender starts
                fanout.relay({"r": "run-a", "s": i})
            sender = asyncio.create_task(fanout.send_forever())
            received: list[dict[str, Any]] = []
            try:
                async with asyncio.timeout(15):
                    async for notify in listener.notifies():
                        assert len(notify.payload.encode()) <= MAX_PAYLOAD
                        received.append(json.loads(notify.payload))
                        if sum(len(payload["n"]) for payload in received) == 2500:
                            break
            finally:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
            return received

    received = asyncio.run(scenario())
    notes = [note for payload in received for note in payload["n"]]
    assert [note["s"] for note in notes] == list(range(2500))
    assert {note["r"] for note in notes} == {"run-a"} and len({payload["o"] for payload in received}) == 1
    assert 2 <= len(received) <= 12  # ~24 bytes a note: a few notifications, not 2,500

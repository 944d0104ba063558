"""Frames waiting on a slow database are bounded in bytes over every socket, not per socket."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import psycopg
import pytest
from sqlalchemy.engine import make_url

from server.ingest import FrameBudget
from tests.support.raw_client import hello, new_run, open_ingest, points


def test_the_budget_lets_frames_in_only_while_they_fit() -> None:
    async def scenario() -> list[str]:
        budget, order = FrameBudget(100), []

        async def frame(name: str, size: int, hold: float) -> None:
            async with budget.reserve(size):
                order.append(f"+{name}")
                assert budget.used <= budget.limit
                await asyncio.sleep(hold)
            order.append(f"-{name}")

        await asyncio.gather(frame("a", 60, 0.05), frame("b", 60, 0.0), frame("c", 500, 0.0))
        return order

    # b waits for a; c (larger than the whole budget) waits until it has all of it.
    assert asyncio.run(scenario()) == ["+a", "-a", "+b", "-b", "+c", "-c"]


@pytest.mark.postgres
def test_blocked_sockets_hold_no_more_decoded_frames_than_the_budget(server_factory, postgres_url) -> None:
    limit = 2_000_000
    server = server_factory(postgres_url, ingest_buffer_bytes=limit)
    budget: FrameBudget = server.app.state.components.frame_budget  # type: ignore[attr-defined]
    runs = [new_run(f"r{i}") for i in range(6)]
    sockets = [open_ingest(server) for _ in runs]
    for ws, run in zip(sockets, runs, strict=True):
        hello(ws, run)
    frame_rows = [{"step": s, "values": {f"k{k}": float(s) for k in range(40)}} for s in range(1_000)]
    admin = make_url(postgres_url).render_as_string(hide_password=False)
    locked, release = threading.Event(), threading.Event()

    def hold_lock() -> None:
        with psycopg.connect(admin) as conn:
            conn.execute("LOCK TABLE points IN ACCESS EXCLUSIVE MODE")
            locked.set()
            release.wait(30)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    assert locked.wait(10)
    for ws in sockets:
        ws.send(points(0, frame_rows))  # about 0.9 MB each: two fit in the budget
    peak, deadline = 0, time.monotonic() + 3
    while time.monotonic() < deadline:
        peak = max(peak, budget.used)
        time.sleep(0.02)
    release.set()
    holder.join()
    assert 0 < peak <= limit
    for ws in sockets:
        assert json.loads(ws.recv(timeout=60)) == {"type": "ack", "seq": 0}
        ws.close()
    deadline = time.monotonic() + 10
    while budget.used and time.monotonic() < deadline:  # the last frames' alert evaluation
        time.sleep(0.02)
    assert budget.used == 0

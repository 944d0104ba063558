"""Detector history across restarts: a server that dies without saving detector state
catches up from the stored points, so an alert fires at the same step as without the crash."""

from __future__ import annotations

import math
import random
import time

import httpx

from tests.server.wire import hello, new_run, open_ingest, points, recv


def _stream(server, run: dict, rows: list[dict], first_step: int = 0, seq0: int = 0) -> None:  # type: ignore[no-untyped-def]
    with open_ingest(server) as ws:
        hello(ws, run)
        for i in range(0, len(rows), 10):
            batch = [{"step": first_step + i + j, "values": v} for j, v in enumerate(rows[i : i + 10])]
            ws.send(points(seq0 + i // 10, batch))
            assert recv(ws)["type"] == "ack"


def _climb_alerts(server, run_id: str, timeout: float = 15.0) -> list[tuple[int, int]]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alerts = httpx.get(f"{server.url}/api/v1/alerts", params={"run_id": run_id}).json()
        climbs = [(a["started_step"], a["fired_step"]) for a in alerts if a["rule"] == "mismatch climbing"]
        if climbs:
            return climbs
        time.sleep(0.05)
    return []


def _kl_series() -> list[dict]:
    """Flat noise for 80 steps, then a steady climb (the default "mismatch climbing" rule fires on it)."""
    rng = random.Random(3)
    kl = [1e-3 * math.exp(rng.gauss(0, 0.2)) for _ in range(80)]
    kl += [1e-3 * math.exp(0.05 * i) for i in range(80)]
    return [{"mismatch/kl": value} for value in kl]


def test_a_crash_that_loses_detector_state_is_caught_up_from_stored_points(server_factory, database_url) -> None:
    rows = _kl_series()
    reference = server_factory(database_url)
    ref_run = new_run("reference")
    _stream(reference, ref_run, rows)
    expected = _climb_alerts(reference, ref_run["id"])
    assert expected and expected[0][0] > 80  # fires on the climb, not on the noise

    # The first server stores and acks steps 0..89, but its detector state is saved only
    # after the first frame (then a long checkpoint interval) and it dies without the
    # shutdown flush: the state on disk is at step 9.
    run = new_run("crashed")
    first = server_factory(database_url)
    _stream(first, run, rows[:10])
    engine = first.app.state.alerts  # type: ignore[attr-defined]
    deadline = time.monotonic() + 15
    while run["id"] not in engine._checkpointed:  # evaluation follows the ack
        assert time.monotonic() < deadline
        time.sleep(0.02)
    engine.checkpoint_s = 1e9

    async def crash_without_flush() -> None:
        return None

    engine.flush = crash_without_flush
    _stream(first, run, rows[10:90], first_step=10, seq0=1)
    first.stop()

    second = server_factory(database_url)
    _stream(second, run, rows[90:], first_step=90, seq0=9)
    assert _climb_alerts(second, run["id"]) == expected

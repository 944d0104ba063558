"""Detector history across restarts and replicas: a server that dies without saving detector
state catches up from the stored points, and replicas that take turns with a run evaluate it
as one server would, so alerts fire at the same steps as on one server that never stopped."""

from __future__ import annotations

import asyncio
import math
import random
import time

import httpx
import pytest
from sqlalchemy import select, update

from server.alerts import engine as engine_module
from server.db import create_engine
from server.models import RuleState
from server.storage import Store
from tests.support.raw_client import hello, new_run, open_ingest, points, recv
from wire import Row, RunInfo


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

    # The first server stores, acks and evaluates steps 0..9, then goes on storing and
    # acking steps 10..89 but dies before evaluating them (its alert engine is unhooked,
    # as if every evaluation were cut off by the crash): the state on disk is at step 9.
    run = new_run("crashed")
    first = server_factory(database_url)
    _stream(first, run, rows[:10])
    engine = first.app.state.components.alerts  # type: ignore[attr-defined]
    deadline = time.monotonic() + 15
    while not any(run_id == run["id"] and t.last_step == 9 for (_, run_id), t in engine._tracked.items()):
        assert time.monotonic() < deadline  # evaluation follows the ack
        time.sleep(0.02)
    first.app.state.components.committed.listeners.remove(engine.on_points)  # type: ignore[attr-defined]
    _stream(first, run, rows[10:90], first_step=10, seq0=1)
    first.stop()

    second = server_factory(database_url)
    _stream(second, run, rows[90:], first_step=90, seq0=9)
    assert _climb_alerts(second, run["id"]) == expected


def _all_alerts(server, run_id: str) -> list[tuple]:  # type: ignore[no-untyped-def]
    alerts = httpx.get(f"{server.url}/api/v1/alerts", params={"run_id": run_id}).json()
    return sorted((a["rule"], a["state"], a["started_step"], a["fired_step"], a["resolved_step"]) for a in alerts)


def _settled(read, timeout: float = 15.0) -> list[tuple]:  # type: ignore[no-untyped-def]
    """The value of `read()` once it is non-empty and unchanged for half a second."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        value = read()
        if value and value == last:
            return value  # type: ignore[no-any-return]
        last = value
        time.sleep(0.5)
    raise AssertionError(f"alerts did not settle: {last}")


def test_replicas_taking_turns_with_a_run_evaluate_it_as_one_server(postgres_url, server_factory) -> None:
    """Frames of one run go to two replicas in turn (a trainer reconnecting through a load
    balancer), each replica's evaluation overlapping the other's: same alerts, none twice."""
    rows = _kl_series()
    rows[40] = {"mismatch/kl": "nan"}  # non-finite: fires at once, resolves 20 steps later
    reference = server_factory(postgres_url)
    ref_run = new_run("reference")
    _stream(reference, ref_run, rows)
    expected = _settled(lambda: _all_alerts(reference, ref_run["id"]))
    # The KL alone climbs: the warning, and mismatch drift on a run that logs no ratio tail.
    assert [a[:2] for a in expected] == [("mismatch climbing", "firing"), ("mismatch drift", "firing"), ("non-finite value", "resolved")]

    replicas = (server_factory(postgres_url), server_factory(postgres_url))
    run = new_run("shared")
    for frame, start in enumerate(range(0, len(rows), 10)):
        _stream(replicas[frame % 2], run, rows[start : start + 10], first_step=start, seq0=frame)
    assert _settled(lambda: _all_alerts(replicas[0], run["id"])) == expected


def test_a_new_runs_first_frames_evaluated_on_two_replicas_at_once_lose_no_step(postgres_url, server_factory) -> None:
    """Replica A acks a new run's first frame and is still evaluating it when replica B
    stores and evaluates the next one. B finds no states: it evaluates the committed steps
    before its frame first, so whichever replica writes first, the non-finite value at step
    3 fires, once, as on one server."""
    rows = [{"mismatch/kl": "nan" if i == 3 else 1e-3} for i in range(20)]
    reference = server_factory(postgres_url)
    ref_run = new_run("reference")
    _stream(reference, ref_run, rows)
    expected = _settled(lambda: _all_alerts(reference, ref_run["id"]))
    assert [a[:4] for a in expected] == [("non-finite value", "firing", 3, 3)]

    a, b = server_factory(postgres_url), server_factory(postgres_url)
    committed = a.app.state.components.committed  # type: ignore[attr-defined]
    (evaluate,) = committed.listeners

    async def slow(run_id: str, frame_rows: list) -> None:  # type: ignore[type-arg]
        await asyncio.sleep(1.0)  # B evaluates (and writes) its frame meanwhile
        await evaluate(run_id, frame_rows)

    committed.listeners = [slow]
    run = new_run("shared-start")
    _stream(a, run, rows[:10])
    _stream(b, run, rows[10:], first_step=10, seq0=1)
    time.sleep(1.5)
    assert _settled(lambda: _all_alerts(a, run["id"])) == expected


def test_one_replica_reports_a_silent_run(postgres_url, server_factory) -> None:
    replicas = [server_factory(postgres_url, silent_run_check_s=0.2) for _ in range(2)]
    run = new_run("quiet", project="replicas")
    _stream(replicas[0], run, [{"reward/mean": 0.5}])
    # The project's default rules come with its first run: wait for them, not a moment.
    silent = _settled(lambda: [r for r in httpx.get(f"{replicas[0].url}/api/v1/rules", params={"project": "replicas"}).json() if r["detector"] == "silent"])
    (rule,) = silent
    # Edited on one replica; the other picks the edit up within seconds.
    assert httpx.patch(f"{replicas[0].url}/api/v1/rules/{rule['id']}", json={"params": {"after_s": 1.0}}).status_code == 200
    firing = _settled(lambda: _all_alerts(replicas[1], run["id"]))
    assert [a[:2] for a in firing] == [("run went silent", "firing")]
    time.sleep(3)  # both replicas keep checking: still one alert
    assert _all_alerts(replicas[0], run["id"]) == firing
    _stream(replicas[1], run, [{"reward/mean": 0.5}] * 2, first_step=1, seq0=1)
    first = _settled(lambda: [a for a in _all_alerts(replicas[0], run["id"]) if a[2] == 0 and a[1] == "resolved"])
    # Resolved once: at step 0 if a check ran between the hello (the run is seen again) and
    # the points, else at the step the points reached.
    assert len(first) == 1 and first[0][:4] == ("run went silent", "resolved", 0, 0) and first[0][4] in (0, 1, 2)
    # (Silent again a second later, so a second episode may start: never two at once.)
    for replica in replicas:
        alerts = _all_alerts(replica, run["id"])
        assert [a for a in alerts if a[2] == 0] == first and sum(a[1] != "resolved" for a in alerts) <= 1


def test_a_stored_state_of_another_rule_definition_is_not_fed_to_the_new_one() -> None:
    """A rule edited meanwhile (and a replica that had not seen the edit yet wrote its old
    state back) starts its detector fresh, keeping the alert it was tracking; a state of
    the same definition is kept."""
    from types import SimpleNamespace

    from server.alerts.detectors import JOINED
    from server.alerts.lifecycle import Lifecycle
    from server.alerts.state import Tracked, definition

    rule = SimpleNamespace(detector="climb", metric="mismatch/kl", params={"h": 12})
    edited = SimpleNamespace(detector="climb", metric="mismatch/kl", params={"h": 20})
    assert definition(rule) != definition(edited)  # type: ignore[arg-type]
    old = Tracked({"cusum": 3.0}, Lifecycle(), 41, alert_id=7, definition=definition(rule))  # type: ignore[arg-type]
    row = (old.to_json(), old.last_step)
    same = Tracked.load(row, {"fresh": True}, definition(rule))  # type: ignore[arg-type]
    assert (same.detector_state, same.last_step, same.alert_id) == ({"cusum": 3.0}, 41, 7)
    other = Tracked.load(row, {"fresh": True}, definition(edited))  # type: ignore[arg-type]
    # Started again on a run it has seen part of: told so (JOINED), for a detector that needs the run's first values.
    assert (other.detector_state, other.last_step, other.alert_id) == ({"fresh": True, JOINED: True}, 41, 7)
    assert other.to_json()["definition"] == definition(edited)  # type: ignore[arg-type]


def test_a_rule_deleted_on_another_replica_stops_failing_evaluation_at_the_next_frame(
    postgres_url, server_factory
) -> None:
    """Replica B still holds a rule replica A just deleted: B's next evaluation fails on the
    missing rule, B re-reads the rules at once, and its next frame evaluates what failed."""
    a, b = server_factory(postgres_url), server_factory(postgres_url)
    run = new_run("deleted-rule", project="deleted")
    created = httpx.post(
        f"{a.url}/api/v1/rules",
        json={"name": "kl high", "metric": "mismatch/kl", "detector": "threshold", "params": {"threshold": 1.0}, "project": "deleted"},
    )
    assert created.status_code == 201
    flat = [{"mismatch/kl": 1e-3} for _ in range(10)]
    _stream(b, run, flat)  # B now holds every rule of the project, "kl high" included
    deadline = time.monotonic() + 15
    while run["id"] not in {r for (_, r) in b.app.state.components.alerts._tracked}:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline  # evaluation follows the ack
        time.sleep(0.02)
    assert httpx.delete(f"{a.url}/api/v1/rules/{created.json()['id']}").status_code == 204
    with_nan = [{"mismatch/kl": "nan" if i == 2 else 1e-3} for i in range(10)]
    _stream(b, run, with_nan, first_step=10, seq0=1)  # fails on the deleted rule
    _stream(b, run, flat, first_step=20, seq0=2)  # re-read rules; steps 10..19 replayed
    fired = _settled(lambda: [a for a in _all_alerts(b, run["id"]) if a[0] == "non-finite value"], timeout=15)
    assert [a[2] for a in fired] == [12]


def _stored_last_steps(database_url: str, run_id: str) -> list[int | None]:
    async def read() -> list[int | None]:
        engine = create_engine(database_url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(select(RuleState.last_step).where(RuleState.run_id == run_id))
                return sorted(step for (step,) in rows)
        finally:
            await engine.dispose()

    return asyncio.run(read())


def test_detector_states_are_checkpointed_not_written_with_every_frame(server_factory, database_url) -> None:
    """Without alert changes a run's states are written at most once per checkpoint interval
    (on PostgreSQL too: rewriting them with every frame cost a quarter of the evaluation),
    and a graceful stop writes what is left."""
    server = server_factory(database_url)
    engine = server.app.state.components.alerts  # type: ignore[attr-defined]
    engine.coordination.checkpoints.checkpoint_s = 3600.0
    run = new_run("checkpointed")
    _stream(server, run, [{"mismatch/kl": 1e-3, "reward/mean": 0.5}] * 100)
    deadline = time.monotonic() + 15
    while not any(run_id == run["id"] and t.last_step == 99 for (_, run_id), t in engine._tracked.items()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    stored = _stored_last_steps(database_url, run["id"])
    assert stored and set(stored) == {9}  # the first frame's evaluation, none since
    server.stop()
    assert set(_stored_last_steps(database_url, run["id"])) == {99}


def test_a_state_another_replica_wrote_replaces_one_evaluated_further_but_not_written(server_factory, postgres_url) -> None:
    """A replica's cached state may be ahead of the stored one (checkpointed, not written).
    When another replica writes the state meanwhile, even at an earlier step, the stored
    copy is the evaluation that counts: this replica's next write finds it, writes nothing
    over it, reloads it and replays from there."""
    server = server_factory(postgres_url)
    engine = server.app.state.components.alerts  # type: ignore[attr-defined]
    engine.coordination.checkpoints.checkpoint_s = 3600.0
    run = new_run("overtaken")
    rows = [{"mismatch/kl": 1e-3, "reward/mean": 0.5}] * 30

    def tracked() -> dict[int, object]:
        return {rule_id: t for (rule_id, run_id), t in engine._tracked.items() if run_id == run["id"] and t.last_step is not None}

    def settled(step: int) -> dict[int, object]:
        deadline = time.monotonic() + 15
        while not (states := tracked()) or any(t.last_step != step for t in states.values()):  # type: ignore[attr-defined]
            assert time.monotonic() < deadline
            time.sleep(0.02)
        return states

    with open_ingest(server) as ws:
        hello(ws, run)
        for seq, start in enumerate((0, 10)):
            ws.send(points(seq, [{"step": start + j, "values": v} for j, v in enumerate(rows[start : start + 10])]))
            assert recv(ws)["type"] == "ack"
        before = settled(19)
        assert set(_stored_last_steps(postgres_url, run["id"])) == {9}  # written once, at the first frame

        async def overtake() -> None:  # what another replica's write at step 14 leaves
            db = create_engine(postgres_url)
            try:
                async with db.begin() as conn:
                    await conn.execute(update(RuleState).where(RuleState.run_id == run["id"]).values(last_step=14))
            finally:
                await db.dispose()

        asyncio.run(overtake())
        engine.coordination.checkpoints.checkpoint_s = 0.0  # the next frame's states are written
        ws.send(points(2, [{"step": 20 + j, "values": v} for j, v in enumerate(rows[20:30])]))
        assert recv(ws)["type"] == "ack"
        deadline = time.monotonic() + 15
        while set(_stored_last_steps(postgres_url, run["id"])) != {29}:  # replayed from 14, then written
            assert time.monotonic() < deadline
            time.sleep(0.05)
        after = settled(29)
    assert all(after[rule_id] is not state for rule_id, state in before.items())  # reloaded, not kept


def test_a_long_history_nobody_evaluated_is_replayed_only_for_its_last_steps(
    server_factory, database_url, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """A run whose points were stored while nothing evaluated it (here written straight to the
    database) replays at most `FIRST_REPLAY_STEPS` steps before its next frame: the
    non-finite value inside that span fires, the one before it is history."""
    monkeypatch.setattr(engine_module, "FIRST_REPLAY_STEPS", 20)
    server = server_factory(database_url)
    run = new_run("history")

    async def store_history() -> None:
        store = Store(create_engine(database_url))
        try:
            await store.open_run(RunInfo(id=run["id"], name=run["name"], project=run["project"]), time.time())
            rows = [Row(step=s, time=None, values={"mismatch/kl": math.nan if s in (50, 90) else 1e-3}) for s in range(100)]
            await store.write_points(run["id"], rows, time.time())
        finally:
            await store.close()

    asyncio.run(store_history())
    with open_ingest(server) as ws:
        hello(ws, run)
        ws.send(points(0, [{"step": 100, "values": {"mismatch/kl": 1e-3}}]))
        assert recv(ws)["type"] == "ack"
    fired = _settled(lambda: [a for a in _all_alerts(server, run["id"]) if a[0] == "non-finite value"])
    assert [a[3] for a in fired] == [90]


def _evaluated_to(server, run_id: str, step: int) -> None:  # type: ignore[no-untyped-def]
    """Wait until `server`'s engine has evaluated `run_id` up to `step` for every rule that
    reads its steps ("run went silent" reads the clock: its periodic check tracks the run
    too, with no step of its own unless it fires)."""
    tracked = server.app.state.components.alerts._tracked
    silent = {r["id"] for r in httpx.get(f"{server.url}/api/v1/rules").json() if r["detector"] == "silent"}
    deadline = time.monotonic() + 60  # a loaded box: this is not a latency test (bench/alert_latency.py is)
    # a rule tracked but not yet evaluated has no last step (None): wait for it as well
    while not (steps := [t.last_step for (rule, r), t in list(tracked.items()) if r == run_id and rule not in silent]) or any(
        s is None or s < step for s in steps
    ):
        assert time.monotonic() < deadline, steps  # evaluation follows the ack
        time.sleep(0.02)


def test_a_run_deleted_and_created_again_is_evaluated_from_its_first_step(server_factory, database_url) -> None:
    """The engine held the old incarnation's detector states (evaluated to step 39) and its
    run (another project): the new incarnation, in a project of its own with a rule of its
    own, is evaluated from step 0 under its own project's rules."""
    server = server_factory(database_url)
    run = new_run("again", project="first")
    _stream(server, run, [{"mismatch/kl": 1e-3} for _ in range(40)])
    _evaluated_to(server, run["id"], 39)
    assert httpx.delete(f"{server.url}/api/v1/runs/{run['id']}", params={"force": "true"}).status_code == 204

    created = httpx.post(
        f"{server.url}/api/v1/rules",
        json={"name": "kl high", "metric": "mismatch/kl", "detector": "threshold", "params": {"threshold": 1.0}, "project": "second"},
    )
    assert created.status_code == 201
    again = dict(run, project="second")
    rows = [{"mismatch/kl": "nan" if i == 5 else (5.0 if i == 7 else 1e-3)} for i in range(40)]
    _stream(server, again, rows)
    fired = _settled(lambda: [(a[0], a[2]) for a in _all_alerts(server, run["id"])])
    assert fired == [("kl high", 7), ("non-finite value", 5)]


@pytest.mark.postgres
def test_a_replica_holding_a_deleted_runs_states_evaluates_its_new_incarnation_from_step_0(
    postgres_url, server_factory
) -> None:
    """Replica B evaluated the run to step 39; A deleted it and B streams the new
    incarnation: B's cached states and run belong to the old one and are not used."""
    a, b = server_factory(postgres_url), server_factory(postgres_url)
    run = new_run("again-replicas")
    _stream(b, run, [{"mismatch/kl": 1e-3} for _ in range(40)])
    _evaluated_to(b, run["id"], 39)
    assert httpx.delete(f"{a.url}/api/v1/runs/{run['id']}", params={"force": "true"}).status_code == 204
    _stream(b, run, [{"mismatch/kl": "nan" if i == 5 else 1e-3} for i in range(40)])
    fired = _settled(lambda: [(a[0], a[2]) for a in _all_alerts(b, run["id"])])
    assert fired == [("non-finite value", 5)]


@pytest.mark.postgres
def test_a_shutdown_saves_the_states_of_a_runs_rules_after_one_was_deleted_on_another_replica(
    postgres_url, server_factory
) -> None:
    """B holds unsaved states (checkpoints off) for every rule of the run, one of them a rule
    A deleted since. B's shutdown writes the others' states, and none for the deleted rule."""
    a, b = server_factory(postgres_url), server_factory(postgres_url)
    b.app.state.components.alerts.coordination.checkpoints.checkpoint_s = 3600.0  # type: ignore[attr-defined]
    run = new_run("flushed", project="flushed")
    created = httpx.post(
        f"{a.url}/api/v1/rules",
        json={"name": "kl high", "metric": "mismatch/kl", "detector": "threshold", "params": {"threshold": 1.0}, "project": "flushed"},
    )
    assert created.status_code == 201
    _stream(b, run, [{"mismatch/kl": 1e-3, "reward/mean": 0.5}] * 50)
    _evaluated_to(b, run["id"], 49)
    before = _stored_states(postgres_url, run["id"])
    assert created.json()["id"] in before and set(before.values()) == {9}  # the first frame's checkpoint
    assert httpx.delete(f"{a.url}/api/v1/rules/{created.json()['id']}").status_code == 204
    b.stop()
    after = _stored_states(postgres_url, run["id"])
    assert set(after) == set(before) - {created.json()["id"]} and set(after.values()) == {49}


def _stored_states(database_url: str, run_id: str) -> dict[int, int | None]:
    async def read() -> dict[int, int | None]:
        engine = create_engine(database_url)
        try:
            async with engine.connect() as conn:
                rows = await conn.execute(select(RuleState.rule_id, RuleState.last_step).where(RuleState.run_id == run_id))
                return {rule_id: step for rule_id, step in rows}
        finally:
            await engine.dispose()

    return asyncio.run(read())


def test_a_run_idle_for_a_while_is_forgotten_and_resumes_where_it_was(server_factory, database_url) -> None:
    """The engine keeps only the runs that stream: a run idle for `idle_s` is saved and
    dropped from memory, and its next frames are evaluated as if it had never been."""
    rows = _kl_series()
    reference = server_factory(database_url)
    ref_run = new_run("reference")
    _stream(reference, ref_run, rows)
    expected = _climb_alerts(reference, ref_run["id"])
    assert expected and expected[0][0] > 90

    server = server_factory(database_url, silent_run_check_s=0.2)
    engine = server.app.state.components.alerts  # type: ignore[attr-defined]
    engine.coordination.checkpoints.checkpoint_s = 3600.0  # only the idle run's save writes step 89
    run = new_run("idle")
    _stream(server, run, rows[:90])
    _evaluated_to(server, run["id"], 89)
    engine.idle_s = 1.0  # only now: a run forgotten before the wait above would look never evaluated
    deadline = time.monotonic() + 15
    while run["id"] in engine._runs or run["id"] in engine._active:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    stored = _stored_states(database_url, run["id"])
    assert set(stored.values()) == {89}
    # What is left in memory of the run is at most the "run went silent" check's state.
    silent = {r["id"] for r in httpx.get(f"{server.url}/api/v1/rules").json() if r["detector"] == "silent"}
    assert {rule for (rule, r) in list(engine._tracked) if r == run["id"]} <= silent
    _stream(server, run, rows[90:], first_step=90, seq0=9)
    assert _climb_alerts(server, run["id"]) == expected

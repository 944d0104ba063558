"""Retention: deleting runs (REST and `keel prune`) in short batches, on both databases."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from server import retention
from tests.support.raw_client import hello, new_run, open_ingest, points, recv, series


def _stream(server, run: dict, steps: int, *, finish: bool = True) -> None:  # type: ignore[no-untyped-def]
    with open_ingest(server) as ws:
        hello(ws, run)
        for seq, start in enumerate(range(0, steps, 500)):
            ws.send(points(seq, [{"step": s, "values": {"a": s, "b": -s}} for s in range(start, min(steps, start + 500))]))
            assert recv(ws)["type"] == "ack"
        if finish:
            ws.send(json.dumps({"type": "finish", "status": "finished"}))
            assert recv(ws) == {"type": "bye"}


def test_deleting_a_run_takes_everything_stored_with_it_and_nothing_else(
    server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retention, "DELETE_BATCH", 700)  # several batches per series
    doomed, kept = new_run("doomed"), new_run("kept")
    _stream(server, doomed, 2_000)
    _stream(server, kept, 1_000)
    url = f"{server.url}/api/v1/runs"
    assert httpx.delete(f"{url}/{doomed['id']}").status_code == 204
    assert httpx.get(f"{url}/{doomed['id']}").status_code == 404
    assert httpx.get(f"{url}/{doomed['id']}/keys").status_code == 404
    assert httpx.delete(f"{url}/{doomed['id']}").status_code == 404
    assert [r["id"] for r in httpx.get(url).json()] == [kept["id"]]
    assert series(server, kept["id"], "b")["values"] == [-float(s) for s in range(1_000)]
    # The id can be used again from scratch: nothing of the old run is left behind.
    _stream(server, doomed, 10)
    assert series(server, doomed["id"], "a")["steps"] == list(range(10))


def test_a_running_run_is_deleted_only_when_forced(server) -> None:
    run = new_run()
    _stream(server, run, 100, finish=False)
    url = f"{server.url}/api/v1/runs/{run['id']}"
    refused = httpx.delete(url)
    assert refused.status_code == 409 and "running" in refused.json()["detail"]
    assert httpx.get(url).status_code == 200
    assert httpx.delete(url, params={"force": "true"}).status_code == 204
    assert httpx.get(url).status_code == 404


def test_keel_prune_deletes_ended_runs_and_keeps_running_ones(server) -> None:
    ended, running = new_run("ended"), new_run("running")
    _stream(server, ended, 50)
    _stream(server, running, 50, finish=False)

    def prune(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "keel", "prune", "--older-than", "0", "--database-url", server.database_url, *extra],
            capture_output=True, text=True, timeout=120,
        )

    dry = prune("--dry-run")
    assert dry.returncode == 0 and "would delete run 'ended'" in dry.stdout and "'running'" not in dry.stdout
    assert httpx.get(f"{server.url}/api/v1/runs/{ended['id']}").status_code == 200
    done = prune()
    assert done.returncode == 0 and "1 run(s) deleted" in done.stdout, done.stdout + done.stderr
    assert [r["name"] for r in httpx.get(f"{server.url}/api/v1/runs").json()] == ["running"]


def test_keel_prune_shows_what_a_trainer_chose_on_its_own_line(server) -> None:
    """A run's id, name and project are the trainer's: shown escaped on prune's line, never
    as a line of their own nor as terminal controls (issue 48)."""
    forged = "keel prune: 0 run(s) found"
    _stream(server, new_run(f"n\n{forged}", id=f"id\n{forged}\x1b[2K", project=f"p\r\n{forged}"), 5)
    dry = subprocess.run(
        [sys.executable, "-m", "keel", "prune", "--older-than", "0", "--database-url", server.database_url, "--dry-run"],
        capture_output=True, text=True, timeout=120,
    )
    lines = dry.stdout.splitlines()
    assert dry.returncode == 0 and len(lines) == 2 and lines[-1] == "keel prune: 1 run(s) found", lines
    assert not any(line.startswith(forged) for line in lines) and "\x1b" not in dry.stdout, lines


@pytest.mark.postgres
def test_a_replica_writes_to_a_run_deleted_and_created_again_on_another(server_factory, postgres_url) -> None:
    """Replica B cached the run's series ids; A deleted the run and it came back: B's ids
    belong to the old incarnation, so B writes the frame into the new series, not the gone ones."""
    a, b = server_factory(postgres_url), server_factory(postgres_url)
    run = new_run()
    _stream(b, run, 10)
    assert httpx.delete(f"{a.url}/api/v1/runs/{run['id']}").status_code == 204
    _stream(a, run, 5)
    with open_ingest(b) as ws:
        hello(ws, run)
        ws.send(points(1, [{"step": 100, "values": {"a": 1.0, "b": 2.0}}]))
        assert recv(ws) == {"type": "ack", "seq": 1}
    assert series(a, run["id"], "b")["steps"] == [0, 1, 2, 3, 4, 100]

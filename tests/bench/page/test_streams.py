"""bench/page/streams.py: the page benchmarks' runs go through the Monitor's spool and
Sender, history first and then live steps from another writer, and the server holds
exactly bench/page_data.py's values."""

from __future__ import annotations

import time
from pathlib import Path

from bench.page.streams import Streamer, ingest, make_runs
from bench.page_data import metric_keys, step_values
from bench.support import keel_server
from keel.client import Client


def test_history_then_live_steps_are_stored_as_sent(sqlite_url: str, tmp_path: Path) -> None:
    runs = make_runs(2)
    keys = metric_keys(6)
    with keel_server(sqlite_url, log=tmp_path / "server.log") as server:
        ingest(server.url, runs, 25, keys, tmp_path, batch=10)  # 3 frames a run
        with Streamer(server.url, runs, keys, rate=20.0, first_step=25, spools=tmp_path) as streamer:
            deadline = time.monotonic() + 30
            while streamer.sent < 2 * len(runs) * 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            streamer.check()
        client = Client(server.url)
        for run in runs:
            steps, values = client.points(run.id, "reward/mean")
            # the history, then the live steps (the last, sent as the streamer stopped, may be lost)
            assert steps[:28] == list(range(28)) and steps == list(range(len(steps))) and len(steps) <= streamer.step + 1  # step: the one being sent
            assert values == [step_values(run.index, s, ["reward/mean"])["reward/mean"] for s in steps]
        assert {r["name"] for r in client.runs()} == {run.name for run in runs}
    assert streamer.dropped == []
    assert not list(tmp_path.glob("history-*")) and not list(tmp_path.glob("live-*"))  # spools removed

"""Step details end to end: `Monitor.log_batch(token_ids=, decode=)` against a real `keel serve`
(histograms, samples and sequences read back over REST equal what the batches hold), and
against a server older than step details (the points go on; the details are kept aside)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from websockets.sync.server import ServerConnection, serve

from tests.support.monitor import FAST, servers
from trainer_hooks.details import EDGES, WINDOW
from trainer_hooks.monitor import Monitor

ROOT = Path(__file__).resolve().parents[2]

make_server = pytest.fixture(name="make_server")(servers)


def texts(token_ids: list[int]) -> list[str]:
    """A tokenizer's convert_ids_to_tokens, in shape (pickled into the Monitor's worker)."""
    return [f"▁w{token}" for token in token_ids]


def micro_batch(seed: int, seqs: int, length: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    learner = -torch.rand(seqs, length, generator=generator) * 3
    sampler = learner - 0.3 * torch.randn(seqs, length, generator=generator)
    mask = torch.rand(seqs, length, generator=generator) > 0.1
    mask[:, :3] = True
    return {
        "sampler": sampler.masked_fill(~mask, math.nan),
        "learner": learner.masked_fill(~mask, math.nan),
        "mask": mask,
        "token_ids": torch.randint(0, 30_000, (seqs, length), generator=generator),
        "advantages": torch.randn(seqs, generator=generator),
        "rewards": torch.rand(seqs, generator=generator),
    }


def log(monitor: Monitor, step: int, batch: dict[str, torch.Tensor]) -> None:
    monitor.log_batch(
        step,
        batch["sampler"],
        batch["learner"],
        batch["mask"],
        rewards=batch["rewards"],
        advantages=batch["advantages"],
        token_ids=batch["token_ids"],
        decode=texts,
    )


def test_log_batch_sends_the_step_details(make_server, sqlite_url, tmp_path) -> None:
    server = make_server(sqlite_url)
    first, second = micro_batch(1, 5, 40), micro_batch(2, 7, 40)
    second["sampler"][4, 20] = second["learner"][4, 20] - 9.0  # the step's worst token
    second["mask"][4] = True
    second["learner"][4] = second["learner"][4].nan_to_num(-1.0)
    second["sampler"][4] = second["sampler"][4].nan_to_num(-1.0)
    monitor = Monitor(server.url, run_name="details", spool_dir=tmp_path, sender_config=FAST)
    log(monitor, 0, first)  # two micro-batches of step 0
    log(monitor, 0, second)
    log(monitor, 1, micro_batch(3, 4, 30))
    assert monitor.finish(timeout=60)
    assert monitor.dropped == {}
    run = monitor.run_id

    mask = torch.cat([first["mask"], second["mask"]])
    ell = torch.cat([first["learner"] - first["sampler"], second["learner"] - second["sampler"]])
    want, _ = np.histogram(np.clip(ell[mask].numpy(), EDGES[0], EDGES[-1]), bins=EDGES)
    histograms = server.get(f"/runs/{run}/distributions", key="mismatch/log_ratio")
    assert histograms["steps"] == [0, 1]
    assert histograms["edges"] == list(EDGES)
    assert histograms["counts"][0] == want.tolist()

    samples = server.get(f"/runs/{run}/samples", step=0)
    assert samples["step"] == 0 and len(samples["samples"]) == 4
    worst = samples["samples"][0]
    assert worst["seq_id"] == 5 + 4  # row 4 of the second micro-batch
    assert worst["worst"] == 20 and worst["start"] == 20 - WINDOW
    ids = second["token_ids"][4, 20 - WINDOW : 20 + WINDOW + 1].tolist()
    at = worst["worst"] - worst["start"]
    assert worst["token_ids"][at] == ids[WINDOW]
    assert worst["tokens"][at] == f"▁w{ids[WINDOW]}"
    assert worst["max_log_ratio"] == pytest.approx(9.0, abs=1e-5)
    assert worst["advantage"] == pytest.approx(second["advantages"][4].item())
    assert len(json.dumps(samples["samples"])) <= 16 * 1024

    pairs = server.get(f"/runs/{run}/sequences", start=0, end=0)
    assert sorted(pairs["length"]) == sorted(mask.sum(-1).tolist())
    tail = server.series(run, "mismatch/tail_frac")[1]
    assert tail[0] == pytest.approx(float((ell[mask].abs() >= 1).double().mean()))


class OldServer:
    """A Keel server from before step details, as far as the protocol goes: its welcome has no
    `accepts`; it acknowledges every frame and keeps what it was sent."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self._server = serve(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.socket.getsockname()[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _serve(self, connection: ServerConnection) -> None:
        hello = json.loads(connection.recv())
        connection.send(json.dumps({"type": "welcome", "run_id": hello["run"]["id"], "acked_seq": -1}))
        for raw in connection:
            message = json.loads(raw)
            if message["type"] == "points":
                self.frames.append(message)
                connection.send(json.dumps({"type": "ack", "seq": message["seq"]}))
            elif message["type"] == "finish":
                connection.send(json.dumps({"type": "bye"}))

    def close(self) -> None:
        self._server.shutdown()


@pytest.fixture
def old_server() -> Iterator[OldServer]:
    server = OldServer()
    yield server
    server.close()


def test_an_older_server_gets_the_points_without_the_details(
    old_server: OldServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = Monitor(old_server.url, run_name="old", spool_dir=tmp_path, sender_config=FAST)
    for step in range(3):
        log(monitor, step, micro_batch(step, 4, 20))
    assert monitor.finish(timeout=60)
    rows = [row for frame in old_server.frames for row in frame["rows"]]
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert all(set(row) <= {"step", "time", "values"} for row in rows)
    assert all("mismatch/kl" in row["values"] for row in rows)
    kept = tmp_path / "rejected" / f"{monitor.run_id}.jsonl"
    left_out = [row for line in kept.read_text().splitlines() for row in json.loads(line)["left_out"]]
    assert [row["step"] for row in left_out] == [0, 1, 2]
    assert all({"histograms", "samples", "sequences"} <= set(row) for row in left_out)
    assert sum("does not store step details" in r.message for r in caplog.records) == 1


SCRIPT = '''
import json, sys
import torch
from trainer_hooks.monitor import Monitor


def texts(token_ids):
    return [f"<{token}>" for token in token_ids]


if __name__ == "__main__":
    url, spool = sys.argv[1], sys.argv[2]
    monitor = Monitor(url, run_name="script", spool_dir=spool)
    learner = -torch.rand(3, 20, generator=torch.Generator().manual_seed(0))
    sampler = learner.clone()
    sampler[1, 7] -= 5.0
    ids = torch.arange(60).reshape(3, 20)
    monitor.log_batch(0, sampler, learner, torch.ones(3, 20, dtype=torch.bool), token_ids=ids, decode=texts)
    assert monitor.finish(timeout=60)
    print(json.dumps({"run": monitor.run_id, "dropped": monitor.dropped}))
'''


@pytest.mark.parametrize("how", ["module", "script"])
def test_a_decode_defined_in_the_script_being_run(make_server, sqlite_url, tmp_path, how) -> None:
    """`python -m pkg.train` and `python train.py`: the function of `__main__` travels by
    value (trainer_hooks/decoder.py) and the samples carry text (test_monitor_decode.py: a
    lambda, a closure, a sibling module, one that cannot be pickled)."""
    server = make_server(sqlite_url)
    package = tmp_path / "trainloop"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "run.py").write_text(SCRIPT)
    target = ["-m", "trainloop.run"] if how == "module" else [str(package / "run.py")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, *target, server.url, str(tmp_path / "spool")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    worst = server.get(f"/runs/{result['run']}/samples", step=0)["samples"][0]
    assert worst["seq_id"] == 1 and worst["worst"] == 7
    ids = list(range(20 + worst["start"], 20 + worst["start"] + len(worst["token_ids"])))
    assert worst["token_ids"] == ids
    assert result["dropped"] == {}
    assert worst["tokens"] == [f"<{token}>" for token in ids]

"""`log_batch(decode=...)` as users write it, from a plain `python train.py` against a real
`keel serve`: a lambda, a closure and a function of the script travel by value, a function of a
sibling file of the script is imported in the worker (through the trainer's sys.path), and a
decode that cannot be pickled is reported once while the samples keep their token ids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.monitor import servers

ROOT = Path(__file__).resolve().parents[2]

make_server = pytest.fixture(name="make_server")(servers)

SIBLING = '''
def words(token_ids):
    return [f"w{token}" for token in token_ids]
'''

SCRIPT = '''
import json, sys, threading

import torch

import vocab  # a sibling file of this script, found through sys.path[0] (the script's directory)
from trainer_hooks.monitor import Monitor

MARK = "~"
LOCK = threading.Lock()


def spelled(token_ids):  # a function of the script: module __main__
    return [f"{MARK}{token}" for token in token_ids]


def prefixed(prefix):
    def decode(token_ids):  # a closure
        return [prefix + str(token) for token in token_ids]
    return decode


url, spool = sys.argv[1], sys.argv[2]
names = ("lambda", "closure", "script", "sibling", "lock")
monitors = {name: Monitor(url, run_name=name, spool_dir=spool) for name in names}
mask = torch.ones(3, 20, dtype=torch.bool)
ids = torch.arange(60).reshape(3, 20)
for step in range(3):
    learner = -torch.rand(3, 20, generator=torch.Generator().manual_seed(step))
    sampler = learner.clone()
    sampler[1, 7] -= 5.0
    batch = (sampler, learner, mask)
    # Written in the call, as in a training loop: a new lambda / closure object every step.
    monitors["lambda"].log_batch(step, *batch, token_ids=ids, decode=lambda token_ids: [f"L{t}" for t in token_ids])
    monitors["closure"].log_batch(step, *batch, token_ids=ids, decode=prefixed("C"))
    monitors["script"].log_batch(step, *batch, token_ids=ids, decode=spelled)
    monitors["sibling"].log_batch(step, *batch, token_ids=ids, decode=vocab.words)
    monitors["lock"].log_batch(step, *batch, token_ids=ids, decode=lambda token_ids: [f"{LOCK}{t}" for t in token_ids])
result = {}
for name, monitor in monitors.items():
    assert monitor.finish(timeout=120), name
    result[name] = {"run": monitor.run_id, "dropped": monitor.dropped}
print(json.dumps(result))
'''

TEXT = {
    "lambda": lambda token: f"L{token}",
    "closure": lambda token: f"C{token}",
    "script": lambda token: f"~{token}",
    "sibling": lambda token: f"w{token}",
}


def test_decode_as_a_plain_script_writes_it(make_server, sqlite_url, tmp_path: Path) -> None:
    server = make_server(sqlite_url)
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    (folder / "vocab.py").write_text(SIBLING)
    # Keel importable as installed; the script's folder is on no path but the script's own,
    # and the trainer runs from elsewhere (the worker's working directory finds nothing).
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(folder / "train.py"), server.url, str(tmp_path / "spool")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])

    for name, run in result.items():
        for step in range(3):
            worst = server.get(f"/runs/{run['run']}/samples", step=step)["samples"][0]
            assert (worst["seq_id"], worst["worst"]) == (1, 7), name
            ids = list(range(20 + worst["start"], 20 + worst["start"] + len(worst["token_ids"])))
            assert worst["token_ids"] == ids, name
            if name in TEXT:
                assert worst.get("tokens") == [TEXT[name](token) for token in ids], (name, step)
            else:
                assert "tokens" not in worst, name  # ids only
    assert {name: run["dropped"] for name, run in result.items()} == {
        "lambda": {}, "closure": {}, "script": {}, "sibling": {}, "lock": {"error": 1},
    }  # fmt: skip
    # The decode that cannot travel: said once, with why, though given at every step (and
    # named again in finish()'s summary of what was not stored).
    said = [line for line in done.stderr.splitlines() if line.startswith("keel: log_batch's decode")]
    assert len(said) == 1, done.stderr
    assert "<lambda>" in said[0] and "cannot pickle '_thread.lock' object" in said[0]

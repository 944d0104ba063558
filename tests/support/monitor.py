"""For tests that run a Monitor (its own, the learners', the server's back-pressure): a real
`keel serve` in a subprocess (tests/support/server.py: a test can SIGKILL it and start it again
on the same port), trainer subprocesses and exact-value assertions.

Each test module turns `servers` into its fixture: `make_server = pytest.fixture(name=...)(servers)`
(no conftest.py, so nothing here leaks into other packages' tests).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.server import REPO_ROOT, ServerProcess, keel_serve
from trainer_hooks.sender import SenderConfig

# Short batching window and backoff so outages heal within a test's patience.
FAST = SenderConfig(flush_interval=0.05, backoff_initial=0.05, backoff_max=0.5)


@contextmanager
def python_process(
    code: str, *, env: dict[str, str] | None = None, **kwargs: Any
) -> Iterator[subprocess.Popen[str]]:
    """`python -c code` in the repo root (a trainer a test can kill); killed on exit if still alive."""
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def keel(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run the `keel` command (`python -m keel ...`)."""
    return subprocess.run(
        [sys.executable, "-m", "keel", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spooled_steps(spool_path: Path) -> list[int]:
    """Steps of every row in a run spool's frames log (complete lines only)."""
    import json

    frames = spool_path / "frames.jsonl"
    if not frames.exists():
        return []
    steps: list[int] = []
    for line in frames.read_bytes().splitlines(keepends=True):
        if line.endswith(b"\n"):
            steps.extend(row["step"] for row in json.loads(line)["rows"])
    return steps


MakeServer = Callable[..., ServerProcess]


def servers(tmp_path: Path) -> Iterator[MakeServer]:
    """Fixture body: make(database_url, start=True) -> ServerProcess; all stopped at teardown."""
    servers: list[ServerProcess] = []

    def make(database_url: str, *, start: bool = True, token: str | None = None) -> ServerProcess:
        log_path = tmp_path / f"server{len(servers)}.log"
        server = keel_serve(database_url, log_path, "--log-level", "warning", token=token)
        servers.append(server)
        if start:
            server.start()
        return server

    yield make
    for server in servers:
        server.stop()


def headline(step: int) -> dict[str, float]:
    """The five headline metrics with values that tell steps apart."""
    return {
        "reward/mean": step / 1000,
        "mismatch/kl": 1e-4 * step,
        "gate/frac": (step % 7) / 7,
        "mismatch/ratio_max": 1.0 + step / 3,
        "grad/norm": 2.5 * step,
    }


def assert_every_step_once(server: ServerProcess, run_id: str, steps: int) -> None:
    """Each headline metric holds steps 0..steps-1 exactly once, with its exact value."""
    expected_keys = sorted(headline(0))
    assert server.keys(run_id) == dict.fromkeys(expected_keys, steps)
    for key in expected_keys:
        stored_steps, values = server.series(run_id, key)
        assert stored_steps == list(range(steps)), key
        assert values == [headline(step)[key] for step in range(steps)], key


def wait_until(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """`condition()`'s first truthy value; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return value


def learner_batches(steps: int, seqs: int, length: int, seed: int) -> tuple[Any, Any, Any, Any]:
    """Off-policy batches per step: sampler and learner log-probs and a mask [steps, seqs,
    length], rewards [steps, seqs] (torch imported here: this module is also used without)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    sampler = -torch.rand(steps, seqs, length, generator=generator) * 3
    learner = sampler + 0.3 * torch.randn(steps, seqs, length, generator=generator)
    mask = torch.rand(steps, seqs, length, generator=generator) > 0.2
    rewards = torch.rand(steps, seqs, generator=generator)
    return sampler, learner, mask, rewards


def metric_per_step(batches: tuple[Any, Any, Any, Any], key: str, steps: Iterable[int]) -> list[float]:
    """`stability_metrics(...)[key]` of each of these steps of `learner_batches`, alone."""
    from trainer_hooks.metrics import stability_metrics

    sampler, learner, mask, rewards = batches
    return [
        stability_metrics(sampler[s], learner[s], mask[s], rewards=rewards[s])[key].item()
        for s in steps
    ]

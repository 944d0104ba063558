"""Test data for the dashboard: toy runs streamed over the real ingest websocket (raw_client.py)."""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from typing import Any

from websockets.sync.client import ClientConnection

from tests.support.raw_client import hello, new_run, open_ingest, points, recv

HEADLINE = ("reward/mean", "mismatch/kl", "gate/frac", "mismatch/ratio_max", "grad/norm")


def toy_values(step: int, seed: int) -> dict[str, Any]:
    """Deterministic curves shaped like an off-policy run drifting towards collapse."""
    wobble = math.sin(step * 0.7 + seed)
    kl = 1e-3 * math.exp(step / 80) * (1.2 + 0.2 * wobble)
    return {
        "reward/mean": 0.4 + 0.4 * math.tanh(step / 120) + 0.02 * wobble,
        "mismatch/kl": kl,
        "gate/frac": 0.05 + 0.01 * wobble,
        "mismatch/ratio_max": 1.0 + 40 * kl,
        "grad/norm": 1.0 + 0.3 * abs(wobble) + kl * 10,
        "policy/entropy": 1.2 - step / 1000,
    }


class LiveRun:
    """One run held open on the ingest websocket, so a test can push more points later."""

    def __init__(self, server: Any, name: str, group: str | None, seed: int = 0, **run: Any):
        config = {"seed": seed, "loss": group or "none", **run.pop("config", {})}
        self.run = new_run(name, group=group, config=config, tags=["toy"], **run)
        self.id: str = self.run["id"]
        self.seed = seed
        self.seq = 0
        self._stack = ExitStack()
        self.ws: ClientConnection = self._stack.enter_context(open_ingest(server))
        hello(self.ws, self.run)

    def send(self, rows: list[dict[str, Any]]) -> float:
        """Send one frame; returns the wall time just before sending. Waits for the ack."""
        sent_at = time.time()
        self.ws.send(points(self.seq, rows))
        self.seq += 1
        reply = recv(self.ws)
        assert reply["type"] == "ack", reply
        return sent_at

    def history(self, steps: int, *, start: int = 0, frame: int = 200) -> None:
        for first in range(start, start + steps, frame):
            rows = [
                {"step": s, "time": time.time(), "values": toy_values(s, self.seed)}
                for s in range(first, min(start + steps, first + frame))
            ]
            self.send(rows)

    def close(self) -> None:
        self._stack.close()


def open_runs(server: Any, specs: list[tuple[str, str | None]], steps: int) -> list[LiveRun]:
    runs = [LiveRun(server, name, group, seed=i) for i, (name, group) in enumerate(specs)]
    for run in runs:
        run.history(steps)
    return runs

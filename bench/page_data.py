"""The workload of bench/page/ (python -m bench.page), and its peers' side, run by each peer's own venv's python.

    PYTHONPATH=<repository root> <venv>/bin/python -m bench.page_data '<json config>'

Standard library only at import time (plus the peer, inside the modes that need it): the
TensorBoard and Trackio venvs import this module for the values, so every target draws the
same numbers. Modes of the config:

- "tb-history": `runs` runs x `steps` steps of `keys` into `<logdir>/run-NN/` as TensorBoard
  event files (tensorboard's own EventFileWriter: the file torch's SummaryWriter writes).
- "tb-live": append step `start`, `start`+1, ... to every run at `rate` steps/s per run,
  flushing each run's file after each step, until stdin closes.
- "trackio-history": the same runs logged with trackio.init/log/finish into TRACKIO_DIR.
- "trackio-live": every run resumed (trackio.init(resume="must")), then one log() per run
  per step at `rate` steps/s until stdin closes.
- "trackio-show": trackio.show(project, open_browser=False) on `port`, blocking.

Non-finite values are left out for the peers (Keel gets them: they are part of its page).
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

HEADLINE_KEYS = ("reward/mean", "mismatch/kl", "gate/frac", "mismatch/ratio_max", "grad/norm")
"""dashboard/theme.py's five headline panels (copied: the peers' venvs have no dashboard)."""
EXTRA_KEYS = (
    "reward/std",
    "policy/entropy",
    "mismatch/ess_frac",
    "mismatch/kl_k1",
    "perf/step_s",
    "perf/tokens_per_s",
    "staleness/lag_mean",
)


def metric_keys(count: int) -> list[str]:
    """`count` metric keys (at least the five headline ones): the headline keys, some
    known RL metrics, then `bench/metric_NN`."""
    keys = list(HEADLINE_KEYS) + list(EXTRA_KEYS)
    keys += [f"bench/metric_{i:02d}" for i in range(max(0, count - len(keys)))]
    return keys[: max(count, len(HEADLINE_KEYS))]


def _noise(run: int, step: int, salt: int) -> float:
    """Deterministic noise in [-0.5, 0.5): the same in every venv (no random module state)."""
    x = (step * 2654435761 + run * 40503 + salt * 97) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 2246822519) & 0xFFFFFFFF
    x ^= x >> 13
    return (x % 10007) / 10007 - 0.5


NONFINITE = {(0, "grad/norm", 1234): math.nan, (1, "mismatch/ratio_max", 2345): math.inf,
             (2, "reward/std", 1500): -math.inf, (3, "mismatch/kl", 777): math.nan}  # fmt: skip
"""A couple of NaN/Inf points, as a collapsing run logs them: (run, key, step) -> value."""


def step_values(run: int, step: int, keys: list[str]) -> dict[str, float]:
    """One step of run number `run`: plausible RL numbers, a slow trend plus noise."""
    phase = run * 0.7
    wobble = math.sin(step * 0.013 + phase)
    noise = _noise(run, step, 0)
    kl = 1e-3 * (1.3 + wobble + noise) * math.exp(min(step, 20_000) / 6000) + 1e-5
    out: dict[str, float] = {}
    for i, key in enumerate(keys):
        if key == "reward/mean":
            value = 0.15 + 0.6 * math.tanh(step / 1500 + run * 0.05) + 0.04 * noise + 0.02 * wobble
        elif key == "mismatch/kl":
            value = kl
        elif key == "gate/frac":
            value = max(0.0, 0.05 + 0.02 * wobble + 0.015 * _noise(run, step, 1))
        elif key == "mismatch/ratio_max":
            value = 1.0 + 40 * kl * (1 + abs(_noise(run, step, 2)))
        elif key == "grad/norm":
            spike = 8.0 if (step + run * 37) % 997 == 0 else 0.0
            value = 1.0 + 0.3 * abs(wobble) + 0.2 * _noise(run, step, 3) + spike
        else:
            value = (i % 7 + 1) * (
                1 + 0.3 * math.sin(step * (0.002 + i * 1e-4) + phase)
            ) + 0.1 * _noise(run, step, i)
        out[key] = NONFINITE.get((run, key, step), value)
    return out


def finite(values: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in values.items() if math.isfinite(v)}


# -- the peers' side ------------------------------------------------------------------------


def _until_stdin_closes() -> threading.Event:
    stop = threading.Event()

    def watch() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    return stop


def _live_schedule(config: dict[str, Any], send: Any) -> None:
    """Call send(run, step) for every run at `rate` steps/s, phases spread, until stdin closes."""
    stop = _until_stdin_closes()
    runs, rate, step = config["runs"], config["rate"], config["start"]
    period = 1.0 / rate
    began = time.monotonic()
    k = 0
    while not stop.is_set():
        for run in range(runs):
            due = began + k * period + run * period / runs
            delay = due - time.monotonic()
            if delay > 0 and stop.wait(delay):
                return
            send(run, step)
        step += 1
        k += 1


def tb_writers(config: dict[str, Any]) -> list[Any]:
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    return [EventFileWriter(str(Path(config["logdir"]) / f"run-{run:02d}"), max_queue_size=100_000, flush_secs=3600)
            for run in range(config["runs"])]  # fmt: skip


def tb_event(step: int, values: dict[str, float]) -> Any:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
    return Event(wall_time=time.time(), step=step, summary=summary)


def tb_history(config: dict[str, Any]) -> None:
    writers = tb_writers(config)
    for run, writer in enumerate(writers):
        for step in range(config["steps"]):
            writer.add_event(tb_event(step, finite(step_values(run, step, config["keys"]))))
        writer.flush()
    for writer in writers:
        writer.close()


def tb_live(config: dict[str, Any]) -> None:
    writers = tb_writers(config)  # new event files in the same run directories, as a resumed run

    def send(run: int, step: int) -> None:
        writers[run].add_event(tb_event(step, finite(step_values(run, step, config["keys"]))))
        writers[run].flush()

    _live_schedule(config, send)
    for writer in writers:
        writer.close()


def trackio_history(config: dict[str, Any]) -> None:
    import trackio

    for run in range(config["runs"]):
        trackio.init(
            project=config["project"],
            name=f"run-{run:02d}",
            embed=False,
            auto_log_gpu=False,
            auto_log_cpu=False,
        )
        for step in range(config["steps"]):
            trackio.log(finite(step_values(run, step, config["keys"])), step=step)
        trackio.finish()


def trackio_live(config: dict[str, Any]) -> None:
    import trackio

    handles = [
        trackio.init(project=config["project"], name=f"run-{run:02d}", resume="must", embed=False,
                     auto_log_gpu=False, auto_log_cpu=False)
        for run in range(config["runs"])
    ]  # fmt: skip

    def send(run: int, step: int) -> None:
        handles[run].log(finite(step_values(run, step, config["keys"])), step=step)

    _live_schedule(config, send)
    for handle in handles:
        handle.finish()


def trackio_show(config: dict[str, Any]) -> None:
    import trackio

    trackio.show(
        project=config["project"], open_browser=False, block_thread=True, server_port=config["port"]
    )


MODES = {
    "tb-history": tb_history,
    "tb-live": tb_live,
    "trackio-history": trackio_history,
    "trackio-live": trackio_live,
    "trackio-show": trackio_show,
}


if __name__ == "__main__":
    settings = json.loads(sys.argv[1])
    MODES[settings["mode"]](settings)

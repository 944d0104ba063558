"""One peer's side of bench/peers.py, run by that peer's own venv's python.

    PYTHONPATH=<repository root> <venv>/bin/python -m bench.peers_worker '<json config>'

Standard library plus the peer (and, for Keel and for reading wandb's offline file, this
repository's own modules, on PYTHONPATH). The config's `mode`:

- "workload": one run of `metrics` metrics x `steps` steps, one logging call per step
  with all the step's metrics (the way each peer is meant to be called per step). After
  the run is created it touches `ready_path` and waits for a line on stdin, so that
  bench/peers.py can start 8 of them at once. Every call is timed on this (the
  "training") thread; then the run is made durable (per peer, below) and timed too.
- "seed": one run of one metric x `steps` steps (the read-back series), written the
  fastest way the peer's logging API allows; untimed as a figure.
- "read": read that series back in full, `repeats` times; reports the median.

The result is one JSON line on stdout prefixed "PEERS_RESULT " (peers print their own
chatter there too) and the same JSON in `result_path`.

What "durable" means per peer (the wall time stops when the call below returns):
- keel: `Monitor.finish()` returned True: the server acked every frame, and an ack is
  sent only after the rows are committed.
- mlflow: every `log_batch` is a synchronous HTTP call that returns after the tracking
  server committed it; the last one returning (plus `set_terminated`) is durable.
- wandb (offline): `run.finish()` returned: wandb-core wrote and closed the .wandb file.
- aim: `run.close()` returned (the run's RocksDB chunk written and closed). Readers see
  it only after it is indexed (`aim up` does that in the background); "seed" does it.
- trackio: `trackio.finish()` returned (its sender thread flushed the queue into the
  project's SQLite file; it gives up after 30 s, so the stored row count is checked).
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.support import percentile

SERIES_KEY = "series/value"
"""The one metric of the read-back run."""
MLFLOW_BATCH_METRICS = 1000
"""MLflow's limit on metrics per log_batch call (used to write the read-back series)."""


def metric_keys(count: int) -> list[str]:
    return [f"bench/metric_{i:02d}" for i in range(count)]


def step_values(step: int, keys: list[str]) -> dict[str, float]:
    return {key: step * 0.001 + i for i, key in enumerate(keys)}


# -- the peers' adapters: open(name) -> (log(step, values), make_durable() -> info) ----------

Adapter = tuple[Callable[[int, dict[str, float]], None], Callable[[], dict[str, Any]]]


def keel_open(config: dict[str, Any], name: str) -> Adapter:
    from trainer_hooks.monitor import Monitor

    monitor = Monitor(config["target"], run_name=name, spool_dir=config["scratch"], tags=("peers",))

    def durable() -> dict[str, Any]:
        delivered = monitor.finish(timeout=900)
        if not delivered:
            raise RuntimeError("Monitor.finish() returned False: not every frame was acked")
        return {"run": monitor.run_id}

    return monitor.log, durable


def mlflow_open(config: dict[str, Any], name: str) -> Adapter:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=config["target"])
    run_id = client.create_run(experiment_id="0", run_name=name).info.run_id

    def log(step: int, values: dict[str, float]) -> None:
        now_ms = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(key, value, now_ms, step) for key, value in values.items()])

    def durable() -> dict[str, Any]:
        client.set_terminated(run_id)
        return {"run": run_id}

    return log, durable


def wandb_open(config: dict[str, Any], name: str) -> Adapter:
    import wandb

    run = wandb.init(
        project="keel-peers",
        name=name,
        mode="offline",
        dir=config["scratch"],
        # Off, as Keel does neither: system metrics sampling and console capture.
        settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
    )
    run_dir = Path(run.dir).parent  # run.dir is <offline-run-...>/files

    def log(step: int, values: dict[str, float]) -> None:
        run.log(values, step=step)

    def durable() -> dict[str, Any]:
        run.finish()
        files = sorted(run_dir.glob("run-*.wandb"))
        if not files:
            raise RuntimeError(f"no .wandb file in {run_dir} after finish()")
        return {"run": str(run_dir), "bytes": files[0].stat().st_size}

    return log, durable


def aim_open(config: dict[str, Any], name: str) -> Adapter:
    from aim import Repo, Run

    if not (Path(config["target"]) / ".aim").exists():
        # Only when new: init opens the repo's index for writing, which concurrent runs
        # (the many-runs scenario) cannot all do at once.
        Repo.from_path(config["target"], init=True)
    run = Run(
        repo=config["target"],
        experiment="keel-peers",
        # Off, as Keel does neither: system metrics sampling and terminal capture.
        system_tracking_interval=None,
        capture_terminal_logs=False,
    )
    run.name = name
    run_hash = run.hash

    def log(step: int, values: dict[str, float]) -> None:
        run.track(values, step=step)

    def durable() -> dict[str, Any]:
        run.close()
        return {"run": run_hash}

    return log, durable


def trackio_open(config: dict[str, Any], name: str) -> Adapter:
    import trackio

    trackio.init(project=config["project"], name=name, auto_log_gpu=False, auto_log_cpu=False)

    def durable() -> dict[str, Any]:
        trackio.finish()
        from trackio.sqlite_storage import SQLiteStorage

        stored = SQLiteStorage.get_log_count(config["project"], name)
        return {"run": name, "stored_steps": stored}

    return lambda step, values: trackio.log(values, step=step), durable


OPENERS: dict[str, Callable[[dict[str, Any], str], Adapter]] = {
    "keel": keel_open,
    "mlflow": mlflow_open,
    "wandb": wandb_open,
    "aim": aim_open,
    "trackio": trackio_open,
}


# -- readers: read(config, seeded) -> number of points read ----------------------------------


def keel_read(config: dict[str, Any], seeded: dict[str, Any]) -> int:
    from keel.client import Client

    return len(Client(config["target"]).series(seeded["run"], SERIES_KEY).steps)


def mlflow_read(config: dict[str, Any], seeded: dict[str, Any]) -> int:
    from mlflow.tracking import MlflowClient

    return len(MlflowClient(tracking_uri=config["target"]).get_metric_history(seeded["run"], SERIES_KEY))


def wandb_read(config: dict[str, Any], seeded: dict[str, Any]) -> int:
    # No offline read API in wandb: the .wandb transaction log, decoded with wandb's own
    # protobuf classes by `keel import wandb`'s reader.
    from keel.importers import read_wandb

    (imported,) = read_wandb(Path(seeded["run"]))
    return sum(1 for values in imported.table.values.values() if SERIES_KEY in values)


def aim_read(config: dict[str, Any], seeded: dict[str, Any]) -> int:
    from aim import Repo
    from aim.storage.context import Context

    run = Repo.from_path(config["target"]).get_run(seeded["run"])
    steps, _columns = run.get_metric(SERIES_KEY, Context({})).data.numpy()
    return len(steps)


def trackio_read(config: dict[str, Any], seeded: dict[str, Any]) -> int:
    from trackio.sqlite_storage import SQLiteStorage

    return len(SQLiteStorage.get_metric_values(config["project"], seeded["run"], SERIES_KEY))


READERS: dict[str, Callable[[dict[str, Any], dict[str, Any]], int]] = {
    "keel": keel_read,
    "mlflow": mlflow_read,
    "wandb": wandb_read,
    "aim": aim_read,
    "trackio": trackio_read,
}


# -- modes ------------------------------------------------------------------------------------


def workload(config: dict[str, Any]) -> dict[str, Any]:
    keys = metric_keys(config["metrics"])
    rows = [step_values(step, keys) for step in range(config["steps"])]
    log, durable = OPENERS[config["peer"]](config, config["name"])
    Path(config["ready_path"]).touch()
    sys.stdin.readline()  # "go", from bench/peers.py once every worker of the scenario is ready
    go = time.time()
    started = time.perf_counter()
    call_us = []
    for step, values in enumerate(rows):
        called = time.perf_counter_ns()
        log(step, values)
        call_us.append((time.perf_counter_ns() - called) / 1000)
    logged = time.perf_counter()
    info = durable()
    done = time.perf_counter()
    return {
        **info,
        "go": go,
        "end": go + (done - started),
        "log_s": logged - started,
        "durable_s": done - started,
        "points": config["steps"] * config["metrics"],
        "call_us": [round(us, 1) for us in call_us],
        "call_median_us": statistics.median(call_us),
        "call_p99_us": percentile(call_us, 99),
    }


def seed(config: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    if config["peer"] == "mlflow":
        # One call per step would be 100k HTTP round trips; log_batch takes 1000 metrics.
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=config["target"])
        run_id = client.create_run(experiment_id="0", run_name=config["name"]).info.run_id
        now_ms = int(time.time() * 1000)
        for start in range(0, config["steps"], MLFLOW_BATCH_METRICS):
            stop = min(config["steps"], start + MLFLOW_BATCH_METRICS)
            client.log_batch(run_id, metrics=[Metric(SERIES_KEY, s * 0.001, now_ms, s) for s in range(start, stop)])
        client.set_terminated(run_id)
        info: dict[str, Any] = {"run": run_id}
    else:
        log, durable = OPENERS[config["peer"]](config, config["name"])
        for step in range(config["steps"]):
            log(step, {SERIES_KEY: step * 0.001})
        info = durable()
    seeded = time.perf_counter()
    if config["peer"] == "aim":
        # Readers see a run only once it is in the repo's index, which `aim up` (the UI) or
        # `aim storage reindex` builds; without either running, do what they do.
        from aim import Repo
        from aim.sdk.index_manager import RepoIndexManager

        RepoIndexManager.get_index_manager(Repo.from_path(config["target"])).index(info["run"])
        info["index_s"] = time.perf_counter() - seeded
    return {**info, "seed_s": seeded - started}


READER_MODULES = {
    "keel": ["keel.client"],
    "mlflow": ["mlflow.tracking"],
    "wandb": ["keel.importers", "wandb.proto.wandb_internal_pb2"],
    "aim": ["aim", "aim.storage.context"],
    "trackio": ["trackio.sqlite_storage"],
}
"""Imported before the reads are timed: a read is the call, not the interpreter loading the peer."""


def read(config: dict[str, Any]) -> dict[str, Any]:
    reader = READERS[config["peer"]]
    for module in READER_MODULES[config["peer"]]:
        importlib.import_module(module)
    seconds, counts = [], []
    for _ in range(config["repeats"]):
        started = time.perf_counter()
        counts.append(reader(config, config["seeded"]))
        seconds.append(time.perf_counter() - started)
    return {"read_s": statistics.median(seconds), "read_all_s": seconds, "points_read": counts[-1]}


def main() -> None:
    config = json.loads(sys.argv[1])
    result = {"workload": workload, "seed": seed, "read": read}[config["mode"]](config)
    Path(config["result_path"]).write_text(json.dumps(result))
    print("PEERS_RESULT " + json.dumps({k: v for k, v in result.items() if k != "call_us"}), flush=True)


if __name__ == "__main__":
    main()

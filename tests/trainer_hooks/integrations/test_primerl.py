"""KeelMonitor (prime-rl's monitor interface) streaming to a real server.

prime-rl is not on PyPI and needs vLLM, flash-attn and CUDA torch, so its `prime_rl.monitors`
package is reproduced from the pinned source (0.8.0, commit 559b44772e471d1538537b8805cc77f3824a5e64)
in tests/support/frameworks/prime_rl/monitors/__init__.py: `setup`, `log`, `finalize`, the
`Monitor` base class and the file monitor, which stays on beside Keel's. The metric dicts are
the ones the orchestrator (src/prime_rl/orchestrator/orchestrator.py, the step's metrics
before `monitors.log(metrics, step=step)`) and the trainer (src/prime_rl/trainer/rl/train.py
`train`: perf, optim, tensor stats, time) log; `clean_exit` is src/prime_rl/utils/utils.py's.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.monitor import REPO_ROOT
from tests.support.stored_runs import keys_of, run_named, stored
from trainer_hooks.integrations import primerl

FRAMEWORKS = REPO_ROOT / "tests" / "support" / "frameworks"


@pytest.fixture
def monitors(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A fresh copy of the reproduced `prime_rl.monitors`, on rank 0."""
    for name in ("RANK", "DP_RANK", "PRL_RUN_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.syspath_prepend(str(FRAMEWORKS))
    from prime_rl import monitors as module

    yield module
    primerl._LIVE.clear()
    for name in [n for n in sys.modules if n == "prime_rl" or n.startswith("prime_rl.")]:
        del sys.modules[name]


class WandbMonitorConfig(BaseModel):  # packages/prime-rl-configs/.../configs/monitors.py
    project: str = "prime-rl"
    name: str | None = None
    group: str | None = None
    tags: list[str] | None = None
    offline: bool = False


class FileMonitorConfig(BaseModel):
    path: Path = Path("metrics.jsonl")


class MonitorsConfig(BaseModel):
    wandb: WandbMonitorConfig | None = None
    file: FileMonitorConfig | None = FileMonitorConfig()


class OrchestratorConfig(BaseModel):
    monitors: MonitorsConfig = MonitorsConfig()
    batch_size: int = 64


class TrainerConfig(BaseModel):
    monitors: MonitorsConfig = MonitorsConfig()
    max_steps: int = 10


def clean_exit(func: Callable[..., Any]) -> Callable[..., Any]:
    """src/prime_rl/utils/utils.py clean_exit (sync branch; wandb and torch.distributed left out)."""

    @functools.wraps(func)
    def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Exception:
            # sys.exit raises SystemExit so the finally block still runs.
            sys.exit(1)

    return sync_wrapper


def orchestrator_metrics(step: int) -> dict[str, Any]:
    """Orchestrator.start's per-step dict (orchestrator.py, progress/timing and staleness)."""
    return {
        "progress/tokens": 51200,
        "progress/rollouts": 64,
        "time/step": 12.5,
        "time/wait_for_policy": 0.25,
        "step": step,
        "off_policy/mean": 0.5 * step,
        "off_policy/max": float(step),
        "off_policy/in_flight/mean": 0.25,
        "off_policy/dropped": 0.0,
    }


def test_orchestrator_streams_beside_the_file_monitor_and_finishes(monitors: Any, url: str, tmp_path: Path) -> None:
    config = OrchestratorConfig(monitors=MonitorsConfig(wandb=WandbMonitorConfig(name="sort", group="g")))

    async def orchestrator() -> None:  # what Orchestrator.start does with the monitors
        await monitors.setup(
            wandb=None, prime=None, file=config.monitors.file, output_dir=tmp_path / "out",
            run_config=config, train_env_names=["alphabet-sort"], eval_env_names=[],
        )
        for step in (1, 2, 3):
            await monitors.log([{"prompt": "p", "completion": "c"}], step, "train", "all")
            await monitors.log(orchestrator_metrics(step), step=step)
        await monitors.finalize()

    primerl.run(lambda: asyncio.run(orchestrator()))

    run = run_named(url, "sort-orchestrator")
    assert (run["project"], run["group"], run["status"]) == ("prime-rl", "sort", "finished")
    assert run["config"]["batch_size"] == 64
    assert run["config"]["prime-rl/component"] == "orchestrator"
    assert stored(url, run["id"], "staleness/lag_mean") == {1: 0.5, 2: 1.0, 3: 1.5}
    assert stored(url, run["id"], "staleness/lag_max") == {1: 1.0, 2: 2.0, 3: 3.0}
    assert stored(url, run["id"], "perf/step_s") == {1: 12.5, 2: 12.5, 3: 12.5}
    assert stored(url, run["id"], "prime-rl/off_policy/in_flight/mean") == {1: 0.25, 2: 0.25, 3: 0.25}
    assert keys_of(url, run["id"]) == {
        "staleness/lag_mean", "staleness/lag_max", "perf/step_s", "prime-rl/progress/tokens",
        "prime-rl/progress/rollouts", "prime-rl/time/wait_for_policy",
        "prime-rl/off_policy/in_flight/mean", "prime-rl/off_policy/dropped",
    }  # no "step": it is the step
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]  # prime-rl's own monitor still logs


def test_a_trainer_that_crashes_is_failed_with_its_nan_kept(monitors: Any, url: str, tmp_path: Path) -> None:
    @clean_exit
    def train(config: TrainerConfig) -> None:  # trainer/rl/train.py train, two steps
        asyncio.run(monitors.setup(wandb=None, file=config.monitors.file, output_dir=tmp_path / "trainer", run_config=config))
        for step in (1, 2):
            asyncio.run(monitors.log({"perf/mfu": 41.0, "step": step}, step=step))
            asyncio.run(monitors.log({"optim/lr": 1e-6, "step": step, "optim/grad_norm": 0.5 * step}, step=step))
            tensor_stats = {  # Tensors.compute_stats: NaN when every rollout of the batch failed
                "loss/mean": 0.01, "entropy/all/mean": 0.7,
                "mismatch_kl/all/mean": math.nan if step == 2 else 0.002, "mismatch_kl/all/max": 0.4,
                "step": step,
            }
            asyncio.run(monitors.log(tensor_stats, step=step))
            asyncio.run(monitors.log({"time/step": 30.0, "step": step}, step=step))
        raise RuntimeError("CUDA error: an illegal memory access")

    with pytest.raises(SystemExit) as exited:
        primerl.run(lambda: train(TrainerConfig()))
    assert exited.value.code == 1

    run = run_named(url, "trainer-trainer")  # no wandb name, no $PRL_RUN_NAME: the output dir's
    assert run["status"] == "failed"
    assert stored(url, run["id"], "grad/norm") == {1: 0.5, 2: 1.0}
    kl = stored(url, run["id"], "mismatch/kl")
    assert kl[1] == 0.002 and math.isnan(kl[2])
    assert stored(url, run["id"], "prime-rl/mismatch_kl/all/max") == {1: 0.4, 2: 0.4}
    assert stored(url, run["id"], "loss/total") == {1: 0.01, 2: 0.01}
    rows = [json.loads(line) for line in (tmp_path / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert not any("mismatch_kl/all/mean" in row for row in rows if row["step"] == 2)  # the file monitor drops NaN


def test_other_ranks_get_no_keel_monitor(monitors: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DP_RANK", "1")
    primerl.install()
    primerl.install()  # once
    asyncio.run(monitors.setup(file=None, output_dir=tmp_path, run_config=TrainerConfig()))
    assert monitors.MONITORS == []

"""KeelStatsLogger (AReaL's StatsLogger interface) streaming to a real server.

AReaL 1.0.4 is on PyPI, but it pins torch < 2.11, transformers <= 5.3 and dozens of agent
and serving packages, and its stats logger imports swanlab, trackio and tensorboardX, so
the parts `attach` touches are reproduced below from the pinned source (commit
4aef98d8d818af55b43621aaadba047ae10f4e77): areal/utils/stats_logger.py `StatsLogger`
(`__init__`, `state_dict`, `load_state_dict`, `close`, `commit` verbatim, with wandb's
`log`/`finish` recorded instead of sent and the other backends left out) and
areal/trainer/rl_trainer.py `PPOTrainer` (`__enter__`, `__exit__`, `close`,
`_export_and_commit_stats`). The stats are what `actor.export_stats()` returns
(areal/utils/stats_tracker.py `_aggregate`: `/avg` `/min` `/max` for AVG_MIN_MAX keys, a
value and its `__count` for SCALAR keys).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from tests.support.stored_runs import keys_of, run_of, stored
from trainer_hooks.integrations.areal import KeelStatsLogger, attach


@dataclasses.dataclass
class WandBConfig:  # areal/api/cli_args.py (the fields StatsLogger reads)
    mode: str = "disabled"
    wandb_api_key: str = ""
    project: str | None = None
    name: str | None = None
    group: str | None = None
    tags: list[str] | None = None


@dataclasses.dataclass
class SwanlabConfig:
    mode: str = "disabled"
    api_key: str | None = None


@dataclasses.dataclass
class StatsLoggerConfig:
    experiment_name: str = "gsm8k-grpo"
    trial_name: str = "trial0"
    fileroot: str = "/tmp/areal"
    wandb: WandBConfig = dataclasses.field(default_factory=WandBConfig)
    swanlab: SwanlabConfig = dataclasses.field(default_factory=SwanlabConfig)


@dataclasses.dataclass
class GRPOConfig:
    stats_logger: StatsLoggerConfig = dataclasses.field(default_factory=StatsLoggerConfig)
    total_train_epochs: int = 1


class StatsLogger:
    """areal/utils/stats_logger.py StatsLogger; `wandb_logged` stands for wandb.log."""

    def __init__(self, config: GRPOConfig):
        self.exp_config = config
        self.config = config.stats_logger
        self.wandb_logged: list[tuple[int, dict[str, float]]] = []
        self.closed = False
        self._last_commit_step = -1

    def state_dict(self) -> dict[str, Any]:
        return {"last_commit_step": self._last_commit_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._last_commit_step = state_dict["last_commit_step"]

    def close(self) -> None:
        self.closed = True  # wandb.finish(), swanlab.finish(), ...

    def commit(self, epoch: int, step: int, global_step: int, data: dict | list[dict]) -> None:
        if isinstance(data, dict):
            data = [data]
        log_step = max(global_step, self._last_commit_step + 1)
        for i, item in enumerate(data):
            # Filter out counter keys for scalar variables
            item = {k: v for k, v in item.items() if not k.endswith("__count")}
            self.wandb_logged.append((log_step + i, item))  # wandb.log(item, step=log_step + i)
        self._last_commit_step = log_step + len(data) - 1


class PPOTrainer:
    """areal/trainer/rl_trainer.py PPOTrainer: the stats logger's part of its life."""

    def __init__(self, config: GRPOConfig, steps: int, fail_at: int | None = None) -> None:
        self.config = config
        self.stats_logger = StatsLogger(config)
        self.steps = steps
        self.fail_at = fail_at

    def train(self, workflow: str, workflow_kwargs: dict[str, Any] | None = None) -> None:
        for global_step in range(self.steps):
            if global_step == self.fail_at:
                raise RuntimeError("rollout worker lost")
            self._export_and_commit_stats(epoch=0, epoch_step=global_step, global_step=global_step)

    def _export_and_commit_stats(self, epoch: int, epoch_step: int, global_step: int) -> None:
        self.stats_logger.commit(epoch, epoch_step, global_step, export_stats(global_step))

    def close(self) -> None:
        self.stats_logger.close()

    def __enter__(self) -> PPOTrainer:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> bool:
        self.close()
        return False


def export_stats(step: int) -> dict[str, float]:
    """actor.export_stats() + rollout.export_stats() for one step."""
    return {
        "ppo_actor/task_reward/avg": 0.25 * (step + 1),
        "ppo_actor/task_reward/min": 0.0,
        "ppo_actor/task_reward/max": 1.0,
        "ppo_actor/update/actor_loss/avg": -0.01,
        "ppo_actor/update/entropy/avg": 0.8,
        "ppo_actor/update/behave_approx_kl/avg": 0.002,
        "ppo_actor/update/grad_norm": math.nan if step == 1 else 0.5,  # fsdp_engine: NaN when None
        "ppo_actor/update/grad_norm__count": 2,
        "ppo_actor/update/lr": 1e-6,
        "ppo_actor/update/lr__count": 2,
        "timeperf/train_step": 12.0,
    }


def test_commits_reach_keel_at_areals_own_steps(url: str) -> None:
    config = GRPOConfig()
    config.stats_logger.wandb = WandBConfig(wandb_api_key="secret", project="math", name="grpo-7b")
    config.stats_logger.swanlab = SwanlabConfig(api_key="secret too")
    with PPOTrainer(config, steps=3) as trainer:
        inner = trainer.stats_logger
        keel = attach(trainer)
        trainer.train(workflow="areal.workflow.rlvr.RLVRWorkflow")
        # a list of dicts takes one step each, after the last committed one
        trainer.stats_logger.commit(0, 3, 1, [{"eval/acc": 0.5}, {"eval/acc": 0.75}])
    assert trainer.stats_logger is keel and inner.closed

    run = run_of(url, keel.monitor.run_id)
    assert (run["name"], run["project"], run["group"], run["status"]) == ("grpo-7b", "math", "gsm8k-grpo_trial0", "finished")
    assert "wandb_api_key" not in run["config"]["stats_logger"]["wandb"]
    assert run["config"]["stats_logger"]["swanlab"] == {"mode": "disabled"}
    assert config.stats_logger.wandb.wandb_api_key == "secret"  # AReaL's own config untouched
    assert [step for step, _ in inner.wandb_logged] == [0, 1, 2, 3, 4]
    assert stored(url, run["id"], "reward/mean") == {0: 0.25, 1: 0.5, 2: 0.75}
    grad = stored(url, run["id"], "grad/norm")
    assert grad[0] == 0.5 and math.isnan(grad[1]) and grad[2] == 0.5
    assert stored(url, run["id"], "loss/pg") == {0: -0.01, 1: -0.01, 2: -0.01}
    assert stored(url, run["id"], "optim/lr") == {0: 1e-6, 1: 1e-6, 2: 1e-6}
    assert stored(url, run["id"], "areal/ppo_actor/update/behave_approx_kl/avg")[2] == 0.002
    assert stored(url, run["id"], "eval/acc") == {3: 0.5, 4: 0.75}
    keys = keys_of(url, run["id"])
    assert not any(key.endswith("__count") for key in keys)
    assert len(keys) == len(export_stats(0)) - 2 + 1


def test_a_train_that_raises_fails_the_run_though_close_follows(url: str) -> None:
    with pytest.raises(RuntimeError, match="rollout worker lost"), PPOTrainer(GRPOConfig(), steps=5, fail_at=2) as trainer:
        keel = attach(trainer)
        trainer.train(workflow="areal.workflow.rlvr.RLVRWorkflow")
    run = run_of(url, keel.monitor.run_id)
    assert (run["name"], run["project"], run["status"]) == ("trial0", "gsm8k-grpo", "failed")
    assert stored(url, run["id"], "reward/mean") == {0: 0.25, 1: 0.5}


def test_a_recovered_run_goes_on_after_its_last_committed_step(url: str) -> None:
    trainer = PPOTrainer(GRPOConfig(), steps=0)
    trainer.stats_logger.load_state_dict({"last_commit_step": 9})  # RecoverHandler.load, in __init__
    keel = attach(trainer)
    keel.commit(0, 0, 5, {"ppo_actor/task_reward/avg": 1.0})
    keel.load_state_dict({"last_commit_step": 20})
    keel.commit(0, 1, 6, {"ppo_actor/task_reward/avg": 2.0})
    assert keel.state_dict() == {"last_commit_step": 21}
    keel.close()
    assert stored(url, keel.monitor.run_id, "reward/mean") == {10: 1.0, 21: 2.0}
    assert [step for step, _ in trainer.stats_logger.inner.wandb_logged] == [10, 21]


def test_without_an_inner_logger(url: str) -> None:
    keel = KeelStatsLogger.from_config(GRPOConfig())
    keel.commit(0, 0, 0, {"ppo_actor/update/grad_norm": 2.0, "note": "x"})
    keel.close()
    assert stored(url, keel.monitor.run_id, "grad/norm") == {0: 2.0}
    assert keel.skipped == 1

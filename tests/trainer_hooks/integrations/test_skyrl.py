"""KeelTracking around SkyRL's real `Tracking` (skyrl 0.3.0, requirements/skyrl.txt), streaming
to a real server.

SkyRL's trainers need Ray GPU workers, and its config classes (skyrl.train.config) do not
build on Python < 3.12, so the trainer's calls are made here as RayPPOTrainer.train makes
them (skyrl/train/trainer.py at commit a9564572eb8e91076be43c1bd5e4615e3de17265: the step's
`log_payload`, `tracker.log(log_payload, step=global_step, commit=True)`, `tracker.finish()`)
and as BasePPOExp.run does on an exception (skyrl/train/entrypoints/main_base.py:
`flush_pending_metrics`, then `tracker.log_exception(e, step=global_step)`, then raise),
and the config is a dataclass with the `trainer` fields `wrap` reads.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
from skyrl.train.utils.tracking import Tracking
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.stored_runs import run_of, stored
from trainer_hooks.integrations.skyrl import KeelTracking


@dataclasses.dataclass
class TrainerConfig:  # skyrl/train/config/config.py TrainerConfig (the fields get_tracker uses)
    project_name: str = "skyrl"
    run_name: str = "test_run"
    logger: str = "tensorboard"
    tags: list[str] | None = None
    train_batch_size: int = 1024


@dataclasses.dataclass
class SkyRLTrainConfig:
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)


def log_payload(step: int) -> dict[str, Any]:
    """RayPPOTrainer.train's log_payload for one step (all_metrics + timing/*)."""
    return {
        "reward/avg_raw_reward": 0.25 * step,
        "reward/avg_pass_at_4": 0.5,
        "generate/avg_num_tokens": 312.0,
        "policy/rollout_train_logprobs_abs_diff_mean": 0.01 * step,
        "policy/loss_metrics/is_ratio_max": 1.5,
        "policy/loss_metrics/is_ratio_min": 0.0,
        "policy/policy_loss": -0.02,
        "policy/final_loss": -0.019,
        "policy/policy_entropy": 0.9,
        "policy/policy_lr": 1e-6,
        "policy/grad_norm": math.nan if step == 2 else 0.4,
        "timing/step": 40.0,
    }


@pytest.fixture
def url(url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """conftest.py's server, with SkyRL's TensorBoard backend writing under tmp_path."""
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tb"))
    return url


def get_tracker(cfg: SkyRLTrainConfig) -> KeelTracking:
    """The override the docs give: BasePPOExp.get_tracker's Tracking, wrapped."""
    inner = Tracking(
        project_name=cfg.trainer.project_name,
        experiment_name=cfg.trainer.run_name,
        backend=cfg.trainer.logger,
        config=cfg,
        tags=cfg.trainer.tags,
    )
    return KeelTracking.wrap(inner, cfg)


def test_the_trainers_logs_reach_keel_and_skyrls_own_backend(url: str, tmp_path: Path) -> None:
    cfg = SkyRLTrainConfig(TrainerConfig(project_name="gsm8k", run_name="grpo-1.5b", tags=["a"]))
    tracker = get_tracker(cfg)
    assert tracker.backend == "tensorboard"  # the rest of Tracking is reached through
    tracker.log({"eval/all/avg_score": 0.4}, step=0, commit=True)  # eval before training
    for step in (1, 2, 3):
        tracker.log({"policy/policy_loss_partial": 1.0}, step=step, commit=False)  # fully async: parts
        tracker.log(log_payload(step), step=step, commit=True)
    tracker.log_samples_to_table("trajectories", ["step", "text"], [(1, "x")], step=3)  # wandb only
    tracker.finish()

    run = run_of(url, tracker.monitor.run_id)
    assert (run["name"], run["project"], run["tags"], run["status"]) == ("grpo-1.5b", "gsm8k", ["a"], "finished")
    assert run["config"]["trainer"]["train_batch_size"] == 1024
    rid = run["id"]
    assert stored(url, rid, "mismatch/log_ratio_abs_mean") == {1: 0.01, 2: 0.02, 3: 0.03}
    assert stored(url, rid, "mismatch/ratio_max") == {1: 1.5, 2: 1.5, 3: 1.5}
    assert stored(url, rid, "reward/mean") == {1: 0.25, 2: 0.5, 3: 0.75}
    grad = stored(url, rid, "grad/norm")
    assert grad[1] == 0.4 and math.isnan(grad[2])
    assert stored(url, rid, "loss/pg") == {1: -0.02, 2: -0.02, 3: -0.02}
    assert stored(url, rid, "loss/total") == {1: -0.019, 2: -0.019, 3: -0.019}
    assert stored(url, rid, "policy/entropy") == {1: 0.9, 2: 0.9, 3: 0.9}
    assert stored(url, rid, "optim/lr") == {1: 1e-6, 2: 1e-6, 3: 1e-6}
    assert stored(url, rid, "skyrl/policy/loss_metrics/is_ratio_min") == {1: 0.0, 2: 0.0, 3: 0.0}
    assert stored(url, rid, "skyrl/timing/step") == {1: 40.0, 2: 40.0, 3: 40.0}
    assert stored(url, rid, "skyrl/policy/policy_loss_partial") == {1: 1.0, 2: 1.0, 3: 1.0}
    assert stored(url, rid, "eval/all/avg_score") == {0: 0.4}

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("policy/rollout_train_logprobs_abs_diff_mean")] == [1, 2, 3]


def test_an_exception_in_run_marks_the_run_failed(url: str) -> None:
    tracker = get_tracker(SkyRLTrainConfig(TrainerConfig(logger="console", run_name="oom")))

    def run() -> None:  # BasePPOExp.run
        try:
            tracker.log(log_payload(1), step=1, commit=True)
            raise RuntimeError("CUDA out of memory")
        except Exception as e:
            tracker.log({"timing/generate": 3.0}, step=2, commit=True)  # flush_pending_metrics
            tracker.log_exception(e, step=2)
            raise

    with pytest.raises(RuntimeError, match="out of memory"):
        run()
    run_ = run_of(url, tracker.monitor.run_id)
    assert run_["status"] == "failed"
    assert stored(url, run_["id"], "skyrl/timing/generate") == {2: 3.0}
    assert stored(url, run_["id"], "reward/mean") == {1: 0.25}

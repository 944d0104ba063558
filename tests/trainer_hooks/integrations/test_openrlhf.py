"""KeelLogger (OpenRLHF's tracker interface) streaming to a real server.

OpenRLHF 0.11.2 does not install without a GPU toolchain (it pins flash-attn==2.8.3 and
deepspeed==0.19.6, and openrlhf.trainer.ppo_trainer imports flash_attn), so nothing here
runs OpenRLHF's classes. The streams are copied from its source, the PyPI wheel
openrlhf-0.11.2-cp311-cp311-manylinux1_x86_64.whl (sha256 c969d70db03a70724c3d8a5a01186c6e
0728bce624fb3dff95e39b5396acefa6): the `status` dict that PPOTrainer.fit hands to
save_logs_and_checkpoints -> log_train (openrlhf/trainer/ppo_trainer.py train_step and
_compute_rollout_stats; openrlhf/trainer/ray/ppo_actor.py ppo_train and training_step;
openrlhf/trainer/ray/ppo_critic.py), and compute_eval_metrics' logs for log_eval.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch

from tests.support.monitor import FAST
from trainer_hooks.integrations.openrlhf import (
    OPENRLHF_TO_KEEL,
    KeelLogger,
    _wrap_fit,
    keel_metrics,
)
from trainer_hooks.monitor import Monitor


def stored(url: str, run_id: str, key: str) -> dict[int, float]:
    response = httpx.get(f"{url}/api/v1/runs/{run_id}/series", params={"key": key})
    response.raise_for_status()
    body = response.json()
    return {step: float(value) for step, value in zip(body["steps"], body["values"], strict=True)}


def status_of(url: str, run_id: str) -> str:
    return str(httpx.get(f"{url}/api/v1/runs/{run_id}").json()["status"])


def keys_of(url: str, run_id: str) -> set[str]:
    return {k["key"] for k in httpx.get(f"{url}/api/v1/runs/{run_id}/keys").json()}


def train_status(step: int) -> dict[str, Any]:
    """One step's `status` as PPOTrainer.fit passes it to save_logs_and_checkpoints."""
    return {
        # ppo_actor.ppo_train: token- or sample-weighted means over micro-batches
        "policy_loss": 0.01 * step,
        "actor_lr": 5e-7,
        "actor_grad_norm": 0.5 * step,
        "ppo_clip_ratio": 0.02,
        "ppo_kl": 1e-4,
        "vllm_kl": torch.tensor(0.003 * step),  # 0-dim tensor, as ppo_train leaves it
        "is_filter_ratio": 0.0625,
        "kl": 0.01,
        "logprobs_diff": -0.02,
        "reward": 0.4,
        "return": 0.38,
        "response_length": 210.0,
        "total_length": 390.0,
        # ppo_critic.training_step
        "critic_loss": 0.3,
        "values": 0.1,
        "critic_lr": 9e-6,
        # train_step / fit
        "timing/make_experience": 3.0,
        "timing/ppo_train": 5.0,
        "timing/broadcast": 0.5,
        "timing/generation": 6.5,
        "timing/step_total": 15.0,
        "rollout/reward_mean": 0.25 * step,
        "rollout/reward_std": 0.5,
        "rollout/response_length_mean": 211.0,
        "rollout/truncated_rate": 0.0,
        "rollout/num_samples": 64.0,
        "dynamic_filtering_pass_rate": None,  # OpenRLHF's loggers skip None
        "generated_samples": ["<prompt> 1 + 1 = 2", 1.0],
    }


EVAL_LOGS = {
    "eval_gsm8k_pass4": 0.8,
    "eval_gsm8k_pass1": 0.6,
    "eval_response_length_mean": 180.0,
    "eval_num_samples": 100.0,
}


class RecordingTracker:
    """The TensorboardLogger interface KeelLogger passes every call on to."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int | None]] = []

    def log_train(self, global_step: int, logs_dict: dict[str, Any]) -> None:
        self.calls.append(("train", global_step))

    def log_eval(self, global_step: int, logs_dict: dict[str, Any]) -> None:
        self.calls.append(("eval", global_step))

    def close(self) -> None:
        self.calls.append(("close", None))


def test_keel_metrics_maps_openrlhf_names() -> None:
    metrics, skipped = keel_metrics({**train_status(2), "note": "x", "flag": True})
    assert metrics["grad/norm"] == 1.0
    assert metrics["reward/mean"] == 0.5
    assert metrics["gate/frac"] == 0.0625
    assert metrics["openrlhf/rollout/reward_std"] == 0.5
    assert metrics["policy/clip_frac"] == 0.02
    assert "openrlhf/generated_samples" not in metrics
    assert "openrlhf/dynamic_filtering_pass_rate" not in metrics
    assert skipped == ["note", "flag"]
    evaluation, _ = keel_metrics(EVAL_LOGS, evaluation=True)
    assert evaluation == {
        "eval/gsm8k_pass4": 0.8,
        "eval/gsm8k_pass1": 0.6,
        "eval/response_length_mean": 180.0,
        "eval/num_samples": 100.0,
    }
    assert len(set(OPENRLHF_TO_KEEL.values())) == len(OPENRLHF_TO_KEEL)


def test_logger_streams_train_and_eval_logs_and_passes_them_on(
    sqlite_url: str, server_factory: Any, tmp_path: Path
) -> None:
    server = server_factory(sqlite_url)
    monitor = Monitor(
        server.url, run_name="openrlhf-stream", spool_dir=tmp_path / "spool", sender_config=FAST
    )
    inner = RecordingTracker()
    keel = KeelLogger(monitor, inner)
    for step in (1, 2, 3):
        keel.log_train(step, train_status(step))
    keel.log_eval(3, EVAL_LOGS)
    keel.close()

    assert inner.calls == [("train", 1), ("train", 2), ("train", 3), ("eval", 3), ("close", None)]
    run_id = monitor.run_id
    assert status_of(server.url, run_id) == "finished"
    vllm_kl = {s: float(torch.tensor(0.003 * s)) for s in (1, 2, 3)}  # stored as float32 sent it
    assert stored(server.url, run_id, "mismatch/kl_k1") == vllm_kl
    assert stored(server.url, run_id, "grad/norm") == {1: 0.5, 2: 1.0, 3: 1.5}
    assert stored(server.url, run_id, "reward/mean") == {1: 0.25, 2: 0.5, 3: 0.75}
    assert stored(server.url, run_id, "loss/pg") == {1: 0.01, 2: 0.02, 3: 0.03}
    assert stored(server.url, run_id, "perf/step_s") == {1: 15.0, 2: 15.0, 3: 15.0}
    assert stored(server.url, run_id, "openrlhf/critic_loss") == {1: 0.3, 2: 0.3, 3: 0.3}
    assert stored(server.url, run_id, "eval/gsm8k_pass1") == {3: 0.6}
    keys = keys_of(server.url, run_id)
    assert not {"openrlhf/generated_samples", "openrlhf/dynamic_filtering_pass_rate"} & keys
    assert len(keys) == len(train_status(1)) - 2 + len(EVAL_LOGS)
    assert keel.skipped == 0


def test_a_fit_that_raises_marks_the_run_failed(
    sqlite_url: str, server_factory: Any, tmp_path: Path
) -> None:
    """What install() does to the trainer class: fit() raising fails the run, then re-raises."""
    server = server_factory(sqlite_url)
    monitor = Monitor(
        server.url, run_name="openrlhf-failed", spool_dir=tmp_path / "spool", sender_config=FAST
    )

    class Trainer:
        def __init__(self) -> None:
            self.tensorboard_logger = KeelLogger(monitor)

        def fit(self) -> None:
            self.tensorboard_logger.log_train(1, {"actor_grad_norm": math.nan})
            raise RuntimeError("NCCL timeout")

    _wrap_fit(Trainer)
    _wrap_fit(Trainer)  # once per class
    with pytest.raises(RuntimeError, match="NCCL timeout"):
        Trainer().fit()
    assert status_of(server.url, monitor.run_id) == "failed"
    assert math.isnan(stored(server.url, monitor.run_id, "grad/norm")[1])


def test_from_args_names_the_run_and_never_stores_the_wandb_key(
    sqlite_url: str, server_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory(sqlite_url)
    monkeypatch.setenv("KEEL_URL", server.url)
    monkeypatch.setenv("KEEL_SPOOL_DIR", str(tmp_path / "spool"))
    args = SimpleNamespace(  # what openrlhf.utils.config.hierarchize makes of the CLI
        logger=SimpleNamespace(
            wandb=SimpleNamespace(key="secret", project="math", group="grpo", run_name="r1")
        ),
        actor=SimpleNamespace(eps_clip_low_high=(0.2, 0.28)),
    )
    keel = KeelLogger.from_args(args)
    keel.log_train(1, {"rollout/reward_mean": 0.5})
    keel.close()

    run = httpx.get(f"{server.url}/api/v1/runs/{keel.monitor.run_id}").json()
    assert (run["name"], run["project"], run["group"], run["status"]) == (
        "r1",
        "math",
        "grpo",
        "finished",
    )
    assert run["config"]["logger"]["wandb"] == {
        "project": "math",
        "group": "grpo",
        "run_name": "r1",
    }
    assert run["config"]["actor"] == {"eps_clip_low_high": [0.2, 0.28]}
    assert args.logger.wandb.key == "secret"  # a copy: OpenRLHF's own args are untouched
    assert stored(server.url, run["id"], "reward/mean") == {1: 0.5}

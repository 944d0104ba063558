"""KeelLogger (NeMo-RL's LoggerInterface) streaming to a real server.

NeMo-RL is not on PyPI (the `nemo-rl` name holds an empty 0.0.0) and needs Python 3.13 and
CUDA torch, so its `Logger` is reproduced below from the pinned source (0.6.0, commit
7ea279abfbeb698b092856d0dab61e7cf39bc909), nemo_rl/utils/logger.py: `Logger.log_metrics`,
`log_hyperparams` and `finish` verbatim (the backends it builds from its config are left
out: the test appends to `loggers` as the run script does), and the GPU monitor's
`RayGpuMonitorLogger.flush` call. The metric dicts are grpo_train's (nemo_rl/algorithms/grpo.py,
the step's `metrics` after aggregation, `timing_metrics`, `val_metrics`).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.monitor import REPO_ROOT
from tests.support.stored_runs import keys_of, run_named, stored
from trainer_hooks.integrations.nemo_rl import KeelLogger, attach


class Logger:
    """nemo_rl/utils/logger.py Logger: the fan-out over `self.loggers`."""

    def __init__(self, cfg: Mapping[str, Any]):
        self.loggers: list[Any] = []
        self.base_log_dir = cfg["log_dir"]

    def log_metrics(
        self,
        metrics: dict[str, Any],
        step: int,
        prefix: str | None = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        for logger in self.loggers:
            logger.log_metrics(metrics, step, prefix, step_metric, step_finished)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            logger.log_hyperparams(params)

    def finish(self) -> None:
        """Flush and close backends that need explicit teardown (e.g. wandb)."""
        for logger in self.loggers:
            finish = getattr(logger, "finish", None)
            if callable(finish):
                finish()


MASTER_CONFIG = {
    "grpo": {"num_prompts_per_step": 32, "num_generations_per_prompt": 16},
    "loss_fn": {"reference_policy_kl_type": "k3"},
    "logger": {"log_dir": "logs/exp_001", "wandb_enabled": True, "wandb": {"project": "grpo-dev", "name": "qwen-math"}},
}


def train_metrics(step: int) -> dict[str, Any]:
    """grpo_train's `metrics` for one step, after its aggregation loop (sums and means)."""
    return {
        "loss": 0.02 * step,
        "grad_norm": 0.75,
        "reward": 0.25 * step,
        "gen_kl_error": math.inf if step == 2 else 0.001 * step,
        "token_mult_prob_error": 1.01,
        "sampling_importance_ratio": 1.0,
        "probs_ratio_max": 3.5,
        "lr": 1e-6,
        "global_valid_toks": 40960.0,
        "advantages/mean": np.float32(0.0),
        "generation_logger_metrics": {"pending_requests": [1, 2]},  # a dict: not a metric
    }


def test_grpo_train_logs_reach_keel_under_keel_names(url: str) -> None:
    logger = Logger(MASTER_CONFIG["logger"])
    keel = attach(logger, MASTER_CONFIG)
    assert logger.loggers == [keel]
    for step in (1, 2, 3):  # grpo_train logs at total_steps + 1
        logger.log_metrics(train_metrics(step), step, prefix="train")
        logger.log_metrics({"generation": 6.0, "total_step_time": 20.0}, step, prefix="timing/train", step_finished=True)
    logger.log_metrics({"accuracy": 0.6}, 3, prefix="validation")
    # RayGpuMonitorLogger.flush passes its step both ways; LoggerInterface says the
    # step_metric field is the step "instead of the provided step value"
    logger.log_metrics({"node.0.gpu.0.util": 0.9, "ray/ray_step": 2}, step=0, prefix="ray", step_metric="ray/ray_step")
    logger.finish()

    run = run_named(url, "qwen-math")
    assert (run["project"], run["status"]) == ("grpo-dev", "finished")
    assert run["config"]["loss_fn"] == {"reference_policy_kl_type": "k3"}
    kl = stored(url, run["id"], "mismatch/kl")
    assert kl[1] == 0.001 and math.isinf(kl[2]) and kl[3] == 0.003
    assert stored(url, run["id"], "reward/mean") == {1: 0.25, 2: 0.5, 3: 0.75}
    assert stored(url, run["id"], "loss/total") == {1: 0.02, 2: 0.04, 3: 0.06}
    assert stored(url, run["id"], "nemo-rl/train/grad_norm") == {1: 0.75, 2: 0.75, 3: 0.75}
    assert stored(url, run["id"], "nemo-rl/train/token_mult_prob_error") == {1: 1.01, 2: 1.01, 3: 1.01}
    assert stored(url, run["id"], "nemo-rl/timing/train/total_step_time") == {1: 20.0, 2: 20.0, 3: 20.0}
    assert stored(url, run["id"], "nemo-rl/validation/accuracy") == {3: 0.6}
    assert stored(url, run["id"], "nemo-rl/ray/node.0.gpu.0.util") == {2: 0.9}
    keys = keys_of(url, run["id"])
    assert not {"nemo-rl/ray/ray_step", "nemo-rl/train/generation_logger_metrics"} & keys
    assert keel.skipped == 3  # generation_logger_metrics, each step


def test_a_run_script_that_dies_leaves_a_failed_run(url: str, tmp_path: Path) -> None:
    """run_grpo.py never calls logger.finish(): the process's exit says how the run ended."""
    script = textwrap.dedent(
        """
        from tests.trainer_hooks.integrations.test_nemo_rl import Logger, MASTER_CONFIG, train_metrics
        from trainer_hooks.integrations.nemo_rl import attach

        logger = Logger(MASTER_CONFIG["logger"])
        attach(logger, {**MASTER_CONFIG, "logger": {"wandb": {"name": "dies"}}})
        logger.log_metrics(train_metrics(1), 1, prefix="train")
        raise RuntimeError("vLLM engine died")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert "vLLM engine died" in result.stderr
    run = run_named(url, "dies")
    assert run["status"] == "failed"
    assert stored(url, run["id"], "mismatch/kl") == {1: 0.001}


def test_from_config_takes_a_dict_and_names_a_default_run(url: str) -> None:
    keel = KeelLogger.from_config({"grpo": {}})
    keel.log_metrics({"reward": 1.0}, 7, prefix="train")
    keel.finish()
    run = run_named(url, "nemo-rl")
    assert stored(url, run["id"], "reward/mean") == {7: 1.0}

"""Keel as a NeMo-RL logger backend (docs/integrations/nemo-rl.md).

    from trainer_hooks.integrations.nemo_rl import attach
    (policy, ..., logger, checkpointer, grpo_state, master_config, ...) = setup(...)
    attach(logger, master_config)

NeMo-RL (0.6.0, commit 7ea279abfbeb698b092856d0dab61e7cf39bc909) logs through
`nemo_rl.utils.logger.Logger`: `Logger.__init__` builds one `LoggerInterface` backend per
enabled setting (wandb, swanlab, tensorboard, mlflow) into its `loggers` list, and
`Logger.log_metrics(metrics, step, prefix, step_metric, step_finished)`,
`log_hyperparams`, `log_histogram`, `log_plot` and `finish` call every backend in that list.
The algorithms' `setup` (e.g. nemo_rl/algorithms/grpo.py `setup`) builds the Logger and
returns it to the run script (examples/run_grpo.py), which hands it to the training loop
(`grpo_train`, `async_grpo_train`), so a backend appended to `logger.loggers` in the run
script receives every metric the loop logs.

Names are as NeMo-RL's wandb backend stores them (`<prefix>/<name>`: `train/gen_kl_error`),
converted with names.py's NeMo-RL map. With `step_metric` (the GPU monitor's
`ray/ray_step`), the step is that value, as in wandb. grpo_train never calls
`Logger.finish()`, so the run is finished at process exit, or failed when the run script
dies of an exception (the Monitor's exit hook).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainer_hooks.integrations.common import converter, log_converted, server_url
from trainer_hooks.monitor import Monitor

__all__ = ["TESTED_NEMO_RL_VERSIONS", "KeelLogger", "attach"]

TESTED_NEMO_RL_VERSIONS = ("0.6.0",)
"""NeMo-RL versions whose Logger interface this module was written against."""

_convert = converter("nemo-rl")


class KeelLogger:
    """NeMo-RL's `LoggerInterface` (`log_metrics`, `log_hyperparams`, `log_histogram`,
    `log_plot`) and `finish`, over one Keel Monitor. Histograms and plots are not stored."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.skipped = 0
        """Values left out so far because they were not numbers."""

    @classmethod
    def from_config(cls, master_config: Any) -> KeelLogger:
        """The backend for a run's `master_config` (NeMo-RL's pydantic MasterConfig, or its
        dict): the run is named after `logger.wandb.name`, in `logger.wandb.project`."""
        config = master_config.model_dump() if hasattr(master_config, "model_dump") else dict(master_config)
        wandb = (config.get("logger") or {}).get("wandb") or {}
        monitor = Monitor(
            server_url(),
            run_name=wandb.get("name") or "nemo-rl",
            project=wandb.get("project") or "default",
            config=config,
        )
        return cls(monitor)

    def log_metrics(
        self,
        metrics: Mapping[str, Any],
        step: int,
        prefix: str | None = "",
        step_metric: str | None = None,
        step_finished: bool = False,
    ) -> None:
        """Stream `metrics` under Keel's names. Never raises."""
        if step_metric and step_metric in metrics:
            step = metrics[step_metric]
        named = {
            f"{prefix}/{name}" if prefix else name: value
            for name, value in metrics.items()
            if name != step_metric
        }
        self.skipped = log_converted(self.monitor, step, named, _convert, "NeMo-RL", self.skipped)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """The run's config is `master_config`, stored when the run starts."""

    def log_histogram(self, histogram: list[Any], step: int, name: str) -> None:
        """Not stored."""

    def log_plot(self, figure: Any, step: int, name: str) -> None:
        """Not stored."""

    def finish(self) -> None:
        """`Logger.finish()`: the run is finished."""
        self.monitor.finish("finished")


def attach(logger: Any, master_config: Any) -> KeelLogger:
    """Add a KeelLogger to NeMo-RL's `logger` (what `setup` returned); returns it."""
    keel = KeelLogger.from_config(master_config)
    logger.loggers.append(keel)
    return keel

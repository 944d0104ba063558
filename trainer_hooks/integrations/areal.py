"""Keel for AReaL's trainers, through their stats logger (docs/integrations/areal.md).

    from trainer_hooks.integrations.areal import attach
    with PPOTrainer(config, train_dataset=..., valid_dataset=...) as trainer:
        attach(trainer)
        trainer.train(workflow=..., workflow_kwargs=...)

AReaL (1.0.4, commit 4aef98d8d818af55b43621aaadba047ae10f4e77) has no logger registry:
`PPOTrainer.__init__` (areal/trainer/rl_trainer.py) builds one `StatsLogger`
(areal/utils/stats_logger.py) with its backends fixed (wandb, swanlab, trackio,
TensorBoard) and keeps it as `trainer.stats_logger`; every step
`_export_and_commit_stats` calls `stats_logger.commit(epoch, epoch_step, global_step,
stats)`, `close()` calls `stats_logger.close()`, and the recover handler uses its
`state_dict()` / `load_state_dict()`. `attach(trainer)` puts a `KeelStatsLogger` in that
attribute: it passes every call on to the StatsLogger it replaces, and streams each commit
at the step AReaL's own backends use (`max(global_step, last committed + 1)`, one more per
dict of a list), without the `__count` keys StatsLogger leaves out too.

`PPOTrainer.__exit__` calls `close()` whether or not training raised, so `attach` also
wraps this trainer's `train`: an exception marks the run failed before it propagates.
The run is named after `stats_logger.wandb.name` (else the trial name), in project
`stats_logger.wandb.project` (else the experiment name), group as AReaL's wandb group; the
config is the experiment's, without the backends' API keys. The server is $KEEL_URL, the token
$KEEL_TOKEN. Only rank 0 streams (the Monitor's rule, StatsLogger's too).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from trainer_hooks.integrations.common import converter, log_converted, server_url
from trainer_hooks.monitor import Monitor

__all__ = ["TESTED_AREAL_VERSIONS", "KeelStatsLogger", "attach"]

TESTED_AREAL_VERSIONS = ("1.0.4",)
"""AReaL versions whose StatsLogger interface this module was written against."""


def _count(name: str, value: Any) -> bool:
    """StatsLogger leaves out the `x__count` beside each scalar `x` (not a metric)."""
    return name.endswith("__count")


_convert = converter("areal", left_out=_count)


class KeelStatsLogger:
    """AReaL's `StatsLogger` interface (`commit`, `close`, `state_dict`,
    `load_state_dict`) over one Keel Monitor, passing each call on to `inner` first."""

    def __init__(self, monitor: Monitor, inner: Any = None) -> None:
        self.monitor = monitor
        self.inner = inner
        self.skipped = 0
        """Values left out so far because they were not numbers."""
        state = inner.state_dict() if inner is not None else {}
        self._last_commit_step = int(state.get("last_commit_step", -1))

    @classmethod
    def from_config(cls, config: Any, inner: Any = None) -> KeelStatsLogger:
        """The logger for an AReaL experiment `config` (a BaseExperimentConfig dataclass)."""
        plain = dataclasses.asdict(config) if dataclasses.is_dataclass(config) and not isinstance(config, type) else dict(config)
        stats = plain.get("stats_logger") or {}
        for backend in stats.values():  # wandb_api_key, swanlab's api_key: secrets, never stored
            if isinstance(backend, dict):
                for key in [key for key in backend if "api_key" in key]:
                    del backend[key]
        wandb = stats.get("wandb") or {}
        experiment, trial = stats.get("experiment_name"), stats.get("trial_name")
        monitor = Monitor(
            server_url(),
            run_name=wandb.get("name") or trial or "areal",
            project=wandb.get("project") or experiment or "default",
            group=wandb.get("group") or (f"{experiment}_{trial}" if experiment and trial else None),
            tags=wandb.get("tags") or (),
            config=plain,
        )
        return cls(monitor, inner)

    def commit(self, epoch: int, step: int, global_step: int, data: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        if self.inner is not None:
            self.inner.commit(epoch, step, global_step, data)
        items = [data] if isinstance(data, Mapping) else list(data)
        log_step = max(global_step, self._last_commit_step + 1)
        for i, item in enumerate(items):
            self.skipped = log_converted(self.monitor, log_step + i, item, _convert, "AReaL", self.skipped)
        self._last_commit_step = log_step + len(items) - 1

    def state_dict(self) -> dict[str, Any]:
        if self.inner is not None:
            return dict(self.inner.state_dict())
        return {"last_commit_step": self._last_commit_step}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if self.inner is not None:
            self.inner.load_state_dict(state_dict)
        self._last_commit_step = int(state_dict["last_commit_step"])

    def close(self) -> None:
        """AReaL calls this when the trainer closes: the run is finished (unless `train`
        raised first)."""
        try:
            if self.inner is not None:
                self.inner.close()
        finally:
            self.monitor.finish("finished")

    def fail(self, exc: BaseException) -> None:
        """Training raised `exc`: the run is failed (killed for a KeyboardInterrupt)."""
        self.monitor.__exit__(type(exc), exc, exc.__traceback__)

    def __getattr__(self, name: str) -> Any:  # print_stats, get_log_path, config, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)


def attach(trainer: Any) -> KeelStatsLogger:
    """Stream `trainer` (an AReaL PPOTrainer, or any trainer with `config`, `stats_logger`
    and `train`) to Keel; returns the KeelStatsLogger now in `trainer.stats_logger`."""
    keel = KeelStatsLogger.from_config(trainer.config, inner=trainer.stats_logger)
    trainer.stats_logger = keel
    train = trainer.train

    @functools.wraps(train)
    def keel_train(*args: Any, **kwargs: Any) -> Any:
        try:
            return train(*args, **kwargs)
        except BaseException as exc:
            keel.fail(exc)
            raise

    trainer.train = keel_train
    return keel

"""Keel for OpenRLHF's Ray PPO trainers (docs/integrations/openrlhf.md).

    ray job submit --runtime-env-json='{"worker_process_setup_hook":
        "trainer_hooks.integrations.openrlhf.install", "env_vars": {"KEEL_URL": "http://keel:8750"}}'
        -- python -m openrlhf.cli.train_ppo_ray ...

OpenRLHF has no tracker registry: `BasePPOTrainer.__init__` (openrlhf/trainer/ppo_trainer.py)
builds a `WandbLogger` and a `TensorboardLogger` (openrlhf/utils/logging_utils.py), each
with `log_train(global_step, logs_dict)`, `log_eval(global_step, logs_dict)` and
`close()`, and the trainer calls exactly those two slots. `install()` puts a `KeelLogger`
in the tensorboard slot (it passes everything on to the TensorboardLogger it replaces)
and marks the run failed when the trainer's `fit` raises.

The trainer is a Ray actor, so `install()` must run in the actor's process: Ray's
`worker_process_setup_hook` runs it in every worker of the job (Ray merges the job's
runtime env with the one train_ppo_ray passes to ray.init). The server is $KEEL_URL
(default http://127.0.0.1:8750), the token $KEEL_TOKEN; the run is named after
`--logger.wandb.run_name`, in `--logger.wandb.project` / `.group`.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from trainer_hooks.integrations.common import convert_metrics, log_converted, server_url
from trainer_hooks.integrations.names import MAPS
from trainer_hooks.monitor import Monitor

__all__ = [
    "OPENRLHF_TO_KEEL",
    "TESTED_OPENRLHF_VERSIONS",
    "KeelLogger",
    "install",
    "keel_metrics",
]

logger = logging.getLogger("keel")

TESTED_OPENRLHF_VERSIONS = ("0.11.2",)
"""OpenRLHF releases whose source the names and `install()` were written against."""

OPENRLHF_TO_KEEL: dict[str, str] = MAPS["openrlhf"].to_keel(native=True)
"""OpenRLHF train-log names that mean what a Keel name means. Any other name `x` is stored
as `openrlhf/x`; eval logs `eval_x` (or `x`) as `eval/x`. `rollout/reward_std` is a sample
std (Keel's `reward/std` is the population's), so it stays `openrlhf/rollout/reward_std`."""

# train_step adds [decoded text, reward] of one sample every step: not a metric, no warning.
_NOT_METRICS = frozenset({"generated_samples"})


def keel_metrics(
    logs: Mapping[str, Any], *, evaluation: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """One OpenRLHF logs dict under Keel's names, and the keys left out as not numbers.

    None values (OpenRLHF's own loggers skip them) and `generated_samples` are left out
    silently; NaN and Inf are kept; single-element torch tensors are passed on as they are.
    """
    return convert_metrics(logs, _eval_name if evaluation else _train_name, _not_a_metric)


def _train_name(name: str) -> str:
    return OPENRLHF_TO_KEEL.get(name, f"openrlhf/{name}")


def _eval_name(name: str) -> str:
    return "eval/" + name.removeprefix("eval_")


def _not_a_metric(name: str, value: Any) -> bool:
    return value is None or name in _NOT_METRICS


class KeelLogger:
    """OpenRLHF's tracker interface (`log_train`, `log_eval`, `close`) over one Monitor.

    Args:
        monitor: where the run goes.
        inner: the tracker whose slot this one takes; it gets every call first.
    """

    def __init__(self, monitor: Monitor, inner: Any = None) -> None:
        self.monitor = monitor
        self.inner = inner
        self.skipped = 0
        """Values left out so far because they were not numbers."""

    @classmethod
    def from_args(cls, args: Any, inner: Any = None) -> KeelLogger:
        """The logger for an OpenRLHF trainer's `args` (hierarchized argparse namespace)."""
        wandb = args.logger.wandb
        config = _plain(args)
        config.get("logger", {}).get("wandb", {}).pop("key", None)  # an API key: never stored
        monitor = Monitor(
            server_url(),
            run_name=wandb.run_name or "openrlhf",
            project=wandb.project or "default",
            group=wandb.group,
            config={**config, "openrlhf/version": _openrlhf_version()},
        )
        return cls(monitor, inner)

    def log_train(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        if self.inner is not None:
            self.inner.log_train(global_step, logs_dict)
        self._log(global_step, logs_dict, evaluation=False)

    def log_eval(self, global_step: int, logs_dict: Mapping[str, Any]) -> None:
        if self.inner is not None:
            self.inner.log_eval(global_step, logs_dict)
        self._log(global_step, logs_dict, evaluation=True)

    def close(self) -> None:
        """OpenRLHF calls this when fit() ends normally: the run is finished."""
        try:
            if self.inner is not None:
                self.inner.close()
        finally:
            self.monitor.finish("finished")

    def fail(self, exc: BaseException) -> None:
        """fit() raised `exc`: the run is failed (killed for a KeyboardInterrupt)."""
        self.monitor.__exit__(type(exc), exc, exc.__traceback__)

    def _log(self, step: int, logs: Mapping[str, Any], *, evaluation: bool) -> None:
        def convert(logs: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
            return keel_metrics(logs, evaluation=evaluation)

        self.skipped = log_converted(self.monitor, step, logs, convert, "OpenRLHF", self.skipped)


def _plain(value: Any) -> Any:
    """args (nested SimpleNamespace) as JSON-able dicts."""
    if isinstance(value, SimpleNamespace):
        value = vars(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _openrlhf_version() -> str | None:
    openrlhf = sys.modules.get("openrlhf")
    return getattr(openrlhf, "__version__", None)


def _wrap_fit(trainer_cls: Any) -> None:
    """Mark the run failed when `trainer_cls.fit` raises (once per class)."""
    fit = trainer_cls.fit
    if getattr(fit, "_keel", False):
        return

    @functools.wraps(fit)
    def keel_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fit(self, *args, **kwargs)
        except BaseException as exc:
            keel = self.tensorboard_logger
            if isinstance(keel, KeelLogger):
                keel.fail(exc)
            raise

    keel_fit._keel = True  # type: ignore[attr-defined]
    trainer_cls.fit = keel_fit


def install() -> None:
    """Give every OpenRLHF PPO trainer built in this process a KeelLogger. Never raises.

    Ray's `worker_process_setup_hook` runs this in every worker (vLLM engines, model
    actors too); only the trainer actor builds a BasePPOTrainer, so only it streams.
    """
    try:
        from openrlhf.trainer.ppo_trainer import BasePPOTrainer
    except Exception as exc:  # a worker that cannot import the trainer never builds one
        logger.debug("keel: OpenRLHF trainer not importable here: %r", exc)
        return
    if getattr(BasePPOTrainer, "_keel_installed", False):
        return
    original_init = BasePPOTrainer.__init__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.tensorboard_logger = KeelLogger.from_args(self.args, inner=self.tensorboard_logger)
        _wrap_fit(type(self))

    BasePPOTrainer.__init__ = __init__
    BasePPOTrainer._keel_installed = True

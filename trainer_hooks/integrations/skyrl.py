"""Keel for SkyRL's trainers, through their tracker (docs/integrations/skyrl.md).

    from skyrl.train.entrypoints.main_base import BasePPOExp
    from trainer_hooks.integrations.skyrl import KeelTracking

    class Exp(BasePPOExp):
        def get_tracker(self):
            return KeelTracking.wrap(super().get_tracker(), self.cfg)

SkyRL (0.3.0, commit a9564572eb8e91076be43c1bd5e4615e3de17265) logs through one
`Tracking` object (skyrl/train/utils/tracking.py) with a single backend (`trainer.logger`:
wandb, mlflow, swanlab, tensorboard or console). `BasePPOExp.get_tracker()`
(skyrl/train/entrypoints/main_base.py) builds it, and is the documented hook to override;
`RayPPOTrainer` (skyrl/train/trainer.py) and the fully async trainer call
`tracker.log(data, step, commit)` for every metrics dict, `tracker.finish()` when training
ends, and `BasePPOExp.run` calls `tracker.log_exception(e, step)` before it re-raises.
`KeelTracking` takes that object's place and passes every call on to it: the backend you
chose logs as before, and Keel gets the same dicts at the same steps, under Keel's names
(names.py's SkyRL map), finished or failed as the trainer ended.

The run is named after `trainer.run_name`, in project `trainer.project_name`, with
`trainer.tags`; its config is SkyRL's whole config. The server is $KEEL_URL, the token
$KEEL_TOKEN. The trainer runs in a Ray task, so keel-rl must be installed where it runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainer_hooks.integrations.common import converter, log_converted, server_url
from trainer_hooks.monitor import Monitor

__all__ = ["TESTED_SKYRL_VERSIONS", "KeelTracking"]

TESTED_SKYRL_VERSIONS = ("0.3.0",)
"""SkyRL versions whose Tracking class this module was tested with."""

_convert = converter("skyrl")


class KeelTracking:
    """SkyRL's `Tracking` interface (`log`, `finish`, `log_exception`, and the rest passed
    on) over one Keel Monitor; `inner` is the Tracking it replaces, called first."""

    def __init__(self, monitor: Monitor, inner: Any = None) -> None:
        self.monitor = monitor
        self.inner = inner
        self.skipped = 0
        """Values left out so far because they were not numbers."""

    @classmethod
    def wrap(cls, inner: Any, cfg: Any) -> KeelTracking:
        """Keel beside `inner` (what `BasePPOExp.get_tracker()` built) for SkyRL config `cfg`."""
        config = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type) else dict(cfg)
        trainer = config.get("trainer") or {}
        monitor = Monitor(
            server_url(),
            run_name=trainer.get("run_name") or "skyrl",
            project=trainer.get("project_name") or "default",
            tags=trainer.get("tags") or (),
            config=config,
        )
        return cls(monitor, inner)

    def log(self, data: Mapping[str, Any], step: int, commit: bool = False) -> None:
        """SkyRL's `Tracking.log`; several calls for one step add up to one row."""
        if self.inner is not None:
            self.inner.log(data, step, commit=commit)
        self.skipped = log_converted(self.monitor, step, data, _convert, "SkyRL", self.skipped)

    def finish(self) -> None:
        """Training ended: the run is finished (once)."""
        try:
            if self.inner is not None:
                self.inner.finish()
        finally:
            self.monitor.finish("finished")

    def log_exception(self, e: BaseException, step: int = 0) -> None:
        """`BasePPOExp.run` saw `e`: the run is failed (killed for a KeyboardInterrupt)."""
        try:
            if self.inner is not None:
                self.inner.log_exception(e, step=step)
        finally:
            self.monitor.__exit__(type(e), e, e.__traceback__)

    def __getattr__(self, name: str) -> Any:  # backend, log_samples_to_table, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

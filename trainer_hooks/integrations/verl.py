"""Keel as a tracking backend of verl (docs/integrations/verl.md).

    trainer.logger='[console,keel]' +trainer.keel.server_url=http://keel-host:8750

verl's `Tracking` (verl/utils/tracking.py) builds the backends named in `trainer.logger`
from a fixed list. `register()` adds "keel" to it: `Tracking.supported_backend` gains
"keel", `Tracking.__init__` builds a `KeelBackend` when "keel" is among the backends, and
`Tracking.finish(exit_code)` finishes it, failed when the exit code is not 0 (verl's
TaskRunner passes 1 when training raised). `Tracking.log(data, step)` already hands every
dict to every backend it built.

verl builds `Tracking` inside the Ray actor that runs the trainer, not in the launching
process, so `register()` has to run there. verl's own plugin mechanism does that: at
`import verl`, in every process, verl imports the `verl.plugins` entry points and the
modules in $VERL_USE_EXTERNAL_MODULES. This module is such a plugin: importing it while
verl is being imported (or after) registers the backend. Imported without verl, it
touches nothing.

The trainer's config is stored with the run; `trainer.keel` holds the Monitor's arguments
(server_url, project, group, tags, run_name, spool_dir; the token is better left to
$KEEL_TOKEN), and the server defaults to $KEEL_URL, then http://127.0.0.1:8750.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
from collections.abc import Mapping
from typing import Any

from trainer_hooks.integrations.common import convert_metrics, log_converted, server_url
from trainer_hooks.integrations.names import MAPS
from trainer_hooks.monitor import Monitor

__all__ = [
    "BACKEND",
    "TESTED_VERL_VERSIONS",
    "VERL_TO_KEEL",
    "KeelBackend",
    "keel_metrics",
    "register",
]

logger = logging.getLogger("keel")

BACKEND = "keel"
"""The name to put in verl's `trainer.logger` list."""

TESTED_VERL_VERSIONS = ("0.9.1",)
"""verl releases whose Tracking class `register()` was tested against."""

VERL_TO_KEEL: dict[str, str] = MAPS["verl"].to_keel(native=True)
"""verl metric names that mean what a Keel name means, from the shared maps
(trainer_hooks/integrations/names.py, where each entry cites verl's source and says what the
number is, and `not_mapped` says why `rollout_corr/rollout_is_max` and the like are left out).
Any other name `x` is stored as `verl/x`."""


def keel_metrics(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """One verl metrics dict under Keel's names, and the keys left out as not numbers.

    Floats, ints and NumPy scalars become floats (NaN and Inf kept); single-element torch
    tensors are passed on as they are (the Monitor copies them without a sync). Bools,
    strings, lists and None are not metrics.
    """
    return convert_metrics(data, _keel_name)


def _keel_name(name: str) -> str:
    return VERL_TO_KEEL.get(name, f"verl/{name}")


class KeelBackend:
    """A verl tracking backend (`log(data, step)`, `finish()`) that feeds one Monitor."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.skipped = 0
        """Values left out so far because they were not numbers."""

    @classmethod
    def from_verl(
        cls, project_name: str, experiment_name: str, config: Mapping[str, Any] | None
    ) -> KeelBackend:
        """The backend for `Tracking(project_name, experiment_name, ..., config)`."""
        config = dict(config or {})
        trainer = dict(config.get("trainer") or {})
        settings = dict(trainer.get("keel") or {})
        url = settings.pop("server_url", None) or server_url()
        if "token" in settings:  # the run's config is readable by anyone with read access
            trainer["keel"] = {k: v for k, v in settings.items() if k != "token"}
            config["trainer"] = trainer
        settings.setdefault("run_name", experiment_name)
        settings.setdefault("project", project_name)
        monitor = Monitor(
            url,
            config={**config, "verl/version": _verl_version()},
            **settings,
        )
        return cls(monitor)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        """Stream `data` (verl's metrics of `step`) under Keel's names. Never raises."""
        self.skipped = log_converted(self.monitor, step, data, keel_metrics, "verl", self.skipped)

    def finish(self, status: str = "finished") -> None:
        """Flush and mark the run `status` (once; later calls do nothing)."""
        self.monitor.finish(status)


def _verl_version() -> str | None:
    verl = sys.modules.get("verl")
    return getattr(verl, "__version__", None)


def register() -> None:
    """Teach verl's `Tracking` the "keel" backend. Idempotent; imports verl.utils.tracking."""
    from verl.utils.tracking import Tracking

    if getattr(Tracking, "_keel_registered", False):
        return
    if BACKEND not in Tracking.supported_backend:
        Tracking.supported_backend.append(BACKEND)
    original_init = Tracking.__init__
    original_finish = Tracking.finish
    init_signature = inspect.signature(original_init)

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        bound = init_signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        backends = bound.arguments["default_backend"]
        if BACKEND in ([backends] if isinstance(backends, str) else backends):
            self.logger[BACKEND] = KeelBackend.from_verl(
                bound.arguments["project_name"],
                bound.arguments["experiment_name"],
                bound.arguments["config"],
            )

    @functools.wraps(original_finish)
    def finish(self: Any, exit_code: int = 0, *args: Any, **kwargs: Any) -> None:
        # Tracking.__del__ calls finish() too; KeelBackend.finish only acts once.
        backend = getattr(self, "logger", {}).get(BACKEND)
        try:
            original_finish(self, exit_code, *args, **kwargs)
        finally:
            if backend is not None:
                backend.finish("finished" if exit_code == 0 else "failed")

    Tracking.__init__ = __init__  # type: ignore[method-assign]
    Tracking.finish = finish  # type: ignore[method-assign]
    Tracking._keel_registered = True  # type: ignore[attr-defined]


# verl's plugin convention: `import verl` imports its plugins, and a plugin registers
# itself on import. verl (being) imported is the sign that this import is that one.
if "verl" in sys.modules:
    try:
        register()
    except Exception as exc:  # verl's plugin loader would hide it at debug level
        logger.warning("keel: could not register the verl backend: %r", exc)

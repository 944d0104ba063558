"""Keel as a prime-rl monitor (docs/integrations/prime-rl.md).

    from prime_rl.entrypoints.trainer import main   # or .orchestrator, .sft, ...
    from trainer_hooks.integrations.primerl import run
    run(main)

prime-rl (0.8.0, commit 559b44772e471d1538537b8805cc77f3824a5e64) logs through
`prime_rl.monitors` (src/prime_rl/monitors/__init__.py): `setup(wandb=, prime=, file=, *,
output_dir, run_config, ...)` builds one `Monitor` (src/prime_rl/monitors/base.py) per
configured backend into the module's `MONITORS` list, on rank 0 only, and the module-level
`log(data, step)` and `finalize()` fan out to every monitor in that list, catching their
errors. The trainer (src/prime_rl/trainer/rl/train.py `train`) and the orchestrator
(src/prime_rl/orchestrator/orchestrator.py `Orchestrator.start`) each call `setup` once
and `log` once per metrics dict, each dict carrying its step as `"step"`.

prime-rl builds its monitors from its own config only; there is no setting that loads one
from elsewhere. `install()` wraps `prime_rl.monitors.setup` so that, after it, a
`KeelMonitor` joins `MONITORS`; `run(main)` installs, runs a prime-rl entry point and marks
the process's Keel run failed when it raises or exits non-zero (prime-rl's `clean_exit`,
src/prime_rl/utils/utils.py, turns an exception into `sys.exit(1)`).

Each process is its own Keel run, `<name>-<component>` in group `<name>` (the name is
`monitors.wandb.name`, else $PRL_RUN_NAME, else the output directory's name), as prime-rl's
offline wandb runs are. The server is $KEEL_URL, the token $KEEL_TOKEN.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainer_hooks.integrations.common import converter, log_converted, server_url
from trainer_hooks.monitor import Monitor

__all__ = ["TESTED_PRIME_RL_VERSIONS", "KeelMonitor", "install", "run"]

logger = logging.getLogger("keel")

TESTED_PRIME_RL_VERSIONS = ("0.8.0",)
"""prime-rl versions whose monitor interface this module was written against."""

_convert = converter("prime-rl")
_LIVE: list[KeelMonitor] = []
"""The KeelMonitors `install()` made in this process (`run` fails them on an exception)."""


class KeelMonitor:
    """prime-rl's `Monitor` interface (`init`, `log`, `log_metrics`, `log_episodes`,
    `finalize`) over one Keel Monitor. Episodes are not metrics: they are left out."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self.skipped = 0
        """Values left out so far because they were not numbers."""

    @classmethod
    def from_prime_rl(cls, run_config: Any, output_dir: str | os.PathLike[str]) -> KeelMonitor:
        """The monitor for one prime-rl component (`run_config`: its pydantic config)."""
        component = type(run_config).__name__.removesuffix("Config").lower() or "run"
        wandb = getattr(getattr(run_config, "monitors", None), "wandb", None)
        name = (
            getattr(wandb, "name", None)
            or os.environ.get("PRL_RUN_NAME")
            or Path(output_dir).resolve().name
        )
        config = run_config.model_dump(mode="json") if hasattr(run_config, "model_dump") else {}
        monitor = Monitor(
            server_url(),
            run_name=f"{name}-{component}",
            project=getattr(wandb, "project", None) or "prime-rl",
            group=name,
            tags=getattr(wandb, "tags", None) or (),
            config={**config, "prime-rl/component": component},
        )
        return cls(monitor)

    async def init(self, **kwargs: Any) -> None:
        """prime-rl's `init`: the Keel run starts when the Monitor is made."""

    async def log(self, data: Any, step: int, kind: str = "train", subset: str = "effective") -> None:
        if isinstance(data, Mapping):
            await self.log_metrics(data, step)

    async def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Stream one metrics dict at `step` under Keel's names. Never raises."""
        self.skipped = log_converted(self.monitor, step, metrics, _convert, "prime-rl", self.skipped)

    async def log_episodes(self, episodes: Any, step: int, kind: str, subset: str) -> None:
        """Episodes (prompts, completions) are not stored."""

    async def finalize(self) -> None:
        """The orchestrator calls this after a clean exit: the run is finished."""
        await asyncio.to_thread(self.monitor.finish, "finished")


def _rank_zero() -> bool:
    """prime-rl's own test in `setup`: only rank 0 registers monitors."""
    return int(os.environ.get("RANK", os.environ.get("DP_RANK", "0"))) == 0


def install() -> None:
    """Make every `prime_rl.monitors.setup` of this process add a KeelMonitor. Idempotent."""
    from prime_rl import monitors

    if getattr(monitors, "_keel_installed", False):
        return
    setup = monitors.setup

    @functools.wraps(setup)
    async def keel_setup(*args: Any, **kwargs: Any) -> None:
        await setup(*args, **kwargs)
        if not _rank_zero():
            return
        try:
            keel = KeelMonitor.from_prime_rl(kwargs.get("run_config"), kwargs["output_dir"])
        except Exception as exc:  # Keel must never stop training
            logger.warning("keel: no Keel monitor for this prime-rl process: %r", exc)
            return
        _LIVE.append(keel)
        monitors.MONITORS.append(keel)

    monitors.setup = keel_setup
    monitors._keel_installed = True


def run(main: Callable[[], Any]) -> Any:
    """`install()`, then `main()` (a prime-rl entry point). If it raises, SystemExit(1)
    included, this process's Keel runs are marked failed (killed for Ctrl-C) first."""
    install()
    try:
        return main()
    except BaseException as exc:
        for keel in _LIVE:
            keel.monitor.__exit__(type(exc), exc, exc.__traceback__)
        raise

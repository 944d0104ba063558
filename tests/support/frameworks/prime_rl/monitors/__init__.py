# ruff: noqa: B027, ASYNC230  (copied as prime-rl has it)
"""Copied from prime-rl 0.8.0 (commit 559b44772e471d1538537b8805cc77f3824a5e64):
src/prime_rl/monitors/__init__.py (`MONITORS`, `setup`, `get`, `log`, `finalize`, verbatim
but for the W&B and Prime platform monitors, which are left out), src/prime_rl/monitors/base.py
(`Monitor`, verbatim) and src/prime_rl/monitors/file.py (`FileMonitor.init`/`log_metrics`,
with `sanitize` from src/prime_rl/utils/utils.py; episodes left out).
The loguru logger is the standard library's."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Literal, TextIO

Kind = Literal["train", "eval"]
Subset = Literal["all", "effective"]


def get_logger() -> logging.Logger:
    return logging.getLogger("prime_rl")


class Monitor(ABC):
    """Base class for monitors."""

    def __init__(self, config: Any):
        self.config = config
        self.logger = get_logger()

    async def init(self, **kwargs: Any) -> None:
        """Initialize run. Overrides name their own kwargs."""

    async def log(self, data: Any, step: int, kind: Kind = "train", subset: Subset = "effective") -> None:
        """Log scalar metrics, or episodes."""
        if isinstance(data, dict):
            await self.log_metrics(data, step=step)
        else:
            episodes = data if isinstance(data, list) else [data]
            await self.log_episodes(episodes, step=step, kind=kind, subset=subset)

    @abstractmethod
    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        """Log scalar metrics."""

    @abstractmethod
    async def log_episodes(self, episodes: list[Any], step: int, kind: Kind, subset: Subset) -> None:
        """Log episodes."""

    async def finalize(self) -> None:
        """Finalize run."""


def sanitize(obj: Any) -> tuple[Any, list[str]]:
    """Recursively drop non-finite floats (NaN/inf), which are not valid JSON.
    Returns the sanitized object and the dotted paths of the dropped values."""
    dropped_paths: list[str] = []

    def keep(item: Any, path: str) -> bool:
        if isinstance(item, float) and not math.isfinite(item):
            dropped_paths.append(path)
            return False
        return True

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, dict):
            return {
                key: walk(item, child)
                for key, item in value.items()
                if keep(item, child := f"{path}.{key}" if path else key)
            }
        if isinstance(value, list):
            return [walk(item, child) for index, item in enumerate(value) if keep(item, child := f"{path}[{index}]")]
        return value

    return walk(obj, ""), dropped_paths


class FileMonitor(Monitor):
    """Logs metrics and episodes to local JSONL files."""

    file: TextIO

    async def init(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.path = output_dir / self.config.path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Line-buffered append so a concurrently-running dashboard can tail the file.
        self.file = open(self.path, "a", buffering=1)  # noqa: SIM115

    async def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        sanitized, dropped = sanitize(metrics)
        row = {"step": step, "time": time.time(), **sanitized}
        self.file.write(json.dumps(row) + "\n")

    async def log_episodes(self, episodes: list[Any], step: int, kind: Kind, subset: Subset) -> None:
        pass


# All monitors registered for the current run.
MONITORS: list[Monitor] = []


async def setup(
    wandb: Any = None,
    prime: Any = None,
    file: Any = None,
    *,
    output_dir: Path,
    run_config: Any = None,
    train_env_names: list[str] | None = None,
    eval_env_names: list[str] | None = None,
    overview_flavor: Literal["rl", "sft"] = "rl",
) -> None:
    """Construct, initialize, and register one monitor per non-None config.

    Only rank 0 registers monitors — on other ranks the fan-out functions are
    no-ops. A monitor whose ``init`` raises crashes the run: a configured
    monitor must work.
    """
    assert not MONITORS, "Monitors already set up. Call `setup` only once per process."
    rank = int(os.environ.get("RANK", os.environ.get("DP_RANK", "0")))
    if rank != 0:
        return

    monitors: list[tuple[Monitor, dict[str, Any]]] = []
    if file is not None:
        monitors.append((FileMonitor(file), dict(output_dir=output_dir)))

    for monitor, init_kwargs in monitors:
        await monitor.init(**init_kwargs)
        MONITORS.append(monitor)


def get(monitor_cls: type[Monitor]) -> Monitor | None:
    """The registered monitor of the given type, None when it isn't running
    (not configured, or a non-zero rank)."""
    return next((monitor for monitor in MONITORS if isinstance(monitor, monitor_cls)), None)


async def log(data: Any, step: int, kind: Kind = "train", subset: Subset = "effective") -> None:
    """Log to all registered monitors: a dict of scalar metrics, or episodes
    with their cohort coordinates (train/eval x all/effective)."""
    for monitor in MONITORS:
        try:
            await monitor.log(data, step=step, kind=kind, subset=subset)
        except Exception as e:
            get_logger().warning(f"Failed to log to {monitor.__class__.__name__}: {e}")


async def finalize() -> None:
    """Finalize the run on all registered monitors."""
    for monitor in MONITORS:
        try:
            await monitor.finalize()
        except Exception as e:
            get_logger().warning(f"Failed to finalize {monitor.__class__.__name__}: {e}")

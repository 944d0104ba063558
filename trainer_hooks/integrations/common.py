"""What the logger-style integrations (verl, OpenRLHF, prime-rl, SkyRL, AReaL, NeMo-RL)
share: which values are metrics, Keel's names for a framework's metrics dict, and streaming
a converted dict to the Monitor."""

from __future__ import annotations

import logging
import numbers
import sys
from collections.abc import Callable, Mapping
from typing import Any

from trainer_hooks.integrations.names import MAPS
from trainer_hooks.monitor import Monitor
from wire.urls import DEFAULT_SERVER_URL, default_server

__all__ = [
    "DEFAULT_SERVER_URL",
    "as_metric",
    "convert_metrics",
    "converter",
    "log_converted",
    "server_url",
]

logger = logging.getLogger("keel")

Convert = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[str]]]
LeftOut = Callable[[str, Any], bool]


def server_url() -> str:
    """$KEEL_URL, else the local default (wire.urls.default_server)."""
    return default_server()


def as_metric(value: Any) -> Any | None:
    """A float (NaN and Inf kept) or a single-element torch tensor (passed on as it is: the
    Monitor copies it without a sync); None for what is not a metric (bools, strings, lists,
    None)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    torch = sys.modules.get("torch")  # a tensor here means torch is imported already
    if torch is not None and isinstance(value, torch.Tensor) and value.numel() == 1:
        return value
    return None


def convert_metrics(
    logs: Mapping[str, Any], keel_name: Callable[[str], str], left_out: LeftOut | None = None
) -> tuple[dict[str, Any], list[str]]:
    """A framework's metrics dict under Keel's names (`keel_name`), and the names left out as
    not numbers (`as_metric`). `left_out(name, value)`: what the framework logs beside its
    metrics and is no metric, left out without a word (a step column, a count, a None)."""
    out: dict[str, Any] = {}
    skipped: list[str] = []
    for name, value in logs.items():
        if left_out is not None and left_out(name, value):
            continue
        metric = as_metric(value)
        if metric is None:
            skipped.append(name)
        else:
            out[keel_name(name)] = metric
    return out, skipped


def converter(framework: str, *, left_out: LeftOut | None = None) -> Convert:
    """Keel's names for one of `framework`'s metrics dicts, by its map in names.py: a mapped
    name takes Keel's name, `eval/x` stays, any other `x` becomes `<prefix>/x`; the
    framework's step columns (`step_keys`) are not metrics, nor what `left_out` says
    (`convert_metrics`). Returns (metrics, names left out as not numbers)."""
    name_map = MAPS[framework]
    step_keys = frozenset(name_map.step_keys)

    def silent(name: str, value: Any) -> bool:
        return name in step_keys or (left_out is not None and left_out(name, value))

    def convert(logs: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        return convert_metrics(logs, name_map.keel_name, silent)

    return convert


def log_converted(
    monitor: Monitor, step: int, logs: Mapping[str, Any], convert: Convert, framework: str, skipped: int
) -> int:
    """`monitor.log(step, convert(logs))`, never raising; warns about values that are not
    numbers the first time; returns the count of such values so far (`skipped` before)."""
    try:
        metrics, left_out = convert(logs)
    except Exception as exc:  # a metric Keel cannot read must never stop training
        logger.warning("keel: %s logs of step %r dropped: %r", framework, step, exc)
        return skipped
    if left_out and not skipped:
        logger.warning(
            "keel: %s logged values that are not numbers (%s); they are left out",
            framework,
            ", ".join(left_out[:5]),
        )
    if metrics:
        monitor.log(step, metrics)
    return skipped + len(left_out)

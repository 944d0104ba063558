"""What the logger-style integrations (verl, OpenRLHF) share: which values are metrics,
and streaming a converted metrics dict to the Monitor."""

from __future__ import annotations

import logging
import numbers
import sys
from collections.abc import Callable, Mapping
from typing import Any

from trainer_hooks.monitor import Monitor

__all__ = ["as_metric", "log_converted"]

logger = logging.getLogger("keel")

Convert = Callable[[Mapping[str, Any]], tuple[dict[str, Any], list[str]]]


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

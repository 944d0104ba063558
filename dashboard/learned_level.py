"""The learned level of a run's entropy: the dashed line on the `policy/entropy` chart; and
its start, the dotted one.

It is the alert rule's own baseline, computed by the rule's detector itself (the default
rule "entropy running away" of server/alerts/catalog.py, a `Climb` with its parameters): the
median of log(entropy) over the last `warmup` values logged before `reward/mean` first rose
`after_gain` initial spreads above its start (`RewardGain`), or over the first `warmup` values
of a run that logs no reward. The line is that level as it was taken; the rule then lets it
follow an entropy that goes on sharpening (`adapt`), never one that rises. A run whose reward
never rose has no line: the level the rule takes anyway after `fallback` values is not a
learned one, and it is taken again if the reward rises later. Pure: the caller reads the
points (views/charts.py).

The start is the level the rule "entropy far above its start" measures from: the median of the
run's first `start` entropy values, values under its `floor` counted as the floor (an
`AboveStart` with the rule's parameters).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from server.alerts.catalog import DEFAULT_RULES, build_detector

__all__ = ["ENTROPY_KEY", "LEVEL_KEYS", "START_VALUES", "learned_level", "start_level"]

ENTROPY_KEY = "policy/entropy"
_RULE = next(rule for rule in DEFAULT_RULES if rule.name == "entropy running away")
_DETECTOR = build_detector(_RULE.detector, ENTROPY_KEY, {**_RULE.params, "fallback": 0})
LEVEL_KEYS = (ENTROPY_KEY, str(_DETECTOR.params["reward_key"]), str(_DETECTOR.params["reward_std_key"]))
"""What the level is computed from: the entropy, the reward and its per-sample spread."""


_START_RULE = next(rule for rule in DEFAULT_RULES if rule.name == "entropy far above its start")
_START = build_detector(_START_RULE.detector, ENTROPY_KEY, _START_RULE.params)
START_VALUES = int(_START.params["start"])
"""How many of a run's first entropy values its start is taken from."""


def start_level(values: Iterable[float]) -> float | None:
    """The start of a run whose first entropy values (in step order) are `values`, once it has
    START_VALUES finite ones, else None."""
    state: dict[str, Any] = {}
    for step, value in enumerate(values):
        _START.update(state, step, {ENTROPY_KEY: value})
        if "level" in state:
            return float(state["level"])
    return None


def learned_level(state: dict[str, Any], rows: Iterable[tuple[int, Mapping[str, float]]]) -> float | None:
    """The learned level once `rows` ((step, values) in step order, continuing what `state`
    has seen) have settled it, else None (`state` then holds where the detector stands)."""
    for step, values in rows:
        if "median" in state:
            break
        _DETECTOR.update(state, step, values)
    return math.exp(state["median"]) if "median" in state else None

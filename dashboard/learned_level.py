"""The learned level of a run's entropy: the dashed line on the `policy/entropy` chart.

It is the alert rule's own baseline, computed by the rule's detector itself (the default
rule "entropy running away" of server/alerts/catalog.py, a `Climb` with its parameters): the
median of log(entropy) over the last `warmup` values logged before `reward/mean` first rose
`after_gain` initial spreads above its start (`RewardGain`), or over the first `warmup` values
of a run that logs no reward. The line is that level as it was taken; the rule then lets it
follow an entropy that goes on sharpening (`adapt`), never one that rises. A run whose reward
never rose has no line: the level the rule takes anyway after `fallback` values is not a
learned one, and it is taken again if the reward rises later. Pure: the caller reads the
points (views/charts.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from server.alerts.catalog import DEFAULT_RULES, build_detector

__all__ = ["ENTROPY_KEY", "LEVEL_KEYS", "learned_level"]

ENTROPY_KEY = "policy/entropy"
_RULE = next(rule for rule in DEFAULT_RULES if rule.name == "entropy running away")
_DETECTOR = build_detector(_RULE.detector, ENTROPY_KEY, {**_RULE.params, "fallback": 0})
LEVEL_KEYS = (ENTROPY_KEY, str(_DETECTOR.params["reward_key"]), str(_DETECTOR.params["reward_std_key"]))
"""What the level is computed from: the entropy, the reward and its per-sample spread."""


def learned_level(state: dict[str, Any], rows: Iterable[tuple[int, Mapping[str, float]]]) -> float | None:
    """The learned level once `rows` ((step, values) in step order, continuing what `state`
    has seen) have settled it, else None (`state` then holds where the detector stands)."""
    for step, values in rows:
        if "median" in state:
            break
        _DETECTOR.update(state, step, values)
    return math.exp(state["median"]) if "median" in state else None

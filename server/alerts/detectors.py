"""Detectors: pure, incremental, O(1) per point.

A detector is built from a rule's metric and parameters. Its state is a JSON
dict (persisted per rule and run, so evaluation survives restarts). `update`
takes the state and one step's values (every metric logged at that step) and
returns a Signal, or None when the step carries nothing it watches.
"""

from __future__ import annotations

import fnmatch
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["JOINED", "Signal", "Detector", "NonFinite", "Threshold", "AboveStart", "Climb", "CoClimb", "Jump", "Silent", "LogLevel", "RobustBaseline", "RewardGain", "watched"]

MAD_TO_SIGMA = 1.4826
MAX_PARAM_MAGNITUDE = 1e15
"""Largest |number| a parameter may be: far beyond any metric's scale, and a bound that
keeps arithmetic on it (logs, sums, formatting) finite."""
REWARD_ALPHA = 0.3
"""EWMA weight of the reward when a detector asks how much a run has learned (RewardGain)."""
MAX_WARMUP = 10_000
"""Values a climb baseline keeps while warming up; they are saved with the rule's state."""
JOINED = "joined"
"""Set by the engine in the state of a detector that starts on a run already evaluated (a rule
added or edited while the run streamed): it has not seen the run's first values."""


def bounded(x: float) -> float:
    """x within ±MAX_PARAM_MAGNITUDE: a finite value a mean or median over a few of them keeps
    finite (ten values of 1e308 overflow a sum, two a midpoint)."""
    return min(max(x, -MAX_PARAM_MAGNITUDE), MAX_PARAM_MAGNITUDE)


@dataclass(frozen=True)
class Signal:
    active: bool
    value: float
    """The watched metric's value at this step (what notifications report)."""
    message: str
    metric: str | None = None
    """The metric key(s) that triggered, comma-separated, when the rule watches a pattern."""


class Detector:
    kind: ClassVar[str]
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, metric: str, params: Mapping[str, Any] | None = None):
        self.metric = metric
        unknown = set(params or {}) - set(self.defaults)
        if unknown:
            raise ValueError(f"{self.kind}: unknown parameter(s) {sorted(unknown)}; known: {sorted(self.defaults)}")
        for name, value in (params or {}).items():
            _sane(name, value)
        self.params = {**self.defaults, **(params or {})}
        self.validate()

    def validate(self) -> None:
        """Raise ValueError for parameters that make no sense."""

    def initial_state(self) -> dict[str, Any]:
        return {}

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        raise NotImplementedError


def _sane(name: str, value: Any) -> None:
    """What every parameter must be, whatever its detector does with it: storable as JSON
    (finite; PostgreSQL refuses NaN and Infinity) and of a sane size."""
    if isinstance(value, (list, dict)):
        raise ValueError(f"parameter {name!r} must be a number, a string, a boolean or null")
    if isinstance(value, str) and "\x00" in value:
        raise ValueError(f"parameter {name!r} must not contain NUL (\\x00) characters")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"parameter {name!r} must be a finite number, got {value!r}")
        if abs(value) > MAX_PARAM_MAGNITUDE:
            raise ValueError(f"parameter {name!r} must be at most {MAX_PARAM_MAGNITUDE:g} in magnitude")


def _positive(params: dict[str, Any], *names: str) -> None:
    for name in names:
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"parameter {name!r} must be a positive number, got {value!r}")


class NonFinite(Detector):
    """Any NaN or ±Inf among the metrics matching the rule's comma-separated glob patterns."""

    kind = "non_finite"

    def validate(self) -> None:
        self.patterns = [p.strip() for p in self.metric.split(",") if p.strip()]
        self._watches: dict[str, bool] = {}  # key -> matched; runs log the same keys every step

    def _watched(self, key: str) -> bool:
        matched = self._watches.get(key)
        if matched is None:
            matched = self._watches[key] = any(fnmatch.fnmatchcase(key, p) for p in self.patterns)
        return matched

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        watched = {k: v for k, v in values.items() if self._watched(k)}
        if not watched:
            return None
        bad = sorted(k for k, v in watched.items() if not math.isfinite(v))
        if bad:
            message = f"non-finite {', '.join(f'{k}={watched[k]}' for k in bad)} at step {step}"
            return Signal(True, watched[bad[0]], message, metric=",".join(bad))
        return Signal(False, next(iter(watched.values())), "all finite")


class Threshold(Detector):
    """value > threshold (or < with op "<"); once active it clears only past `resolve_at`
    (hysteresis). With `window` > 1 the value is the mean of the metric's last `window` values,
    and nothing fires before there are that many: a share over a few samples a step (7 of 8
    answers, then 8 of 8) is judged over several steps. With `rise` (None: off) it fires only
    once the value has come at least that far from the lowest it had (the highest, with "<"):
    a run that went there, not one that started there. With either, a non-finite value is left
    out (the "non-finite value" rule reports it). With `reward_fall` (None: off) it fires only
    while the run's reward (`reward/mean`) has fallen too: the mean of its last REWARD_RECENT
    values at least `reward_fall`·|peak| below the highest such mean it had (a run that logs
    no reward is judged on the metric alone)."""

    kind = "threshold"
    defaults: ClassVar[dict[str, Any]] = {"op": ">", "threshold": 0.0, "resolve_at": None, "window": 1, "rise": None, "reward_fall": None}

    def validate(self) -> None:
        if self.params["op"] not in (">", "<"):
            raise ValueError("parameter 'op' must be '>' or '<'")
        for name in ("threshold", "resolve_at", "rise"):
            value = self.params[name]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"parameter {name!r} must be a number")
        if self.params["rise"] is not None and not self.params["rise"] > 0:
            raise ValueError("parameter 'rise' must be a number > 0 (or null: off)")
        fall = self.params["reward_fall"]
        if fall is not None and (isinstance(fall, bool) or not isinstance(fall, (int, float)) or not 0 < fall <= 1):
            raise ValueError("parameter 'reward_fall' must be a number in (0, 1] (or null: off)")
        window = self.params["window"]
        if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_WARMUP:
            raise ValueError(f"parameter 'window' must be a whole number from 1 to {MAX_WARMUP}")

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        if self.params["reward_fall"] is not None:
            _track_reward(state, values.get(REWARD_KEY))
        value = values.get(self.metric)
        if value is None or math.isnan(value):
            return None
        window, rise = self.params["window"], self.params["rise"]
        if (window > 1 or rise is not None) and not math.isfinite(value):
            return None  # no share or level to average or rise from ("non-finite value" says it)
        what = self.metric
        if window > 1:
            recent = state.setdefault("recent", [])
            recent.append(bounded(value))
            del recent[:-window]
            if len(recent) < window:
                return Signal(False, value, f"{len(recent)} of the {window} values its mean is taken over")
            value = statistics.fmean(recent)
            what = f"the mean of {self.metric}'s last {window} values"
        above = self.params["op"] == ">"
        limit = self.params["threshold"]
        if state.get("active") and self.params["resolve_at"] is not None:
            limit = self.params["resolve_at"]
        active = value > limit if above else value < limit
        since = ""
        if rise is not None:
            extreme = state.get("extreme", value)
            extreme = min(extreme, value) if above else max(extreme, value)
            state["extreme"] = extreme
            came = abs(value - extreme) >= rise
            active = active and (came or bool(state.get("active")))
            since = f", {'up' if above else 'down'} from {extreme:.4g}"
        if active and self.params["reward_fall"] is not None and "rewards" in state:  # a run that logs a reward
            now, peak = state.get("reward_now"), state.get("reward_peak")
            active = now is not None and peak is not None and peak - now > 0 and peak - now >= self.params["reward_fall"] * abs(peak)
            since += f"; the reward's last {REWARD_RECENT} average {now:.4g}, down from {peak:.4g}" if active else ""
        state["active"] = active
        return Signal(active, value, f"{what} = {value:.4g} {'>' if above else '<'} {limit:.4g}{since}" if active else "within bounds")


REWARD_KEY = "reward/mean"
REWARD_RECENT = 10
"""A threshold with `reward_fall` compares the mean of the reward's last REWARD_RECENT values with the highest it had."""


def _track_reward(state: dict[str, Any], reward: float | None) -> None:
    """Keep the mean of the reward's last REWARD_RECENT finite values and the highest it had."""
    if reward is None or not math.isfinite(reward):
        return
    recent = state.setdefault("rewards", [])
    recent.append(bounded(reward))
    del recent[:-REWARD_RECENT]
    if len(recent) == REWARD_RECENT:
        now = statistics.fmean(recent)
        state["reward_now"] = now
        state["reward_peak"] = max(state.get("reward_peak", now), now)


class AboveStart(Detector):
    """The median of the metric's last `window` values at least `factor` times its start: the
    median of its first `start` values, then frozen (values under `floor` count as `floor`).

    A run fine-tuned from a trained model starts where that model is: a policy's entropy of
    0.2–0.9 nats a token. An entropy that goes on to several times that has left what the model
    knew for a flatter output, whatever the reward did, and nothing needs to be learned first
    for that level to mean something (the climbs wait for the reward to rise; a run that falls
    before it rises is theirs to miss). Medians, so a few steps' burst does not count. A run
    that starts from scratch starts at its highest entropy, and this never fires on it.
    Non-finite values are left out (the "non-finite value" rule reports them). A detector that
    joined a run after its first steps (JOINED: the rule was added or edited while the run
    streamed) has no start to measure from and stays silent on that run. The metric may be
    alternatives separated by `|`, as a climb's."""

    kind = "above_start"
    defaults: ClassVar[dict[str, Any]] = {"start": 10, "window": 20, "factor": 3.0, "floor": 0.0}

    def validate(self) -> None:
        for name in ("start", "window"):
            value = self.params[name]
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WARMUP:
                raise ValueError(f"parameter {name!r} must be a whole number from 1 to {MAX_WARMUP}")
        factor = self.params["factor"]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 1:
            raise ValueError(f"parameter 'factor' must be a number > 1, got {factor!r}")
        floor = self.params["floor"]
        if isinstance(floor, bool) or not isinstance(floor, (int, float)) or floor < 0:
            raise ValueError(f"parameter 'floor' must be a number ≥ 0, got {floor!r}")

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        key = watched(state, self.metric, values)
        value = values.get(key) if key is not None else None
        if value is None or not math.isfinite(value):
            return None
        if state.get(JOINED):
            return Signal(False, value, "the rule joined this run after its first steps: it has no start to measure from")
        value = bounded(max(value, self.params["floor"]))
        start, window = self.params["start"], self.params["window"]
        if "level" not in state:
            first = state.setdefault("first", [])
            first.append(value)
            if len(first) == start:
                state["level"] = statistics.median(first)
                del state["first"]
        recent = state.setdefault("recent", [])
        recent.append(value)
        del recent[:-window]
        level = state.get("level")
        if level is None:
            return Signal(False, value, f"{len(state['first'])} of the first {start} values its start is taken from")
        if len(recent) < window:
            return Signal(False, value, f"{len(recent)} of the {window} values its median is taken over")
        if level <= 0:
            return Signal(False, value, f"its start ({level:.4g}) is not above 0: nothing to be a multiple of")
        median = statistics.median(recent)
        times = median / level
        if times < self.params["factor"]:
            return Signal(False, median, "within bounds")
        message = (
            f"the median of {key}'s last {window} values = {median:.4g}, {times:.1f}× its start "
            f"{level:.4g} (the median of its first {start})"
        )
        return Signal(True, median, message)


LEVEL_SHARE = 0.25
"""The share of a size's warm-up values above its floor from which those values alone are its level."""


class RobustBaseline:
    """Median/MAD of the first `warmup` finite values, then frozen. State lives in the caller's dict."""

    @staticmethod
    def z(state: dict[str, Any], x: float, warmup: int, min_scale: float, floor: float | None = None) -> float | None:
        """Standardised x, or None while still warming up (x is then added to the warm-up sample).
        With `floor` (a size's floor: values at it stand for "about 0"), when at least
        LEVEL_SHARE of the sample is above it, the level is that of those values alone: a loss
        that is about 0 on some steps and of some size on the others has that size as its level
        (its steps about 0 would otherwise pull the median to the floor and the scale to
        nothing, and every step of its usual size would read as growth)."""
        if "median" not in state:
            sample = state.setdefault("warmup", [])
            sample.append(x)
            if len(sample) < warmup:
                return None
            if floor is not None:
                sized = [v for v in sample if v > floor]
                if len(sized) >= LEVEL_SHARE * len(sample):
                    sample = sized
            median = statistics.median(sample)
            mad = statistics.median(abs(v - median) for v in sample)
            state["median"], state["scale"] = median, max(MAD_TO_SIGMA * mad, min_scale)
            del state["warmup"]
            return None
        return float((x - state["median"]) / state["scale"])


FALLBACK_RECENT = 10
"""A climb in `fallback` compares the mean of the reward's last FALLBACK_RECENT values with its level."""


def fallback_drop(state: dict[str, Any]) -> tuple[float, float, float] | None:
    """(how many spreads the reward's recent mean is below its level, that mean, the level):
    the level is the reward's mean over the steps the climb's fallback level was taken over, the
    spread its per-sample spread there (`reward/std`), or on a run that logs none the spread of
    those steps' rewards. None without them."""
    level = state.get("reward_level")
    recent = state.get("rewards") or []
    if not level or len(recent) < FALLBACK_RECENT:
        return None
    mean, spread = level
    now = statistics.fmean(recent)
    return (mean - now) / max(spread, 1e-12), now, mean


class RewardGain:
    """How much a run has learned: how far `reward/mean` (EWMA, at its peak so far) has risen
    above its start (the mean of its first START_STEPS values), in initial per-sample spreads
    (`reward/std` over the same steps). State lives in the caller's dict."""

    START_STEPS = 5

    @staticmethod
    def update(state: dict[str, Any], values: Mapping[str, float], reward_key: str, std_key: str, alpha: float) -> None:
        reward = values.get(reward_key)
        if reward is None or not math.isfinite(reward):
            return
        state["reward_seen"] = True
        smooth = state.get("reward_smooth", reward)
        smooth = (1 - alpha) * smooth + alpha * reward
        state["reward_smooth"] = smooth
        state["reward_peak"] = max(state.get("reward_peak", smooth), smooth)
        if state.get("start_count", 0) < RewardGain.START_STEPS:
            spread = values.get(std_key)
            state["start_sq"] = state.get("start_sq", 0.0) + reward * reward
            state["start_sum"] = state.get("start_sum", 0.0) + reward
            state["start_spread"] = state.get("start_spread", 0.0) + (spread if spread is not None and math.isfinite(spread) else 0.0)
            state["start_count"] = state.get("start_count", 0) + 1

    @staticmethod
    def gained(state: dict[str, Any], *, noise_spread: bool = False) -> tuple[float, float] | None:
        """(peak - start, initial spread), or None before any reward.

        `noise_spread`: on a run that logged no per-sample spread over its first steps, take the
        spread of those steps' rewards instead (a mean over a few 0/1 samples swings by about
        its per-sample spread over the root of their count): any rise would otherwise count as
        learning, and a level taken "once the run learned" would be its first steps'."""
        count = state.get("start_count")
        if not count:
            return None
        start = state["start_sum"] / count
        spread = state["start_spread"] / count
        if noise_spread and spread <= 0 and count >= RewardGain.START_STEPS:
            spread = math.sqrt(max(0.0, state.get("start_sq", 0.0) / count - start * start))
        return state["reward_peak"] - start, spread

    @staticmethod
    def gain(state: dict[str, Any]) -> float | None:
        """The rise in initial spreads (None before any reward, or with no initial spread)."""
        gained = RewardGain.gained(state)
        return gained[0] / gained[1] if gained is not None and gained[1] > 0 else None

    @staticmethod
    def reached(state: dict[str, Any], gain: float, *, noise_spread: bool = False) -> bool:
        """Has the reward risen `gain` initial spreads (and risen at all)? False before any reward."""
        gained = RewardGain.gained(state, noise_spread=noise_spread)
        return gained is not None and gained[0] > 0 and gained[0] >= gain * gained[1]


def watched(state: dict[str, Any], metric: str, values: Mapping[str, float]) -> str | None:
    """The metric a rule watches on this run: the first of its alternatives separated by `|`
    (`loss/total|loss/pg`) that the run logs, kept in `state` once chosen; None until one is."""
    key = state.get("key")
    if key is None:
        key = next((k.strip() for k in metric.split("|") if k.strip() in values), None)
        if key is not None:
            state["key"] = key
    return key


class LogLevel:
    """The level m and spread d of log x over a run's ordinary steps, for a detector of jumps.

    The first `warmup` values give m (their median) and d (their mean absolute deviation from
    it), so neither leans on the first value nor on the kind of step that happens to come
    first; after that m and d are EWMAs (`alpha`) that a step beyond `bound` of m either way
    (a jump, or a dip as deep: a GRPO step with no reward spread, whose gradient is 1,000x
    smaller) does not move. A run whose steps alternate between two levels keeps both in its
    spread. State lives in the caller's dict (`mean`, `dev`)."""

    @staticmethod
    def excess(state: dict[str, Any], x: float, *, warmup: int, alpha: float, bound: float, dev_mult: float) -> float | None:
        """x − m − dev_mult·d before this step, or None while warming up (x is then taken into
        the warm-up sample); then m and d take x in unless it was beyond `bound` either way."""
        if "mean" not in state:
            sample = state.setdefault("level_sample", [])
            sample.append(x)
            if len(sample) >= warmup:
                median = statistics.median(sample)
                state["mean"], state["dev"] = median, sum(abs(v - median) for v in sample) / len(sample)
                del state["level_sample"]
            return None
        mean, dev = state["mean"], state["dev"]
        excess = x - mean - dev_mult * dev
        if excess <= bound and mean - x - dev_mult * dev <= bound:
            state["dev"] = (1 - alpha) * dev + alpha * abs(x - mean)
            state["mean"] = (1 - alpha) * mean + alpha * x
        return excess


class Climb(Detector):
    """One-sided CUSUM on log(metric), standardised by a robust baseline taken once the run learned.

    z_t = (log x_t - median) / (1.4826 MAD), S_t = max(0, S_{t-1} + min(z_t, z_cap) - k); active
    while S_t > h. Working in log units and baseline sigmas makes the default portable across
    metrics and runs whose raw scales differ by orders of magnitude.

    The baseline is the last `warmup` values before the reward first gained `after_gain`
    initial spreads (RewardGain): the level a run had once it had learned something, rather
    than at its first steps, where a sampler–learner mismatch is near zero and anything later
    is a climb. With `after_gain` 0, or on a run that logs no reward, it is the first
    `warmup` values.

    The metric may be alternatives separated by `|`: the climb watches the first one a run
    logs. `direction` "down" watches a fall instead (z taken with its sign flipped); `of`
    "magnitude" watches |x| (a loss, whose sign means nothing to its size; a step whose loss
    is exactly 0, every advantage zero, carries no level and is skipped; a loss about 0 on some
    steps and of some size on the others has that size as its level: RobustBaseline's
    `floor`). `adapt` lets the
    baseline's median follow the run the other way from the one watched: while the CUSUM is at
    0 (nothing accumulating) and log x is below the median (above, for "down"), the median
    moves `adapt` of the way towards it, by at most one baseline sigma per step. An entropy
    that goes on sharpening after the reward first rose settles lower than the level at that
    moment; its learned level is where it settled, and a runaway is measured from there. A
    climb never raises its own baseline. 0 freezes the baseline.

    `surge` (0: off) asks, besides, that the rise be recent: the EWMA of log x with weight
    1/`surge_fast` at least `surge` times (in x) the one with weight 1/`surge_slow`. A level that
    crept up over hundreds of steps of a run that learns accumulates a CUSUM too; the climb
    before a collapse is the one that is also a surge.

    `settle` (0: off) holds the CUSUM at 0 for that many values after the baseline is taken:
    a run that has just gained `after_gain` spreads is in its fastest learning, its policy
    moving most per step, and a stale sampler's mismatch rises with it for a few tens of
    steps; what climbs once that has settled is counted.

    `fallback` (0: off) watches a run whose reward never rose: after that many values of
    waiting the baseline is the last `warmup` values anyway, and the climb is active only while
    the mean of the reward's last FALLBACK_RECENT values is also `fallback_drop` spreads below
    its mean over those steps (`reward/std` there, else the spread of their rewards): a run
    resumed from a trained checkpoint has nothing to gain, and a run that never learned has an
    entropy that wanders but no reward to lose. A reward that rises later has the baseline
    taken again, from the `warmup` values before it.
    """

    kind = "climb"
    defaults: ClassVar[dict[str, Any]] = {
        "warmup": 50, "k": 1.0, "h": 12.0, "z_cap": 8.0, "min_scale": 0.05, "floor": 1e-12,
        "after_gain": 2.5, "reward_key": "reward/mean", "reward_std_key": "reward/std",
        "direction": "up", "of": "value", "adapt": 0.0, "surge": 0.0, "surge_fast": 10, "surge_slow": 50,
        "settle": 0, "fallback": 0, "fallback_drop": 1.5,
    }

    def validate(self) -> None:
        _positive(self.params, "warmup", "k", "h", "z_cap", "min_scale", "floor", "surge_fast", "surge_slow", "fallback_drop")
        if self.params["warmup"] > MAX_WARMUP:
            raise ValueError(f"parameter 'warmup' must be at most {MAX_WARMUP}")
        for name in ("surge", "settle", "fallback"):
            value = self.params[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"parameter {name!r} must be a number >= 0 (0: off)")
        if not 1 <= self.params["surge_fast"] < self.params["surge_slow"]:
            raise ValueError("parameters 'surge_fast' and 'surge_slow' must satisfy 1 <= surge_fast < surge_slow")
        after = self.params["after_gain"]
        if isinstance(after, bool) or not isinstance(after, (int, float)) or after < 0:
            raise ValueError("parameter 'after_gain' must be a number >= 0")
        adapt = self.params["adapt"]
        if isinstance(adapt, bool) or not isinstance(adapt, (int, float)) or not 0 <= adapt <= 1:
            raise ValueError("parameter 'adapt' must be a number in [0, 1]")
        for name in ("reward_key", "reward_std_key"):
            if not isinstance(self.params[name], str):
                raise ValueError(f"parameter {name!r} must be a metric name")
        if self.params["direction"] not in ("up", "down"):
            raise ValueError("parameter 'direction' must be 'up' or 'down'")
        if self.params["of"] not in ("value", "magnitude"):
            raise ValueError("parameter 'of' must be 'value' or 'magnitude'")

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        self.track_reward(state, values)
        return self.observe(state, state, values)

    def track_reward(self, reward: dict[str, Any], values: Mapping[str, float]) -> None:
        if self.params["after_gain"]:
            RewardGain.update(reward, values, self.params["reward_key"], self.params["reward_std_key"], REWARD_ALPHA)

    def _wait(self, state: dict[str, Any], x: float, values: Mapping[str, float]) -> bool:
        """One value of a run whose reward has not risen yet: True while it waits. With
        `fallback`, False once it has waited that long: the level is then the last `warmup`
        values anyway, and the reward's level and spread over the same steps (kept meanwhile)
        are what a fall is measured from."""
        p = self.params
        sample = state.setdefault("warmup", [])
        sample.append(x)
        del sample[: -int(p["warmup"])]
        if not p["fallback"]:
            return True
        rewards, spreads = state.setdefault("rewards", []), state.setdefault("spreads", [])
        for kept, item in ((rewards, values.get(p["reward_key"])), (spreads, values.get(p["reward_std_key"]))):
            if item is not None and math.isfinite(item):
                kept.append(bounded(item))
                del kept[: -int(p["warmup"])]
        state["waited"] = state.get("waited", 0) + 1
        if state["waited"] < max(p["fallback"], p["warmup"]):
            return True
        state["fallback"] = True
        state["recent"] = list(sample)
        spread = statistics.fmean(spreads) if spreads else statistics.pstdev(rewards) if len(rewards) >= 2 else 0.0
        state["reward_level"] = [statistics.fmean(rewards), spread] if rewards and spread > 0 else None
        del state["spreads"]
        state["rewards"] = rewards[-FALLBACK_RECENT:]
        sample.pop()  # RobustBaseline takes x from here
        return False

    def _follow(self, state: dict[str, Any], x: float, values: Mapping[str, float], learned: bool) -> None:
        """One value of a run measured from its fallback level: the last `warmup` values and
        FALLBACK_RECENT rewards kept; if the reward has now risen, the level is taken again from
        the `warmup` values before this one and this one, as on a run that waited for it."""
        if learned:
            recent = state["recent"]
            for name in ("median", "scale", "cusum", "fallback", "recent", "rewards", "reward_level", "settled"):
                state.pop(name, None)
            state["warmup"] = recent  # RobustBaseline takes x from here
            return
        for name, item, keep in (("recent", x, self.params["warmup"]), ("rewards", values.get(self.params["reward_key"]), FALLBACK_RECENT)):
            if item is not None and math.isfinite(item):
                kept = state[name]
                kept.append(bounded(item))
                del kept[: -int(keep)]

    def observe(self, state: dict[str, Any], reward: dict[str, Any], values: Mapping[str, float]) -> Signal | None:
        """One step of the climb, given the reward's gain as tracked in `reward` (`track_reward`)."""
        p = self.params
        key = watched(state, self.metric, values)
        value = None if key is None else values.get(key)
        if value is None or math.isnan(value):
            return None
        size = abs(value) if p["of"] == "magnitude" else value
        if size == 0.0 and p["of"] == "magnitude":
            return Signal(False, value, "no loss this step")  # every advantage zero: no level
        x = math.log(max(size, p["floor"])) if math.isfinite(size) else (math.inf if size > 0 else math.log(p["floor"]))
        x = min(x, 700.0)
        if p["surge"] and math.isfinite(x):
            state["fast"] = x if "fast" not in state else state["fast"] + (x - state["fast"]) / p["surge_fast"]
            state["slow"] = x if "slow" not in state else state["slow"] + (x - state["slow"]) / p["surge_slow"]
        if state.get("fallback") or "median" not in state:
            learned = not p["after_gain"] or not reward.get("reward_seen") or RewardGain.reached(reward, p["after_gain"], noise_spread=True)
            if state.get("fallback"):
                self._follow(state, x, values, learned)
            elif not learned:
                if self._wait(state, x, values):
                    return Signal(False, value, "waiting for the reward to rise")
            else:
                state.pop("rewards", None)  # kept for a fallback that is not needed now
                state.pop("spreads", None)
        z = RobustBaseline.z(state, x, p["warmup"], p["min_scale"], math.log(p["floor"]) if p["of"] == "magnitude" else None)
        if z is None:
            if p["settle"] and "median" in state:
                state["settled"] = 0  # the baseline was just taken: the run settles from here
            return Signal(False, value, "warming up")
        if state.get("settled", p["settle"]) < p["settle"]:
            state["settled"] += 1
            return Signal(False, value, "settling since the baseline was taken")
        up = p["direction"] == "up"
        if not up:
            z = -z
        cusum = max(0.0, state.get("cusum", 0.0) + min(z, p["z_cap"]) - p["k"])
        state["cusum"] = cusum
        if cusum == 0.0 and p["adapt"] and math.isfinite(x):
            scale = state["scale"]
            away = state["median"] - x if up else x - state["median"]
            if away > 0:  # only away from the way it watches: a climb never raises its own baseline
                state["median"] += (-1 if up else 1) * p["adapt"] * min(scale, away)
        active = cusum > p["h"]
        surging = ""
        if active and p["surge"]:
            rise = math.exp((state["fast"] - state["slow"]) * (1 if up else -1))
            active = rise >= p["surge"]
            surging = f"; its {p['surge_fast']:g}-step average is {rise:.3g}× its {p['surge_slow']:g}-step one"
        falling = ""
        if active and state.get("fallback"):
            drop = fallback_drop(state)
            active = drop is not None and drop[0] >= p["fallback_drop"]
            if drop is not None:
                falling = (f"; the run never showed a learned reward, and its reward's last {FALLBACK_RECENT} values average "
                           f"{drop[1]:.4g}, {drop[0]:.2g} spreads below its level then ({drop[2]:.4g})")
        if not active:
            return Signal(False, value, "at baseline")
        level = math.exp(state["median"])
        what = f"|{key}|" if p["of"] == "magnitude" else key
        times = math.exp(x - state["median"]) if math.isfinite(x) else math.inf
        message = (
            f"{what} {'climbing' if up else 'falling'}: {size:.4g} is {times:.3g}× the level it had "
            f"once the run learned ({level:.4g}), {z:.1f} baseline sigmas {'above' if up else 'below'} it "
            f"(CUSUM {cusum:.1f} > {p['h']:g}){surging}{falling}"
        )
        return Signal(True, value, message)


class CoClimb(Detector):
    """Every metric of a comma-separated list climbing at once, each by its own `climb` (same
    parameters, own baseline and CUSUM; a member may be alternatives separated by `|`, as a
    climb's metric may). One metric climbing is common on a healthy stale run;
    the mismatch and the ratio tail climbing together, since the run learned, is how the slow
    collapses of docs/alerts.md begin. `surge` (3 by default) is asked of the first metric
    only: the mismatch's recent rise, which a run that learns and drifts slowly lacks.
    `settle` (30 by default) is every member's: nothing accumulates in the 30 values after the
    baseline is taken, while the run is still in its fastest learning (docs/alerts.md).

    The first metric is the one watched; a later member the run has not logged (yet) is left
    out, as a rule on a metric a run does not log is: a framework that logs its mismatch but no
    largest ratio gets the climb of its mismatch alone, with its surge (scored so in
    docs/alerts.md). Once a member is logged it counts from then on."""

    kind = "co_climb"
    defaults: ClassVar[dict[str, Any]] = {**Climb.defaults, "surge": 3.0, "settle": 30}

    def validate(self) -> None:
        self.keys = [key.strip() for key in self.metric.split(",") if key.strip()]
        if len(self.keys) < 2 or len(set(self.keys)) != len(self.keys):
            raise ValueError("co_climb watches two or more distinct metrics, comma-separated")
        self.climbs = [Climb(key, self.params if index == 0 else {**self.params, "surge": 0.0}) for index, key in enumerate(self.keys)]

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        reward = state.setdefault("reward", {})  # one gain for all the climbs
        self.climbs[0].track_reward(reward, values)
        signals = [climb.observe(state.setdefault(climb.metric, {}), reward, values) for climb in self.climbs]
        first = signals[0]
        if first is None:  # the watched metric not logged this step: nothing climbs with it
            other = next((signal for signal in signals if signal is not None), None)
            return None if other is None else Signal(False, other.value, f"no {self.climbs[0].metric} this step")
        logged = [(climb, signal) for climb, signal in zip(self.climbs, signals, strict=True) if "key" in state[climb.metric]]
        climbing = [(climb, signal) for climb, signal in logged if signal is not None and signal.active]
        if len(climbing) == len(logged):
            keys = ",".join(state[climb.metric]["key"] for climb, _ in climbing)
            missing = [climb.metric for climb in self.climbs if "key" not in state[climb.metric]]
            alone = f" ({', '.join(missing)} not logged by this run: without {'it' if len(missing) == 1 else 'them'})" if missing else ""
            return Signal(True, first.value, "; ".join(signal.message for _, signal in climbing) + alone, metric=keys)
        return Signal(False, first.value, f"only {', '.join(climb.metric for climb, _ in climbing)} climbing" if climbing else "at baseline")


class Jump(Detector):
    """A metric jumping far above its recent level, once the run has learned something.

    m and d are the level and spread of log x over the run's ordinary steps (LogLevel: the
    median and mean absolute deviation of the first `warmup` values, then EWMAs, `alpha`); a
    step is a jump when log x − m > log(`factor`) + `dev_mult`·d, and neither a jump nor a dip
    as far below moves m or d. So a GRPO run whose steps alternate between batches with a
    reward spread and batches with none (a gradient norm or a ratio 1,000× smaller on the
    latter) keeps both in its spread, and its ordinary steps are not jumps.
    Nothing fires before `warmup` steps, nor until `reward/mean`
    has gained `min_gain` initial spreads (RewardGain; a run that logs no reward is watched
    from the warm-up on). Zero and negative values carry no level and are skipped; a
    non-finite value is a jump at once. The metric may be alternatives separated by `|`
    (the first one a run logs).
    """

    kind = "jump"
    defaults: ClassVar[dict[str, Any]] = {
        "factor": 10.0, "dev_mult": 1.0, "alpha": 0.05, "warmup": 30, "min_gain": 2.5,
        "reward_key": "reward/mean", "reward_std_key": "reward/std",
    }

    def validate(self) -> None:
        p = self.params
        _positive(p, "factor", "alpha", "warmup")
        if p["factor"] <= 1 or not 0 < p["alpha"] < 1:
            raise ValueError("factor must be > 1 and alpha in (0, 1)")
        for name in ("dev_mult", "min_gain"):
            value = p[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"parameter {name!r} must be a number >= 0")
        for name in ("reward_key", "reward_std_key"):
            if not isinstance(p[name], str):
                raise ValueError(f"parameter {name!r} must be a metric name")

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        p = self.params
        RewardGain.update(state, values, p["reward_key"], p["reward_std_key"], REWARD_ALPHA)
        key = watched(state, self.metric, values)
        if key is None:
            return None
        value = values.get(key)
        if value is None or math.isnan(value):
            return None
        learned = not state.get("reward_seen") or RewardGain.reached(state, p["min_gain"])
        if not math.isfinite(value):
            return Signal(value > 0 and learned, value, f"{key} is {value} at step {step}")
        if value <= 0.0:
            return Signal(False, value, "no level")
        x = math.log(value)
        mean = state.get("mean")
        excess = LogLevel.excess(state, x, warmup=int(p["warmup"]), alpha=p["alpha"], bound=math.log(p["factor"]), dev_mult=p["dev_mult"])
        if excess is None or mean is None:
            return Signal(False, value, "warming up")
        jump = excess > math.log(p["factor"])
        if jump and not learned:
            return Signal(False, value, "jumped before the reward has moved")
        if not jump:
            return Signal(False, value, "stable")
        return Signal(True, value, f"{key} jumped to {value:.4g}, {math.exp(x - mean):.0f}× its recent level ({math.exp(mean):.3g})")


class Silent(Detector):
    """Evaluated by the engine's clock, not by points: a running run that sent nothing for `after_s`."""

    kind = "silent"
    defaults: ClassVar[dict[str, Any]] = {"after_s": 120.0}

    def validate(self) -> None:
        _positive(self.params, "after_s")

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        return Signal(False, float(step), "run is sending")

"""Collapse risk: is this run collapsing, or about to?

In off-policy RL the collapse mechanism is a gradient step far larger than the
run's recent ones: a token the learner likes much more than the sampler did
gets a huge, unbounded coefficient (importance sampling, PPO's negative-
advantage hole) and knocks the shared weights somewhere they do not recover
from. Losses that bound their coefficient (CISPO, TIS, MIS, REINFORCE) do not
produce such steps, however heavy the ratio tail; losses that do, produce
smaller ones first. So the detector watches the gradient norm against the
run's own recent history, in log units:

    excess_t =  log g_t - m_{t-1}
    m_t      =  (1 - alpha) m_{t-1} + alpha log g_t            (EWMA level)
    d_t      =  (1 - alpha) d_{t-1} + alpha |log g_t - m_{t-1}|  (EWMA spread)

and calls a step a spike when

    excess_t > log(spike_factor) + dev_mult * d_{t-1}            (any spike), or
    excess_t > log(coupled_factor) + dev_mult * d_{t-1}          (coupled spike)
               and log r_t - q_{t-1} > log(ratio_jump)

where r_t is the largest importance ratio of the step (`mismatch/ratio_max`)
and q its EWMA level in log units. A coupled spike is the gradient answering a
jump in the ratio tail: direct evidence that the loss does not bound its
coefficient, i.e. of the mechanism itself, so it counts at a lower bar than a
spike with no ratio jump behind it (which may be the optimiser, a gated step
or noise). A loss that bounds its coefficient shows no gradient response to
ratio jumps, so the lower bar costs it nothing.

None of the levels is updated on a spike (resp. a ratio jump), so a spike does
not raise the bar for the next; the spread term keeps a run whose gradient norm
is merely erratic (gated steps, oscillation) from looking like one that spikes.
Zero gradients (every sample gated out) carry no information and are skipped.
A collapse needs something to lose: while the smoothed reward has not risen
`min_gain` times its initial per-sample spread above its initial level, spikes
are reported as divergence, not collapse risk. A spike (or a non-finite
gradient) is a firing step; the rule's keep_firing_for holds the alert while
spikes keep coming. The ratio tail and ESS at the spike are reported with it.

What it cannot see: a collapse caused by one catastrophic update with no
smaller spike before it fires on that update, one step ahead of the reward
drop. Validated with `keel eval-alerts` (docs/alerts.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from server.alerts.detectors import Detector, Signal, _positive


class CollapseRisk(Detector):
    kind = "collapse_risk"
    defaults: ClassVar[dict[str, Any]] = {
        "spike_factor": 2.5,
        "coupled_factor": 1.5,
        "ratio_jump": 10.0,
        "dev_mult": 2.0,
        "alpha": 0.1,
        "warmup": 5,
        "min_gain": 1.0,
        "reward_alpha": 0.3,
        "reward_key": "reward/mean",
        "reward_std_key": "reward/std",
        "ratio_key": "mismatch/ratio_max",
        "ess_key": "mismatch/ess_frac",
    }

    def validate(self) -> None:
        _positive(self.params, "spike_factor", "coupled_factor", "ratio_jump", "alpha", "warmup", "reward_alpha")
        if not 0 < self.params["alpha"] < 1 or self.params["spike_factor"] <= 1:
            raise ValueError("alpha must be in (0, 1) and spike_factor > 1")
        coupled, spike = self.params["coupled_factor"], self.params["spike_factor"]
        if not 1 < coupled <= spike or self.params["ratio_jump"] <= 1:
            raise ValueError("coupled_factor must be in (1, spike_factor] and ratio_jump > 1")
        for name in ("dev_mult", "min_gain"):
            value = self.params[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"parameter {name!r} must be a number >= 0")

    def _progressed(self, state: dict[str, Any], values: Mapping[str, float]) -> bool:
        """Has the run learned something it could lose? (Always true when no reward is logged.)"""
        p = self.params
        reward = values.get(p["reward_key"])
        if reward is not None and math.isfinite(reward):
            state["reward_seen"] = True
            smooth = state.get("reward_smooth", reward)
            smooth = (1 - p["reward_alpha"]) * smooth + p["reward_alpha"] * reward
            state["reward_smooth"] = smooth
            state["reward_peak"] = max(state.get("reward_peak", smooth), smooth)
            if state.get("n", 0) <= p["warmup"]:
                spread = values.get(p["reward_std_key"])
                state["start_sum"] = state.get("start_sum", 0.0) + reward
                state["start_spread"] = state.get("start_spread", 0.0) + (spread if spread is not None and math.isfinite(spread) else 0.0)
                state["start_count"] = state.get("start_count", 0) + 1
        if not state.get("reward_seen"):
            return True
        count = max(1, state.get("start_count", 1))
        start, spread = state.get("start_sum", 0.0) / count, state.get("start_spread", 0.0) / count
        return bool(state["reward_peak"] - start >= p["min_gain"] * spread and state["reward_peak"] > start)

    def _ratio_jump(self, state: dict[str, Any], values: Mapping[str, float]) -> bool:
        """Is the ratio tail `ratio_jump` times above its recent level? (False when not logged.)"""
        p = self.params
        ratio = values.get(p["ratio_key"])
        if ratio is None or not math.isfinite(ratio) or ratio <= 0.0:
            return False
        x = math.log(ratio)
        level = state.get("ratio_level")
        if level is None:
            state["ratio_level"] = x
            return False
        if x - level > math.log(p["ratio_jump"]):
            return True
        state["ratio_level"] = (1 - p["alpha"]) * level + p["alpha"] * x
        return False

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        grad = values.get(self.metric)
        if grad is None or math.isnan(grad):
            return None
        if not math.isfinite(grad):
            return Signal(True, grad, f"{self.metric} is {grad} at step {step}")
        p = self.params
        progressed = self._progressed(state, values)
        ratio_jump = self._ratio_jump(state, values)
        if grad <= 0.0:
            # No update this step (every sample gated out): nothing to compare.
            return Signal(False, grad, "no gradient")
        x = math.log(grad)
        seen = state.get("n", 0)
        state["n"] = seen + 1
        mean = state.get("mean")
        if mean is None:
            state["mean"], state["dev"] = x, 0.0
            return Signal(False, grad, "warming up")
        dev = state["dev"]
        excess, slack = x - mean, p["dev_mult"] * dev
        spike = excess > math.log(p["spike_factor"]) + slack
        coupled = ratio_jump and excess > math.log(p["coupled_factor"]) + slack
        if seen >= p["warmup"] and (spike or coupled):
            if not progressed:
                return Signal(False, grad, "gradient spiking before the reward has moved (diverging, not collapsing)")
            factor = math.exp(excess)
            context = [f"{key} {values[key]:.3g}" for key in (p["ratio_key"], p["ess_key"]) if key in values]
            what = "its recent level" + ("" if spike else ", answering a jump in the ratio tail")
            message = f"{self.metric} {grad:.4g} is {factor:.1f}x {what}"
            message += f" ({', '.join(context)})" if context else ""
            return Signal(True, grad, message)
        state["dev"] = (1 - p["alpha"]) * dev + p["alpha"] * abs(excess)
        state["mean"] = (1 - p["alpha"]) * mean + p["alpha"] * x
        return Signal(False, grad, "stable")

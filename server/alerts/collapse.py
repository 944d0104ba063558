"""Collapse risk: did an update just knock the policy somewhere it may not recover from?

In off-policy RL a run collapses through one (or a few) gradient steps far larger than
its recent ones: a token the learner likes much more than the sampler did gets an
unbounded coefficient (importance sampling, PPO's negative-advantage hole) and the step
moves the shared weights a long way. But healthy runs of the same losses take such steps
too, and most of them do no harm: measured on the toy grid (docs/alerts.md), a spike's
size alone does not tell the update that will cost 0.3 of reward from the one that costs
0.05 and is recovered; a detector that pages on spikes pages on half the healthy
importance-sampling and PPO runs.

What does tell them apart is what the update did to the policy. When the sampler runs
`lag` versions behind, the batches that follow a damaging update are still drawn from the
healthy sampler, while the learner's log-probabilities are those of the damaged policy: the
sampler–learner KL (`mismatch/kl`) jumps at once, by about how far the update moved the
policy, and the reward (measured on the sampler's samples) only falls `lag` steps later.
So the detector has two stages:

1. spike: log g_t - m_{t-1} > log(spike_factor) + dev_mult * d_{t-1}, with m and d EWMAs
   (`alpha`) of the level and spread of log grad-norm over non-spike steps. A spike opens a
   confirmation window of `confirm_steps` steps and freezes the KL level seen before it, k0.
2. confirmation: within the window, KL_t - k0 > max(kl_jump, kl_gain / gain,
   (kl_factor - 1) * k0): the learner moved that many nats (and to `kl_factor` times its
   usual mismatch) away from the policy that sampled the batch. Then it fires. `gain` is
   how far the reward has risen, in initial per-sample spreads: the more a run has learned,
   the smaller the move that can cost it (a run that gained 8.7 spreads is paged from 1.5
   nats on, one that gained 3 from 4.3), while early in learning large moves are the
   learning itself. On the toy grid this separated the damaging updates from the healthy
   large ones better than any fixed jump (docs/alerts.md). Every reading of the window up
   to the one that confirms must show the KL above `kl_factor` times k0: a batch after the
   update on which the learner is no further from the sampler than that says the update did
   not move the policy, and the window closes there. A converged run whose policy is nearly
   deterministic has a KL that is 1e-5 on most batches and tens of nats on a rare one; such a
   batch two steps after a large gradient, with an unmoved one between, is noise, not the
   update's doing.

The lead this gives is about `lag - 1` steps for a collapse caused by one update (the
reward shows the damage `lag` steps after it), more when smaller damaging updates come
first; with a synchronous sampler (lag 0) the damaged policy samples the very next batch,
so there is nothing to see before the reward drops. A rule that pages on spikes alone
would give more lead on some runs and page on most healthy ones; this one does not.

Baseline: nothing fires until `warmup` gradient steps have built m and d (a non-finite
gradient fires at once). A collapse needs something to lose: until `reward/mean`
(EWMA, `reward_alpha`) has risen `min_gain` times its initial per-sample spread
(`reward/std`) above its starting level, spikes are reported as divergence. Zero
gradients (every sample gated out) are skipped; spikes do not move m or d, and the KL
level is not updated inside a window. A *dip* as far below the level as a spike is above
it (a small GRPO batch whose samples all got one reward: no advantage, a gradient norm 1,000x
smaller) does not move m or d either, and m and d start from the median and mean absolute
deviation of the first `warmup` gradient steps (LogLevel), so a run whose steps alternate
between the two keeps both in its spread. Without `mismatch/kl` there is no confirmation, and
only a spike of `spike_only_factor` times the level fires. The ratio tail and ESS at the
spike are reported with the alert.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from server.alerts.detectors import Detector, LogLevel, RewardGain, Signal, _positive


class CollapseRisk(Detector):
    kind = "collapse_risk"
    defaults: ClassVar[dict[str, Any]] = {
        "spike_factor": 4.0,
        "dev_mult": 1.0,
        "alpha": 0.05,
        "warmup": 30,
        "confirm_steps": 3,
        "kl_jump": 1.25,
        "kl_gain": 13.0,
        "kl_factor": 2.0,
        "spike_only_factor": 100.0,
        "min_gain": 2.5,
        "reward_alpha": 0.3,
        "reward_key": "reward/mean",
        "reward_std_key": "reward/std",
        "kl_key": "mismatch/kl",
        "ratio_key": "mismatch/ratio_max",
        "ess_key": "mismatch/ess_frac",
    }

    def validate(self) -> None:
        p = self.params
        _positive(p, "spike_factor", "alpha", "warmup", "confirm_steps", "kl_jump", "kl_factor", "spike_only_factor", "reward_alpha")
        if not 0 < p["alpha"] < 1 or not 0 < p["reward_alpha"] <= 1:
            raise ValueError("alpha must be in (0, 1) and reward_alpha in (0, 1]")
        if p["spike_factor"] <= 1 or p["kl_factor"] < 1 or p["spike_only_factor"] < p["spike_factor"]:
            raise ValueError("spike_factor must be > 1, kl_factor >= 1 and spike_only_factor >= spike_factor")
        for name in ("dev_mult", "min_gain", "kl_gain"):
            value = p[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"parameter {name!r} must be a number >= 0")
        for name in ("reward_key", "reward_std_key", "kl_key", "ratio_key", "ess_key"):
            if not isinstance(p[name], str):
                raise ValueError(f"parameter {name!r} must be a metric name")

    def _progressed(self, state: dict[str, Any], values: Mapping[str, float]) -> bool:
        """Has the run learned something it could lose? (Always true when no reward is logged.)"""
        p = self.params
        RewardGain.update(state, values, p["reward_key"], p["reward_std_key"], p["reward_alpha"])
        if not state.get("reward_seen"):
            return True
        return RewardGain.reached(state, p["min_gain"])

    def _confirmed(self, state: dict[str, Any], step: int, kl: float | None) -> str | None:
        """Within a spike's window: has the KL jumped away from its level before the spike?"""
        p = self.params
        if kl is None or step > state.get("window_until", -1):
            return None
        before = state["window_kl"]
        if kl <= p["kl_factor"] * before:
            # The learner is no further from the sampler on this batch than kl_factor times its
            # level before the spike: the update did not move the policy, and a jump later in
            # this window would be a noisy batch, not its doing. The window closes here.
            state["window_until"] = step - 1
            return None
        gain = RewardGain.gain(state)
        by_gain = p["kl_gain"] / gain if gain and gain > 0 else 0.0
        if kl - before > max(p["kl_jump"], by_gain, (p["kl_factor"] - 1) * before):
            return (
                f"{self.metric} spiked to {state['spike_value']:.4g} ({state['spike_factor']:.0f}x its recent level) "
                f"at step {state['spike_step']}, and the learner has moved away from the sampler: "
                f"{p['kl_key']} {kl:.3g} against {before:.3g} before the spike"
                + (f", after {p['reward_key']} had risen {gain:.1f} times its early spread since the start" if gain is not None else "")
            )
        return None

    def _track_kl(self, state: dict[str, Any], step: int, kl: float | None) -> None:
        if kl is None or kl <= 0.0 or step <= state.get("window_until", -1):
            return
        x = math.log(kl)
        level = state.get("kl_level")
        state["kl_level"] = x if level is None else (1 - self.params["alpha"]) * level + self.params["alpha"] * x

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        grad = values.get(self.metric)
        if grad is None or math.isnan(grad):
            return None
        if not math.isfinite(grad):
            return Signal(True, grad, f"{self.metric} is {grad} at step {step}")
        p = self.params
        progressed = self._progressed(state, values)
        raw_kl = values.get(p["kl_key"])
        kl = raw_kl if raw_kl is not None and math.isfinite(raw_kl) else None
        if kl is not None:
            state["kl_seen"] = True
        confirmed = self._confirmed(state, step, kl)
        message = confirmed or "stable"
        spike_only = False
        if grad > 0.0:  # zero: no update this step (every sample gated out), nothing to compare
            x = math.log(grad)
            state["n"] = state.get("n", 0) + 1
            mean = state.get("mean")
            bound = math.log(p["spike_factor"])
            excess = LogLevel.excess(state, x, warmup=int(p["warmup"]), alpha=p["alpha"], bound=bound, dev_mult=p["dev_mult"])
            if excess is not None and mean is not None and excess > bound:
                if step > state.get("window_until", -1):
                    level = state.get("kl_level")
                    state["window_kl"] = math.exp(level) if level is not None else (kl or 0.0)
                state["window_until"] = step + p["confirm_steps"]
                state["spike_step"], state["spike_value"], state["spike_factor"] = step, grad, math.exp(x - mean)
                spike_only = not state.get("kl_seen") and excess > math.log(p["spike_only_factor"])
                if spike_only:
                    message = f"{self.metric} {grad:.4g} is {math.exp(x - mean):.0f}x its recent level ({p['kl_key']} not logged)"
        self._track_kl(state, step, kl)
        active = (confirmed is not None or spike_only) and state.get("n", 0) > p["warmup"]
        if active and not progressed:
            return Signal(False, grad, "the policy jumped before the reward has moved (diverging, not collapsing)")
        if active:
            context = [f"{key} {values[key]:.3g}" for key in (p["ratio_key"], p["ess_key"]) if key in values]
            message += f" ({', '.join(context)})" if context else ""
        return Signal(active, grad, message if active else ("warming up" if state.get("n", 0) <= p["warmup"] else "stable"))

"""The catalog: every detector kind by name, and the default rules every project gets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from server.alerts.collapse import CollapseRisk
from server.alerts.detectors import (
    AboveStart,
    Climb,
    CoClimb,
    Detector,
    Jump,
    NonFinite,
    Silent,
    Threshold,
)
from server.alerts.gate_gap import GateAgainstGap
from server.alerts.hazard import Hazard, HazardModel

__all__ = ["DETECTORS", "DEFAULT_RULES", "SIGNATURE_RULES", "RuleSpec", "build_detector", "SEVERITIES"]

SEVERITIES = ("info", "warning", "critical")

DETECTORS: dict[str, type[Detector]] = {
    cls.kind: cls for cls in (NonFinite, Threshold, AboveStart, Climb, CoClimb, Jump, GateAgainstGap, CollapseRisk, Hazard, Silent)
}

HEADLINE_AND_LOSS = "reward/mean,mismatch/kl,gate/frac,mismatch/ratio_max,grad/norm,loss/*"
MISMATCH_KEYS = "mismatch/kl|mismatch/log_ratio_abs_mean|mismatch/log_ratio_abs_seq_mean|mismatch/kl_k1"
"""The sampler–learner mismatch a run logs: Keel's KL, else a framework's own mean |Δ log p|
(per token, or per sequence then over sequences), else a framework's k1 estimate of the KL
(verl's `rollout_corr/kl`, OpenRLHF's `vllm_kl`), which the climbs compare with the run's own learned level, never
with another engine's (migrations 0010, 0014)."""
LOSS_KEYS = "loss/total|loss/pg"
"""The whole loss, or the policy-gradient loss where a run logs no whole one."""
POLICY_RATIO_KEYS = "policy/ppo_kl|policy/ratio_max|policy/clip_frac"
"""How far the policy being updated moved from the step's old policy, first logged first."""


def build_detector(
    kind: str, metric: str, params: Mapping[str, Any] | None = None, *, hazard_model: HazardModel | None = None
) -> Detector:
    """The detector of a rule; ValueError for an unknown kind or parameters it refuses.

    `hazard_model` is what a `hazard` detector computes with (the others take none); without
    one, a hazard detector only checks its parameters (validating a rule) and cannot run."""
    cls = DETECTORS.get(kind)
    if cls is None:
        raise ValueError(f"unknown detector {kind!r}; known: {sorted(DETECTORS)}")
    if cls is Hazard:
        return Hazard(metric, params, hazard_model)
    return cls(metric, params)


@dataclass(frozen=True)
class RuleSpec:
    name: str
    metric: str
    detector: str
    severity: str
    for_steps: int = 1
    keep_firing_for: int = 1
    params: dict[str, Any] = field(default_factory=dict)


SIGNATURE_RULES = (
    RuleSpec(
        "entropy running away", "policy/entropy", "climb", "critical", for_steps=1, keep_firing_for=50,
        params={"min_scale": 0.35, "k": 2.0, "h": 10.0, "adapt": 0.02, "floor": 0.2, "fallback": 100},
    ),
    RuleSpec(
        "entropy far above its start", "policy/entropy", "above_start", "critical", for_steps=1, keep_firing_for=50,
        params={"start": 10, "window": 20, "factor": 3.0, "floor": 0.2},
    ),
    RuleSpec(
        "loss growing", LOSS_KEYS, "climb", "critical", for_steps=1, keep_firing_for=50,
        params={"of": "magnitude", "floor": 0.01, "min_scale": 0.5, "k": 2.0, "h": 10.0, "fallback": 100},
    ),
    RuleSpec("policy ratio jumping", POLICY_RATIO_KEYS, "jump", "warning", for_steps=1, keep_firing_for=30, params={"factor": 10.0}),
    RuleSpec(
        "answers at the length cap", "response/truncated_frac", "climb", "warning", for_steps=3, keep_firing_for=30,
        params={"floor": 0.1, "min_scale": 0.2},
    ),
    RuleSpec(
        "answers cut at the cap", "response/truncated_frac", "threshold", "critical", for_steps=1, keep_firing_for=10,
        params={"op": ">", "threshold": 0.9, "resolve_at": 0.7, "window": 10, "rise": 0.2, "reward_fall": 0.3},
    ),
    RuleSpec(
        "no learning signal", "reward/zero_std_frac", "threshold", "warning", for_steps=20, keep_firing_for=10,
        params={"op": ">", "threshold": 0.9, "resolve_at": 0.7},
    ),
    RuleSpec(
        "loss gated out", "gate/frac", "threshold", "warning", for_steps=20, keep_firing_for=10,
        params={"op": ">", "threshold": 0.95, "resolve_at": 0.8},
    ),
)
"""The rules on the signatures every RL run logs, mismatch or not (docs/alerts.md): each reads
only what a run logs, and stays silent on a run that does not log its metric."""

DEFAULT_RULES = (
    RuleSpec("non-finite value", HEADLINE_AND_LOSS, "non_finite", "critical", for_steps=1, keep_firing_for=20),
    RuleSpec("mismatch climbing", MISMATCH_KEYS, "climb", "warning", for_steps=3, keep_firing_for=30),
    RuleSpec("ratio tail climbing", "mismatch/ratio_max", "climb", "warning", for_steps=3, keep_firing_for=30),
    RuleSpec("collapse risk", "grad/norm", "collapse_risk", "critical", for_steps=1, keep_firing_for=50),
    RuleSpec("mismatch drift", f"{MISMATCH_KEYS},mismatch/ratio_max", "co_climb", "critical", for_steps=1, keep_firing_for=50, params={"h": 20.0}),
    *SIGNATURE_RULES,
    RuleSpec("run went silent", "*", "silent", "warning", params={"after_s": 120.0}),
)

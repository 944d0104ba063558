"""Collapse risk: is this run collapsing, or about to?

Provisional design; see docs/alerts.md for how it is validated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from server.alerts.detectors import Detector, RobustBaseline, Signal, _positive


class CollapseRisk(Detector):
    """Recent rate of gradient-norm spikes against the run's own frozen baseline."""

    kind = "collapse_risk"
    defaults: ClassVar[dict[str, Any]] = {
        "warmup": 30,
        "spike_z": 4.0,
        "decay": 0.9,
        "threshold": 0.25,
        "min_scale": 0.05,
    }

    def validate(self) -> None:
        _positive(self.params, "warmup", "spike_z", "decay", "threshold", "min_scale")
        if not self.params["decay"] < 1:
            raise ValueError("parameter 'decay' must be < 1")

    def update(self, state: dict[str, Any], step: int, values: Mapping[str, float]) -> Signal | None:
        grad = values.get(self.metric)
        if grad is None or math.isnan(grad):
            return None
        p = self.params
        if not math.isfinite(grad):
            return Signal(True, grad, f"{self.metric} is {grad} at step {step}")
        z = RobustBaseline.z(state, math.log(max(grad, 1e-12)), p["warmup"], p["min_scale"])
        if z is None:
            return Signal(False, grad, "warming up")
        rate = p["decay"] * state.get("rate", 0.0) + (1 - p["decay"]) * (1.0 if z > p["spike_z"] else 0.0)
        state["rate"] = rate
        active = rate > p["threshold"]
        message = f"{self.metric} spiking: {grad:.4g} ({z:.1f} sigmas over baseline), spike rate {rate:.2f}"
        return Signal(active, grad, message if active else "stable")

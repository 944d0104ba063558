"""The collapse hazard in tests: a known model (the built-in one may be refitted at any time),
a server that computes with it, and runs whose metrics make it rise."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from server.alerts.hazard import FEATURES, HORIZON, HazardModel

RISING_MODEL: dict[str, Any] = {
    "horizon": HORIZON,
    "features": list(FEATURES),
    "fitted_on": "tests: the hazard follows log10 of the sampler–learner KL",
    "intercept": 0.0,
    "weights": [1.5 if name == "log_kl" else 0.0 for name in FEATURES],
    "means": [0.0] * len(FEATURES),
    "scales": [1.0] * len(FEATURES),
}
"""P = sigmoid(1.5 · log10 KL (smoothed)): 0.0025 at a KL of 1e-4, 1/2 at 1, 0.82 at 10."""
RISING = HazardModel(RISING_MODEL)

SPIKE_STEP = 60
COLLAPSE_STEP = 100


def rising_model_file(folder: Path) -> Path:
    """RISING_MODEL as a model file in `folder`: a server started with `hazard_model=` it
    (KEEL_HAZARD_MODEL) computes every hazard as RISING does."""
    path = folder / "rising_hazard_model.json"
    path.write_text(json.dumps(RISING_MODEL), encoding="utf-8")
    return path


def collapsing_values(step: int) -> dict[str, float]:
    """A run that learns, has a one-step KL spike at SPIKE_STEP, then drifts off-policy from
    COLLAPSE_STEP on (KL ×e every 10 steps) while its reward falls."""
    over = max(0, step - COLLAPSE_STEP)
    kl = 10.0 if step == SPIKE_STEP else 1e-4 * math.exp(over / 10)
    return {
        "reward/mean": 0.2 + 0.5 * math.tanh(step / 60) - 0.01 * over,
        "reward/std": 0.2,
        "mismatch/kl": kl,
        "mismatch/ratio_max": 1.5 + 100 * kl,
        "grad/norm": 1.0 + 10 * kl,
    }


def stable_values(step: int) -> dict[str, float]:
    """A healthy run: low, flat KL."""
    return {"reward/mean": 0.2 + 0.5 * math.tanh(step / 60), "reward/std": 0.2, "mismatch/kl": 1e-3, "mismatch/ratio_max": 1.6, "grad/norm": 1.0}

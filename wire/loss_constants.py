"""The shipped losses' default constants (docs/losses.md), once: `trainer_hooks.losses`
takes them as its defaults and `trainer_hooks.metrics` clamps with them, and the dashboard's
token view (dashboard/coefficients.py, which may not import the trainer side) draws each
loss's coefficient with the same numbers. Standard library only."""

from __future__ import annotations

__all__ = [
    "CISPO_CLIP", "CISPO_FLOOR_CLIP", "DRO_BETA", "FLASH_DELTA", "GSPO_CLIP_EPS", "KL_COEFF",
    "LOG_RATIO_CLAMP", "MIS_CAP", "PPO_CLIP_EPS", "PROB_CLAMP", "TIS_CAP",
]  # fmt: skip

LOG_RATIO_CLAMP = 30.0
"""ℓ is clamped to ±30 before exp, so r stays finite in float32."""
PROB_CLAMP = 1e-6
"""Probabilities in the Bernoulli KL are clamped to [1e-6, 1 − 1e-6]."""
KL_COEFF = 0.01
"""stable_proxy's KL coefficient."""
PPO_CLIP_EPS = 0.2
CISPO_CLIP = (0.0, 4.0)
"""CISPO's clamp of the ratio (low, high)."""
CISPO_FLOOR_CLIP = (0.8, 4.0)
TIS_CAP = 2.0
MIS_CAP = 2.0
DRO_BETA = 0.05
GSPO_CLIP_EPS = (3e-4, 4e-4)
"""GSPO's clip of the sequence ratio (low, high)."""
FLASH_DELTA = 3e-3
"""FlashREINFORCE's sequence trust region on the drift."""

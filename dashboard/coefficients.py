"""What each shipped loss does with one token: its coefficient c_t on ∇ log π_t (docs/losses.md).

Every policy-gradient loss Keel ships has the gradient −agg_t(c_t · ∇ log π_t) and differs only
in c_t. The token view shows, per token, the c_t of each loss, so a researcher sees which loss
would have taken a huge step on it (the "dial": ℓ = 4, A = −1 gives IS and PPO about −55,
CISPO −4, TIS −2, MIS 0, REINFORCE −1).

The dashboard may not import the trainer side (tests/test_layering.py), so the table is written
here in plain floats, with the losses' default constants of wire/loss_constants.py (the losses
take the same); tests/dashboard/test_coefficients.py
checks every row against `trainer_hooks.losses.loss_terms` and fails when a loss is added there
and not here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from wire.loss_constants import (  # the losses' own defaults: trainer_hooks/losses.py takes them too
    CISPO_CLIP,
    CISPO_FLOOR_CLIP,
    DRO_BETA,
    FLASH_DELTA,
    GSPO_CLIP_EPS,
    KL_COEFF,
    LOG_RATIO_CLAMP,
    MIS_CAP,
    PPO_CLIP_EPS,
    PROB_CLAMP,
    TIS_CAP,
)

__all__ = [
    "LOG_RATIO_CLAMP",
    "TokenContext",
    "LossCoefficient",
    "LOSS_COEFFICIENTS",
    "token_coefficients",
    "bernoulli_kl",
    "sequence_drift",
]


_LOG_PROB_MIN, _LOG_PROB_MAX = math.log(PROB_CLAMP), math.log1p(-PROB_CLAMP)


@dataclass(frozen=True)
class TokenContext:
    """One token of one sequence, as the token view knows it."""

    advantage: float
    """A of the token's sequence."""
    log_ratio: float
    """ℓ_t = log π_t − log μ_t."""
    seq_log_ratio: float | None
    """Σ_t ℓ_t over the whole sequence (MIS's ρ = exp of it); None when unknown."""
    length: int
    """Tokens in the sequence (GSPO's s = exp(Σℓ / length))."""
    seq_drift: float | None = None
    """Mean Bernoulli KL over the sequence (FlashREINFORCE's gate), None when unknown: the
    sample shows only a window of the sequence."""

    @property
    def ell(self) -> float:
        return max(-LOG_RATIO_CLAMP, min(LOG_RATIO_CLAMP, self.log_ratio))

    @property
    def ratio(self) -> float:
        return math.exp(self.ell)


def _clip(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def _ppo(t: TokenContext) -> float:
    r, a = t.ratio, t.advantage
    active = (a > 0 and r < 1 + PPO_CLIP_EPS) or (a < 0 and r > 1 - PPO_CLIP_EPS)
    return r * a if active else 0.0


def _mis(t: TokenContext) -> float | None:
    if t.seq_log_ratio is None:
        return None
    rho = math.exp(_clip(t.seq_log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return rho * t.advantage if rho <= MIS_CAP else 0.0


def _gspo(t: TokenContext) -> float | None:
    if t.seq_log_ratio is None:
        return None
    s, a = math.exp(t.seq_log_ratio / max(t.length, 1)), t.advantage
    low, high = GSPO_CLIP_EPS
    active = (a > 0 and s < 1 + high) or (a < 0 and s > 1 - low)
    return s * a if active else 0.0


def _flash(t: TokenContext) -> float | None:
    if t.seq_drift is None:
        return None
    return t.advantage * t.ratio if t.seq_drift <= FLASH_DELTA else 0.0


@dataclass(frozen=True)
class LossCoefficient:
    name: str
    """The loss's `loss_fn` name (a key of trainer_hooks.losses.LOSSES)."""
    formula: str
    """c_t with the default constants, as the hover shows it."""
    coefficient: Callable[[TokenContext], float | None]
    """c_t of a token; None when the token view cannot know it."""


LOSS_COEFFICIENTS: tuple[LossCoefficient, ...] = (
    LossCoefficient("reinforce", "A", lambda t: t.advantage),
    LossCoefficient("stable_proxy", f"A + {KL_COEFF:g}", lambda t: t.advantage + KL_COEFF),
    LossCoefficient("importance_sampling", "r·A", lambda t: t.ratio * t.advantage),
    LossCoefficient("ppo", f"r·A unless clipped (ε {PPO_CLIP_EPS:g})", _ppo),
    LossCoefficient("cispo", "clip(r, 0, 4)·A", lambda t: _clip(t.ratio, *CISPO_CLIP) * t.advantage),
    LossCoefficient(
        "cispo_floor", "clip(r, 0.8, 4)·A", lambda t: _clip(t.ratio, *CISPO_FLOOR_CLIP) * t.advantage
    ),
    LossCoefficient("tis", "min(r, 2)·A", lambda t: min(t.ratio, TIS_CAP) * t.advantage),
    LossCoefficient("mis", "ρ·A if ρ = e^Σℓ ≤ 2, else 0", _mis),
    LossCoefficient("dro", f"A − {DRO_BETA:g}·ℓ", lambda t: t.advantage - DRO_BETA * t.ell),
    LossCoefficient("gspo", "s·A unless clipped, s = e^(Σℓ/length)", _gspo),
    LossCoefficient("flash_reinforce", "A·r if the sequence's mean Bernoulli KL ≤ 0.003, else 0", _flash),
)
"""Every loss of trainer_hooks.losses.LOSSES, in the order docs/losses.md lists them."""


def token_coefficients(token: TokenContext) -> list[tuple[LossCoefficient, float | None]]:
    """(loss, c_t) for every shipped loss."""
    return [(loss, loss.coefficient(token)) for loss in LOSS_COEFFICIENTS]


def bernoulli_kl(sampler_logprob: float, learner_logprob: float) -> float:
    """FlashREINFORCE's d = μ log(μ/π) + (1−μ) log((1−μ)/(1−π)) of one token."""
    log_mu = _clip(sampler_logprob, _LOG_PROB_MIN, _LOG_PROB_MAX)
    log_pi = _clip(learner_logprob, _LOG_PROB_MIN, _LOG_PROB_MAX)
    mu, pi = math.exp(log_mu), math.exp(log_pi)
    return mu * (log_mu - log_pi) + (1 - mu) * (math.log1p(-mu) - math.log1p(-pi))


def sequence_drift(sampler_logprobs: Sequence[float], learner_logprobs: Sequence[float]) -> float | None:
    """Mean Bernoulli KL of a whole sequence's tokens; None if any is missing or non-finite."""
    pairs = list(zip(sampler_logprobs, learner_logprobs, strict=True))
    if not pairs or not all(math.isfinite(m) and math.isfinite(p) for m, p in pairs):
        return None
    return sum(bernoulli_kl(m, p) for m, p in pairs) / len(pairs)

"""Policy-gradient losses of docs/losses.md (docs/losses.md), as per-token coefficients.

Every loss has the gradient −agg_t(c_t · ∇ log π_t); the losses differ only in
the coefficient c_t. Each loss function here is pure and returns, per token,
the detached objective values, the detached coefficient c_t and the gate mask
(`LossTerms`). `policy_loss` turns them into a scalar whose value is the loss
and whose gradient with respect to log π_t is exactly −c_t times the
aggregation weight; the toy grid uses the coefficients directly for its
analytic gradient, so both read the same table.

Shapes: `[..., B, T]` (sequences × tokens, optional leading batch dims);
advantages `[..., B]` or `[..., B, T]`. The terms are always detached: only
`policy_loss` builds a graph.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from trainer_hooks.metrics import LOG_RATIO_CLAMP, bernoulli_kl, log_ratio
from wire.loss_constants import (
    CISPO_CLIP,
    CISPO_FLOOR_CLIP,
    DRO_BETA,
    FLASH_DELTA,
    GSPO_CLIP_EPS,
    KL_COEFF,
    MIS_CAP,
    PPO_CLIP_EPS,
    TIS_CAP,
)

__all__ = [
    "ADVANTAGE_MODES",
    "AGGREGATIONS",
    "LOSSES",
    "LossSpec",
    "LossTerms",
    "aggregation_weights",
    "compute_advantages",
    "loss_terms",
    "policy_loss",
]

AGGREGATIONS = ("token_sum", "token_mean", "seq_mean_token_mean")
ADVANTAGE_MODES = ("group", "batch", "given")


class LossTerms(NamedTuple):
    """What a loss computes per token; all detached."""

    pg_B_T: Tensor
    """Policy-gradient objective per token (the loss is −agg of it)."""
    penalty_B_T: Tensor
    """KL-style penalty per token, added to the loss (zero for most losses)."""
    coef_B_T: Tensor
    """c_t: ∂(pg − penalty)/∂log π_t. Zero on padding."""
    gate: Tensor
    """Gated units: bool [..., B, T] for token units, [..., B] for sequence units."""


LossFn = Callable[..., LossTerms]


@dataclass(frozen=True)
class LossSpec:
    """A registered loss: `fn(logp_B_T, sampler_logp_B_T, adv_B_T, mask_B_T, **params)`.

    `mask_B_T` is bool (padding already zeroed in the inputs) or None for no padding.
    """

    fn: LossFn
    unit: str
    """What `gate/frac` counts: "token" or "sequence" (goes in run config as `gate/unit`)."""
    agg: str
    """Aggregation used when the caller passes none."""

    def __call__(self, *args: Tensor | None, **params: Any) -> LossTerms:
        return self.fn(*args, **params)


def _ratio(logp_B_T: Tensor, sampler_logp_B_T: Tensor) -> tuple[Tensor, Tensor]:
    ell_B_T = log_ratio(logp_B_T, sampler_logp_B_T)
    return ell_B_T, ell_B_T.exp()


def _seq_sum(x_B_T: Tensor, mask_B_T: Tensor | None) -> Tensor:
    return (x_B_T if mask_B_T is None else torch.where(mask_B_T, x_B_T, 0)).sum(-1)


def _seq_mean(x_B_T: Tensor, mask_B_T: Tensor | None) -> Tensor:
    if mask_B_T is None:
        return x_B_T.mean(-1)
    return _seq_sum(x_B_T, mask_B_T) / mask_B_T.sum(-1).clamp_min(1)


def _terms(
    pg_B_T: Tensor,
    coef_B_T: Tensor,
    gate: Tensor,
    mask_B_T: Tensor | None,
    penalty_B_T: Tensor | None = None,
) -> LossTerms:
    """Bundle the terms, zeroed on padding (mask None: no padding, nothing to zero)."""
    zero = torch.zeros_like(pg_B_T)
    if penalty_B_T is None:
        penalty_B_T = zero
    if mask_B_T is None:
        return LossTerms(pg_B_T, penalty_B_T, coef_B_T, gate)
    return LossTerms(
        pg_B_T=torch.where(mask_B_T, pg_B_T, zero),
        penalty_B_T=torch.where(mask_B_T, penalty_B_T, zero),
        coef_B_T=torch.where(mask_B_T, coef_B_T, zero),
        gate=gate & (mask_B_T if gate.dim() == mask_B_T.dim() else mask_B_T.any(-1)),
    )


def _no_gate(logp_B_T: Tensor) -> Tensor:
    return torch.zeros(logp_B_T.shape, dtype=torch.bool, device=logp_B_T.device)


def reinforce(
    logp_B_T: Tensor, sampler_logp_B_T: Tensor, adv_B_T: Tensor, mask_B_T: Tensor | None
) -> LossTerms:
    """c = A; ignores the ratio, so it cannot blow up nor correct for drift."""
    return _terms(adv_B_T * logp_B_T, adv_B_T, _no_gate(logp_B_T), mask_B_T)


def stable_proxy(
    logp_B_T: Tensor,
    sampler_logp_B_T: Tensor,
    adv_B_T: Tensor,
    mask_B_T: Tensor | None,
    *,
    kl_coeff: float = KL_COEFF,
) -> LossTerms:
    """c = A + β: REINFORCE plus Tinker's published k1 sampler KL, β Σ_t (log μ − log π)."""
    if not (math.isfinite(kl_coeff) and kl_coeff >= 0):
        raise ValueError(f"kl_coeff must be finite and >= 0, got {kl_coeff}")
    ell_B_T, _ = _ratio(logp_B_T, sampler_logp_B_T)
    return _terms(
        adv_B_T * logp_B_T,
        adv_B_T + kl_coeff,
        _no_gate(logp_B_T),
        mask_B_T,
        penalty_B_T=-kl_coeff * ell_B_T,
    )


def importance_sampling(
    logp_B_T: Tensor, sampler_logp_B_T: Tensor, adv_B_T: Tensor, mask_B_T: Tensor | None
) -> LossTerms:
    """c = r·A, the ratio is not detached (loss = −Σ r·A): unbiased and unbounded."""
    _, ratio_B_T = _ratio(logp_B_T, sampler_logp_B_T)
    return _terms(ratio_B_T * adv_B_T, ratio_B_T * adv_B_T, _no_gate(logp_B_T), mask_B_T)


def ppo(
    logp_B_T: Tensor,
    sampler_logp_B_T: Tensor,
    adv_B_T: Tensor,
    mask_B_T: Tensor | None,
    *,
    clip_eps: float = PPO_CLIP_EPS,
) -> LossTerms:
    """c = r·A where the unclipped branch of min(rA, clip(r)A) is active, else 0.

    For A < 0 and r > 1 + ε the min picks the raw ratio: PPO's unbounded hole.
    Gated tokens are those clipped (c = 0 with A ≠ 0).
    """
    _, ratio_B_T = _ratio(logp_B_T, sampler_logp_B_T)
    active = ((adv_B_T > 0) & (ratio_B_T < 1 + clip_eps)) | (
        (adv_B_T < 0) & (ratio_B_T > 1 - clip_eps)
    )
    clipped_B_T = ratio_B_T.clamp(1 - clip_eps, 1 + clip_eps)
    pg_B_T = torch.minimum(ratio_B_T * adv_B_T, clipped_B_T * adv_B_T)
    coef_B_T = torch.where(active, ratio_B_T * adv_B_T, 0)
    return _terms(pg_B_T, coef_B_T, ~active & (adv_B_T != 0), mask_B_T)


def cispo(
    logp_B_T: Tensor,
    sampler_logp_B_T: Tensor,
    adv_B_T: Tensor,
    mask_B_T: Tensor | None,
    *,
    clip_low: float = CISPO_CLIP[0],
    clip_high: float = CISPO_CLIP[1],
) -> LossTerms:
    """c = sg(clip(r, lo, hi))·A; gated tokens are those where the clip bites."""
    _, ratio_B_T = _ratio(logp_B_T, sampler_logp_B_T)
    weight_B_T = ratio_B_T.clamp(clip_low, clip_high)
    coef_B_T = weight_B_T * adv_B_T
    return _terms(coef_B_T * logp_B_T, coef_B_T, weight_B_T != ratio_B_T, mask_B_T)


def tis(
    logp_B_T: Tensor,
    sampler_logp_B_T: Tensor,
    adv_B_T: Tensor,
    mask_B_T: Tensor | None,
    *,
    cap: float = TIS_CAP,
) -> LossTerms:
    """Truncated IS: c = sg(min(r, C))·A; gated tokens have r > C."""
    _, ratio_B_T = _ratio(logp_B_T, sampler_logp_B_T)
    coef_B_T = ratio_B_T.clamp_max(cap) * adv_B_T
    return _terms(coef_B_T * logp_B_T, coef_B_T, ratio_B_T > cap, mask_B_T)


def mis(
    logp_B_T: Tensor,
    sampler_logp_B_T: Tensor,
    adv_B_T: Tensor,
    mask_B_T: Tensor | None,
    *,
    cap: float = MIS_CAP,
) -> LossTerms:
    """Masked sequence IS: c = ρ_i·A if ρ_i ≤ C else 0, ρ_i = exp(Σ_t ℓ) (clamped ±30).

    Gated units are sequences with ρ_i > C.
    """
    ell_B_T, _ = _ratio(logp_B_T, sampler_logp_B_T)
    seq_log_ratio_B = _seq_sum(ell_B_T, mask_B_T).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    rho_B = seq_log_ratio_B.exp()
    kept_B = rho_B <= cap
    coef_B_T = torch.where(kept_B, rho_B, 0).unsqueeze(-1) * adv_B_T
    return _terms(coef_B_T * logp_B_T, coef_B_T, ~kept_B, mask_B_T)


def dro(
    logp_B_T: Tensor,
    sampler_logp_B_T: Tensor,
    adv_B_T: Tensor,
    mask_B_T: Tensor | None,
    *,
    beta: float = DRO_BETA,
) -> LossTerms:
    """c = A − β·ℓ: REINFORCE plus the quadratic penalty (β/2)(log π − log μ)²."""
    ell_B_T, _ = _ratio(logp_B_T, sampler_logp_B_T)
    return _terms(
        adv_B_T * logp_B_T,
        adv_B_T - beta * ell_B_T,
        _no_gate(logp_B_T),
        mask_B_T,
        penalty_B_T=0.5 * beta * ell_B_T * ell_B_T,
    )


def gspo(
    logp_B_T: Tensor,
    sampler_logp_B_T: Tensor,
    adv_B_T: Tensor,
    mask_B_T: Tensor | None,
    *,
    clip_eps_low: float = GSPO_CLIP_EPS[0],
    clip_eps_high: float = GSPO_CLIP_EPS[1],
) -> LossTerms:
    """c = s_i·A where the unclipped branch is active, s_i = exp(mean_t ℓ): PPO at sequence level.

    The per-token objective is min(s_i A, clip(s_i) A), so with any aggregation
    that weighs a sequence's tokens equally the loss is GSPO's and ∂/∂log π_t
    is s_i A_i times the token's weight. Gated units are clipped sequences.
    """
    ell_B_T, _ = _ratio(logp_B_T, sampler_logp_B_T)
    seq_ratio_B_T = _seq_mean(ell_B_T, mask_B_T).exp().unsqueeze(-1).expand_as(ell_B_T)
    active = ((adv_B_T > 0) & (seq_ratio_B_T < 1 + clip_eps_high)) | (
        (adv_B_T < 0) & (seq_ratio_B_T > 1 - clip_eps_low)
    )
    clipped_B_T = seq_ratio_B_T.clamp(1 - clip_eps_low, 1 + clip_eps_high)
    pg_B_T = torch.minimum(seq_ratio_B_T * adv_B_T, clipped_B_T * adv_B_T)
    coef_B_T = torch.where(active, seq_ratio_B_T * adv_B_T, 0)
    bitten_B_T = ~active & (adv_B_T != 0)
    gated_B = (bitten_B_T if mask_B_T is None else bitten_B_T & mask_B_T).any(-1)
    return _terms(pg_B_T, coef_B_T, gated_B, mask_B_T)


def flash_reinforce(
    logp_B_T: Tensor,
    sampler_logp_B_T: Tensor,
    adv_B_T: Tensor,
    mask_B_T: Tensor | None,
    *,
    delta: float = FLASH_DELTA,
) -> LossTerms:
    """c = m_i·A_i·sg(r_t), m_i = 1[mean_t d_t ≤ δ] with d the Bernoulli KL (docs/metrics.md).

    Use batch advantages (`compute_advantages(..., "batch")`) and the default
    `seq_mean_token_mean`; rejected sequences stay in the denominator B.
    """
    _, ratio_B_T = _ratio(logp_B_T, sampler_logp_B_T)
    drift_B = _seq_mean(bernoulli_kl(sampler_logp_B_T, logp_B_T), mask_B_T)
    kept_B = drift_B <= delta
    coef_B_T = torch.where(kept_B.unsqueeze(-1), adv_B_T * ratio_B_T, 0)
    return _terms(coef_B_T * logp_B_T, coef_B_T, ~kept_B, mask_B_T)


LOSSES: dict[str, LossSpec] = {
    "reinforce": LossSpec(reinforce, "token", "token_sum"),
    "stable_proxy": LossSpec(stable_proxy, "token", "token_sum"),
    "importance_sampling": LossSpec(importance_sampling, "token", "token_sum"),
    "ppo": LossSpec(ppo, "token", "token_sum"),
    "cispo": LossSpec(cispo, "token", "token_sum"),
    "cispo_floor": LossSpec(functools.partial(cispo, clip_low=CISPO_FLOOR_CLIP[0], clip_high=CISPO_FLOOR_CLIP[1]), "token", "token_sum"),
    "tis": LossSpec(tis, "token", "token_sum"),
    "mis": LossSpec(mis, "sequence", "token_sum"),
    "dro": LossSpec(dro, "token", "token_sum"),
    "gspo": LossSpec(gspo, "sequence", "seq_mean_token_mean"),
    "flash_reinforce": LossSpec(flash_reinforce, "sequence", "seq_mean_token_mean"),
}
"""Registry by `loss_fn` name. Token-sum is Tinker's convention; GSPO and
FlashREINFORCE are defined with the per-sequence mean."""


def compute_advantages(rewards_B: Tensor, mode: str, group_size: int | None = None) -> Tensor:
    """Advantages from rewards [..., B].

    `group` (GRPO): R minus the mean of its group of `group_size` consecutive
    samples of the same prompt. `batch` (FlashREINFORCE): R minus the batch
    mean. `given`: the values already are advantages and are returned as is.
    """
    if mode == "group":
        if group_size is None or group_size < 1 or rewards_B.shape[-1] % group_size:
            raise ValueError(f"group mode needs a group_size dividing B={rewards_B.shape[-1]}")
        grouped = rewards_B.unflatten(-1, (-1, group_size))
        return (grouped - grouped.mean(-1, keepdim=True)).flatten(-2)
    if mode == "batch":
        return rewards_B - rewards_B.mean(-1, keepdim=True)
    if mode == "given":
        return rewards_B
    raise ValueError(f"unknown advantage mode {mode!r}; expected one of {ADVANTAGE_MODES}")


def aggregation_weights(mask_B_T: Tensor, agg: str, dtype: torch.dtype = torch.float32) -> Tensor:
    """Per-token weight w_t so that agg_t(x_t) = Σ_t w_t x_t.

    token_sum: 1. token_mean: 1/N over all N tokens. seq_mean_token_mean:
    1/(B·T_i), B counting the sequences with at least one token.
    """
    weight_B_T = (mask_B_T != 0).to(dtype)
    if agg == "token_sum":
        return weight_B_T
    if agg == "token_mean":
        return weight_B_T / weight_B_T.sum((-2, -1), keepdim=True).clamp_min(1)
    if agg == "seq_mean_token_mean":
        tokens_B = weight_B_T.sum(-1, keepdim=True)
        seqs = (tokens_B > 0).sum(-2, keepdim=True).clamp_min(1)
        return weight_B_T / tokens_B.clamp_min(1) / seqs
    raise ValueError(f"unknown aggregation {agg!r}; expected one of {AGGREGATIONS}")


def loss_terms(
    loss_fn: str,
    logp_B_T: Tensor,
    sampler_logp_B_T: Tensor,
    advantages: Tensor,
    mask_B_T: Tensor,
    **params: Any,
) -> LossTerms:
    """The registered loss's detached per-token terms (no graph)."""
    if loss_fn not in LOSSES:
        raise ValueError(f"unknown loss_fn {loss_fn!r}; expected one of {sorted(LOSSES)}")
    mask_B_T = (mask_B_T != 0).expand(logp_B_T.shape)
    adv_B_T = advantages if advantages.dim() == logp_B_T.dim() else advantages.unsqueeze(-1)
    with torch.no_grad():
        # Zero the padding first: it may hold NaN, and NaN · 0 is NaN.
        return LOSSES[loss_fn](
            torch.where(mask_B_T, logp_B_T, 0),
            torch.where(mask_B_T, sampler_logp_B_T, 0),
            torch.where(mask_B_T, adv_B_T, 0),
            mask_B_T,
            **params,
        )


def policy_loss(
    loss_fn: str,
    learner_logprobs_B_T: Tensor,
    sampler_logprobs_B_T: Tensor,
    advantages: Tensor,
    mask_B_T: Tensor,
    *,
    agg: str | None = None,
    **params: Any,
) -> tuple[Tensor, Tensor]:
    """Scalar loss and gate mask of `loss_fn` (a key of LOSSES).

    loss = −agg(pg) + agg(penalty), built so that ∂loss/∂log π_t = −c_t · w_t
    exactly (w_t the aggregation weight) while its value is the loss's own.
    `agg` defaults to the loss's (LossSpec.agg); `params` override the
    loss's defaults (e.g. `kl_coeff=0.02`, `clip_high=5.0`). With leading
    dims the loss is the sum of the per-slice losses.
    """
    terms = loss_terms(
        loss_fn, learner_logprobs_B_T, sampler_logprobs_B_T, advantages, mask_B_T, **params
    )
    mask_B_T = (mask_B_T != 0).expand(learner_logprobs_B_T.shape)
    logp_B_T = torch.where(mask_B_T, learner_logprobs_B_T, 0)
    # value = pg − penalty, gradient = c_t: the detached values carry the loss,
    # c_t · (log π − sg(log π)) carries the gradient and adds exactly zero.
    surrogate_B_T = (
        terms.pg_B_T - terms.penalty_B_T + terms.coef_B_T * (logp_B_T - logp_B_T.detach())
    )
    weight_B_T = aggregation_weights(mask_B_T, agg or LOSSES[loss_fn].agg, surrogate_B_T.dtype)
    return -(weight_B_T * surrogate_B_T).sum(), terms.gate

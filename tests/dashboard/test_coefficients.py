"""The token view's coefficient table against the losses themselves (trainer_hooks.losses)."""

from __future__ import annotations

import math

import pytest
import torch

from dashboard.coefficients import (
    LOSS_COEFFICIENTS,
    TokenContext,
    bernoulli_kl,
    sequence_drift,
    token_coefficients,
)
from trainer_hooks.losses import LOSSES, loss_terms
from trainer_hooks.metrics import bernoulli_kl as torch_bernoulli_kl


def test_every_shipped_loss_has_a_row_and_no_row_names_an_unknown_loss() -> None:
    assert [loss.name for loss in LOSS_COEFFICIENTS] == list(LOSSES)


def test_the_seeds_dial_token() -> None:
    """ℓ = 4, A = −1: IS and PPO about −55 (e⁴), CISPO −4, TIS −2, MIS 0 (its sequence's ρ is far
    above 2), REINFORCE −1."""
    token = TokenContext(advantage=-1.0, log_ratio=4.0, seq_log_ratio=4.0, length=10)
    got = {loss.name: value for loss, value in token_coefficients(token)}
    assert got["importance_sampling"] == pytest.approx(-math.exp(4))
    assert got["ppo"] == pytest.approx(-54.598, abs=1e-3)
    assert got["cispo"] == -4.0
    assert got["cispo_floor"] == -4.0
    assert got["tis"] == -2.0
    assert got["mis"] == 0.0
    assert got["reinforce"] == -1.0
    assert got["stable_proxy"] == pytest.approx(-0.99)
    assert got["dro"] == pytest.approx(-1.0 - 0.05 * 4)
    assert got["flash_reinforce"] is None  # the gate needs the whole sequence


def test_a_clipped_ppo_token_and_the_sequence_losses_by_hand() -> None:
    # A > 0 and r = e^0.5 ≈ 1.65 > 1.2: PPO clips it (0), CISPO keeps 1.65·A, TIS 1.65·A.
    token = TokenContext(advantage=0.5, log_ratio=0.5, seq_log_ratio=0.3, length=3)
    got = {loss.name: value for loss, value in token_coefficients(token)}
    assert got["ppo"] == 0.0
    assert got["cispo"] == pytest.approx(0.5 * math.exp(0.5))
    assert got["mis"] == pytest.approx(0.5 * math.exp(0.3))  # ρ = e^0.3 ≤ 2: kept
    assert got["gspo"] == 0.0  # s = e^0.1 is far outside GSPO's 4e-4 clip for A > 0
    unknown = TokenContext(advantage=0.5, log_ratio=0.5, seq_log_ratio=None, length=3)
    got = {loss.name: value for loss, value in token_coefficients(unknown)}
    assert got["mis"] is None and got["gspo"] is None


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequences of 5 tokens covering every branch: near-on-policy, r ≫ 1, r ≪ 1, both signs of A."""
    generator = torch.Generator().manual_seed(7)
    sampler = -torch.rand(12, 5, generator=generator, dtype=torch.float64) * 6 - 1e-3
    shift = torch.randn(12, 5, generator=generator, dtype=torch.float64)
    shift[0] *= 1e-4  # on policy: MIS, GSPO and FlashREINFORCE keep it
    shift[1] *= 1e-3
    shift[2] = 4.0  # the learner likes every token far more
    shift[3] = -3.0
    learner = (sampler + shift).clamp_max(-1e-6)
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0, 0.7, -0.4, 0.0, 2.0, -2.0, 0.3, -0.3, 1.5], dtype=torch.float64)
    return learner, sampler, advantages


@pytest.mark.parametrize("name", list(LOSSES))
def test_each_row_gives_the_coefficient_the_loss_computes(name: str) -> None:
    learner, sampler, advantages = _batch()
    mask = torch.ones_like(learner, dtype=torch.bool)
    expected = loss_terms(name, learner, sampler, advantages, mask).coef_B_T
    row = next(loss for loss in LOSS_COEFFICIENTS if loss.name == name)
    for b in range(learner.shape[0]):
        ell = (learner[b] - sampler[b]).tolist()
        drift = sequence_drift(sampler[b].tolist(), learner[b].tolist())
        for t in range(learner.shape[1]):
            token = TokenContext(float(advantages[b]), ell[t], sum(ell), len(ell), drift)
            assert row.coefficient(token) == pytest.approx(float(expected[b, t]), rel=1e-6, abs=1e-9), (name, b, t)


def test_the_bernoulli_kl_is_the_metrics_one() -> None:
    learner, sampler, _ = _batch()
    expected = torch_bernoulli_kl(sampler, learner)
    for b in range(3):
        for t in range(5):
            assert bernoulli_kl(float(sampler[b, t]), float(learner[b, t])) == pytest.approx(float(expected[b, t]), rel=1e-9, abs=1e-12)
    assert sequence_drift([-1.0, math.nan], [-1.0, -1.0]) is None

"""trainer_hooks.losses against hand-computed values and the docs/losses.md coefficient table."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_hooks.losses import (
    AGGREGATIONS,
    LOSSES,
    aggregation_weights,
    compute_advantages,
    loss_terms,
    policy_loss,
)

LN2, LN5 = math.log(2.0), math.log(5.0)
NAN = math.nan


def hand_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two sequences, the second one token shorter; padding holds NaN.

    Log-ratios ℓ = [[ln 2, 0, −ln 2], [ln 5, −ln 2, pad]], so r = [[2, 1, 0.5], [5, 0.5]];
    log π = [[−1, −2, −0.5], [−0.3, −1.5]], A = [1, −1].
    """
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.5, NAN]], dtype=torch.float64)
    ell = torch.tensor([[LN2, 0.0, -LN2], [LN5, -LN2, NAN]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    return logp, logp - ell, adv, mask


# Σ A·log π over the tokens: 1·(−1 − 2 − 0.5) + (−1)·(−0.3 − 1.5) = −1.7
HAND_EXPECTED = {
    "reinforce": (1.7, [[0, 0, 0], [0, 0, 0]]),
    # + β Σ (log μ − log π) = −0.01 · (ln 5 − ln 2)
    "stable_proxy": (1.7 - 0.01 * (LN5 - LN2), [[0, 0, 0], [0, 0, 0]]),
    # −Σ r·A = −((2 + 1 + 0.5) − (5 + 0.5))
    "importance_sampling": (2.0, [[0, 0, 0], [0, 0, 0]]),
    # min(rA, clip(r)A): [1.2, 1, 0.5] and [−5, −0.8]; clipped: r=2 (A>0), r=0.5 (A<0)
    "ppo": (-(1.2 + 1 + 0.5 - 5 - 0.8), [[1, 0, 0], [0, 1, 0]]),
    # weights [2, 1, 0.5], [4, 0.5]: −(−2 − 2 − 0.25 + 1.2 + 0.75)
    "cispo": (2.3, [[0, 0, 0], [1, 0, 0]]),
    # weights [2, 1, 0.8], [4, 0.8]: −(−2 − 2 − 0.4 + 1.2 + 1.2)
    "cispo_floor": (2.0, [[0, 0, 1], [1, 1, 0]]),
    # weights [2, 1, 0.5], [2, 0.5]: −(−2 − 2 − 0.25 + 0.6 + 0.75)
    "tis": (2.9, [[0, 0, 0], [1, 0, 0]]),
    # ρ = [1, 2.5]: the second sequence is masked, the first keeps weight 1
    "mis": (3.5, [0, 1]),
    # + (β/2) Σ ℓ² = 0.025 · (3 ln²2 + ln²5)
    "dro": (1.7 + 0.025 * (3 * LN2**2 + LN5**2), [[0, 0, 0], [0, 0, 0]]),
}


@pytest.mark.parametrize("name", sorted(HAND_EXPECTED))
def test_hand_computed_token_sum(name: str) -> None:
    logp, sampler_logp, adv, mask = hand_batch()
    loss, gate = policy_loss(name, logp, sampler_logp, adv, mask, agg="token_sum")
    expected_loss, expected_gate = HAND_EXPECTED[name]
    assert loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert gate.tolist() == torch.tensor(expected_gate, dtype=torch.bool).tolist()


def test_gspo_hand_computed() -> None:
    logp, sampler_logp, _, mask = hand_batch()
    # s = [exp(0), exp((ln 5 − ln 2)/2)] = [1, √2.5]; A = [−1, 1]: the second is clipped at 1 + 4e-4.
    loss, gate = policy_loss(
        "gspo", logp, sampler_logp, torch.tensor([-1.0, 1.0], dtype=torch.float64), mask
    )
    assert loss.item() == pytest.approx(-(-1.0 + 1.0004) / 2, abs=1e-12)
    assert gate.tolist() == [False, True]


def test_flash_reinforce_hand_computed() -> None:
    # Sequence 0 is nearly on-policy (kept), sequence 1 drifted (rejected); A = R − mean(R).
    logp = torch.tensor([[-0.5, -1.0], [-0.5, -1.0]], dtype=torch.float64)
    sampler_logp = torch.tensor([[-0.5, -1.01], [-1.5, -1.0]], dtype=torch.float64)
    adv = compute_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), "batch")

    def bkl(mu: float, pi: float) -> float:
        return mu * math.log(mu / pi) + (1 - mu) * math.log((1 - mu) / (1 - pi))

    drift_0 = (0 + bkl(math.exp(-1.01), math.exp(-1.0))) / 2
    drift_1 = (bkl(math.exp(-1.5), math.exp(-0.5)) + 0) / 2
    assert drift_0 < 3e-3 < drift_1
    loss, gate = policy_loss("flash_reinforce", logp, sampler_logp, adv, torch.ones(2, 2))
    # seq-mean of token-means; sequence 1 stays in the denominator B = 2.
    ratio_01 = math.exp(0.01)
    expected = -(0.5 * (1.0 * -0.5 + ratio_01 * -1.0) / 2 + 0.0) / 2
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert gate.tolist() == [False, True]


def table_coefficients(
    name: str, logp: torch.Tensor, sampler_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """c_t and the gate, written straight from the docs/losses.md table (default parameters)."""
    valid = mask.bool()
    ell = torch.where(valid, logp - sampler_logp, 0).clamp(-30, 30)
    r = ell.exp()
    a = torch.where(valid, adv[:, None].expand_as(logp), 0)
    no_gate = torch.zeros_like(valid)
    seq_gate = torch.zeros(valid.shape[0], dtype=torch.bool)
    if name == "reinforce":
        c, gate = a, no_gate
    elif name == "stable_proxy":
        c, gate = a + 0.01, no_gate
    elif name == "importance_sampling":
        c, gate = r * a, no_gate
    elif name == "ppo":
        active = ((a > 0) & (r < 1.2)) | ((a < 0) & (r > 0.8))
        c, gate = torch.where(active, r * a, 0), ~active & (a != 0)
    elif name in ("cispo", "cispo_floor"):
        low = 0.8 if name == "cispo_floor" else 0.0
        c, gate = r.clamp(low, 4.0) * a, (r < low) | (r > 4.0)
    elif name == "tis":
        c, gate = torch.minimum(r, torch.tensor(2.0)) * a, r > 2.0
    elif name == "mis":
        rho = ell.sum(-1).clamp(-30, 30).exp()
        c, seq_gate = torch.where(rho <= 2.0, rho, 0)[:, None] * a, rho > 2.0
        gate = seq_gate
    elif name == "dro":
        c, gate = a - 0.05 * ell, no_gate
    elif name == "gspo":
        s = (ell.sum(-1) / valid.sum(-1)).exp()[:, None].expand_as(a)
        active = ((a > 0) & (s < 1 + 4e-4)) | ((a < 0) & (s > 1 - 3e-4))
        c, gate = torch.where(active, s * a, 0), (~active & (a != 0) & valid).any(-1)
    elif name == "flash_reinforce":
        mu = sampler_logp.exp().clamp(1e-6, 1 - 1e-6)
        pi = logp.exp().clamp(1e-6, 1 - 1e-6)
        d = mu * torch.log(mu / pi) + (1 - mu) * torch.log((1 - mu) / (1 - pi))
        drift = torch.where(valid, d, 0).sum(-1) / valid.sum(-1)
        c, gate = torch.where((drift <= 3e-3)[:, None], a * r, 0), drift > 3e-3
    else:
        raise AssertionError(name)
    token_gate = gate if gate.dim() == 2 else None
    return torch.where(valid, c, 0), (token_gate & valid) if token_gate is not None else gate


def ragged_batch(padding: float = NAN) -> tuple[torch.Tensor, ...]:
    """Six sequences of lengths 5, 3, 1, 4, 5, 2 with per-sequence drift from on-policy to far off."""
    generator = torch.Generator().manual_seed(7)
    lengths = torch.tensor([5, 3, 1, 4, 5, 2])
    mask = (torch.arange(5)[None, :] < lengths[:, None]).long()
    logp = -0.05 - 2.5 * torch.rand(6, 5, generator=generator, dtype=torch.float64)
    drift = torch.tensor([0.002, 0.6, 0.3, 0.01, 1.0, 0.05], dtype=torch.float64)[:, None]
    sampler_logp = logp - drift * torch.randn(6, 5, generator=generator, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2, 0.3, -0.8], dtype=torch.float64)
    logp = torch.where(mask.bool(), logp, padding)
    sampler_logp = torch.where(mask.bool(), sampler_logp, padding)
    return logp, sampler_logp, adv, mask


def expected_weights(mask: torch.Tensor, agg: str) -> torch.Tensor:
    m = mask.double()
    if agg == "token_sum":
        return m
    if agg == "token_mean":
        return m / m.sum()
    return m / m.sum(-1, keepdim=True) / m.shape[0]


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gradient_is_minus_table_coefficient_times_weight(name: str, agg: str) -> None:
    logp, sampler_logp, adv, mask = ragged_batch()
    logp.requires_grad_(True)
    loss, gate = policy_loss(name, logp, sampler_logp, adv, mask, agg=agg)
    (grad,) = torch.autograd.grad(loss, logp)
    coef, expected_gate = table_coefficients(name, logp.detach(), sampler_logp, adv, mask)
    torch.testing.assert_close(grad, -coef * expected_weights(mask, agg), rtol=1e-12, atol=1e-14)
    assert torch.equal(gate, expected_gate)
    assert torch.isfinite(loss)  # NaN padding never leaks


def test_batch_exercises_both_sides_of_every_gate() -> None:
    """The ragged batch above must gate some but not all units, or the checks prove little."""
    logp, sampler_logp, adv, mask = ragged_batch()
    for name in ("ppo", "cispo_floor", "tis", "mis", "flash_reinforce"):
        _, gate = table_coefficients(name, logp, sampler_logp, adv, mask)
        units = mask.bool() if gate.dim() == 2 else torch.ones(6, dtype=torch.bool)
        assert 0 < gate[units].sum() < units.sum(), name


# Losses whose value is a genuine function of log π (no detached weight): the
# numerical derivative of the value must agree with the coefficient table too.
DIFFERENTIABLE = ["reinforce", "stable_proxy", "importance_sampling", "ppo", "dro", "gspo"]


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradcheck_float64(name: str, agg: str) -> None:
    logp, sampler_logp, adv, mask = ragged_batch(padding=3.0)
    ratio = (logp - sampler_logp).exp()
    seq_ratio = ((logp - sampler_logp) * mask).sum(-1).div(mask.sum(-1)).exp()
    # Keep finite differences (eps 1e-6) away from the clip kinks.
    assert ((ratio - 1.2).abs() > 1e-4).all() and ((ratio - 0.8).abs() > 1e-4).all()
    assert ((seq_ratio - 1.0004).abs() > 1e-5).all() and ((seq_ratio - 0.9997).abs() > 1e-5).all()

    def loss_of(lp: torch.Tensor) -> torch.Tensor:
        return policy_loss(name, lp, sampler_logp, adv, mask, agg=agg)[0]

    assert torch.autograd.gradcheck(
        loss_of, (logp.clone().requires_grad_(True),), eps=1e-6, atol=1e-7
    )


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_padding_is_inert(name: str) -> None:
    """A padded batch gives the per-sequence sums of the unpadded sequences; padding gets no gradient."""
    logp, sampler_logp, adv, mask = ragged_batch()
    logp.requires_grad_(True)
    loss, _ = policy_loss(name, logp, sampler_logp, adv, mask, agg="token_sum")
    (grad,) = torch.autograd.grad(loss, logp)
    assert (grad[mask == 0] == 0).all()
    # Under token_sum every loss is a sum of per-sequence terms.
    per_sequence = sum(
        policy_loss(
            name,
            logp[i : i + 1, :n],
            sampler_logp[i : i + 1, :n],
            adv[i : i + 1],
            torch.ones(1, n),
            agg="token_sum",
        )[0]
        for i, n in enumerate(mask.sum(-1).tolist())
    )
    torch.testing.assert_close(loss, per_sequence)


def test_advantages_given_per_token_match_per_sequence() -> None:
    logp, sampler_logp, adv, mask = ragged_batch()
    for name in LOSSES:
        per_seq = policy_loss(name, logp, sampler_logp, adv, mask)[0]
        per_token = policy_loss(name, logp, sampler_logp, adv[:, None].expand(6, 5), mask)[0]
        torch.testing.assert_close(per_seq, per_token)


def test_parameters_override_defaults() -> None:
    logp, sampler_logp, adv, mask = hand_batch()
    default, _ = policy_loss("stable_proxy", logp, sampler_logp, adv, mask)
    stronger, _ = policy_loss("stable_proxy", logp, sampler_logp, adv, mask, kl_coeff=0.11)
    assert (stronger - default).item() == pytest.approx(-0.1 * (LN5 - LN2), abs=1e-12)
    off, _ = policy_loss("stable_proxy", logp, sampler_logp, adv, mask, kl_coeff=0.0)
    assert off.item() == pytest.approx(1.7, abs=1e-12)
    _, gate = policy_loss("tis", logp, sampler_logp, adv, mask, cap=1.5)
    assert gate.tolist() == [[True, False, False], [True, False, False]]
    for bad in (-0.01, math.nan, math.inf):
        with pytest.raises(ValueError):
            policy_loss("stable_proxy", logp, sampler_logp, adv, mask, kl_coeff=bad)
    with pytest.raises(TypeError):
        policy_loss("ppo", logp, sampler_logp, adv, mask, cap=2.0)
    with pytest.raises(ValueError):
        policy_loss("nope", logp, sampler_logp, adv, mask)
    with pytest.raises(ValueError):
        policy_loss("ppo", logp, sampler_logp, adv, mask, agg="mean")


def test_loss_terms_split_pg_and_penalty() -> None:
    logp, sampler_logp, adv, mask = hand_batch()
    terms = loss_terms("stable_proxy", logp, sampler_logp, adv, mask)
    assert terms.pg_B_T.sum().item() == pytest.approx(-1.7, abs=1e-12)
    assert terms.penalty_B_T.sum().item() == pytest.approx(-0.01 * (LN5 - LN2), abs=1e-12)
    assert not terms.coef_B_T.requires_grad


def test_registry_units_and_aggregations() -> None:
    assert set(LOSSES) == {
        "reinforce",
        "stable_proxy",
        "importance_sampling",
        "ppo",
        "cispo",
        "cispo_floor",
        "tis",
        "mis",
        "dro",
        "gspo",
        "flash_reinforce",
    }
    sequence_units = {name for name, spec in LOSSES.items() if spec.unit == "sequence"}
    assert sequence_units == {"mis", "gspo", "flash_reinforce"}
    assert {name: spec.agg for name, spec in LOSSES.items() if spec.agg != "token_sum"} == {
        "gspo": "seq_mean_token_mean",
        "flash_reinforce": "seq_mean_token_mean",
    }


def test_aggregation_weights_skip_empty_sequences() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    torch.testing.assert_close(
        aggregation_weights(mask, "seq_mean_token_mean"),
        torch.tensor([[0.25, 0.25, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]]),
    )
    torch.testing.assert_close(aggregation_weights(mask, "token_mean"), mask / 3.0)


def test_compute_advantages() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5, 1.0, 1.0])
    torch.testing.assert_close(
        compute_advantages(rewards, "group", 2), torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0, 0.0])
    )
    torch.testing.assert_close(
        compute_advantages(rewards, "group", 3),
        torch.tensor([0.5, -0.5, 0.0, -1 / 3, 1 / 6, 1 / 6]),
    )
    torch.testing.assert_close(compute_advantages(rewards, "batch"), rewards - 4.0 / 6)
    assert compute_advantages(rewards, "given") is rewards
    stacked = torch.stack([rewards, 1 - rewards])
    torch.testing.assert_close(
        compute_advantages(stacked, "group", 2)[1], -compute_advantages(rewards, "group", 2)
    )
    with pytest.raises(ValueError):
        compute_advantages(rewards, "group", 4)
    with pytest.raises(ValueError):
        compute_advantages(rewards, "leave_one_out")

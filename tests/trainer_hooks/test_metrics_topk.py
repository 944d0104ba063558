"""The top-k disagreement of the two engines (trainer_hooks.metrics.topk_disagreement and
the `mismatch/topk_*` metrics): against a hand computation in numpy, exact across
micro-batches (merged partials), stacked steps (batched.compute) and joined calls (concat)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer_hooks.batched import compute, concat
from trainer_hooks.metrics import (
    BatchInputs,
    finalize,
    merge_partials,
    stability_metrics,
    topk_disagreement,
)

TOPK_KEYS = ("mismatch/topk_tv", "mismatch/topk_tv_max", "mismatch/topk_kl")


def _by_hand(logits: np.ndarray, ids: np.ndarray, logprobs: np.ndarray) -> tuple[float, float]:
    """TV and KL(μ‖π) of one position, the vocabulary coarsened to the listed ids and "rest"."""
    pi_V = np.exp(logits - logits.max())
    pi_V /= pi_V.sum()
    listed = [(int(i), float(lp)) for i, lp in zip(ids, logprobs, strict=True) if 0 <= i < len(pi_V)]
    mu = np.array([math.exp(lp) for _, lp in listed])
    pi = np.array([pi_V[i] for i, _ in listed])
    mu_rest, pi_rest = max(0.0, 1 - mu.sum()), max(0.0, 1 - pi.sum())
    tv = 0.5 * (np.abs(mu - pi).sum() + abs(mu_rest - pi_rest))
    kl = sum(m * math.log(m / max(p, 1e-6)) for m, p in zip(mu, pi, strict=True) if m > 0)
    if mu_rest > 0:
        kl += mu_rest * math.log(mu_rest / max(pi_rest, 1e-6))
    return float(tv), float(kl)


def test_a_hand_batch_matches_numpy() -> None:
    # Vocabulary of 5. Position 0: the sampler's top-3 is the learner's own distribution (TV 0).
    # Position 1: the sampler puts its mass on token 4, the learner on token 0. Position 2:
    # one entry missing (id −1, as a ragged vLLM answer is padded), one id past the vocabulary.
    logits = torch.tensor(
        [[[2.0, 1.0, 0.0, -1.0, -2.0], [3.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5, 0.5]]]
    )
    learner_V = torch.log_softmax(logits, -1)
    ids = torch.tensor([[[0, 1, 2], [4, 0, 1], [3, -1, 7]]])
    sampler = torch.stack(
        [
            learner_V[0, 0, :3],
            torch.log(torch.tensor([0.7, 0.2, 0.05])),
            torch.log(torch.tensor([0.6, 0.3, 0.1])),
        ]
    ).unsqueeze(0)
    tv, kl, listed = topk_disagreement(learner_V, ids, sampler)
    assert listed.tolist() == [[True, True, True]]
    for position in range(3):
        want_tv, want_kl = _by_hand(logits[0, position].numpy(), ids[0, position].numpy(), sampler[0, position].numpy())
        assert float(tv[0, position]) == pytest.approx(want_tv, abs=1e-6)
        assert float(kl[0, position]) == pytest.approx(want_kl, abs=1e-5)
    assert float(tv[0, 0]) == pytest.approx(0.0, abs=1e-7) and float(kl[0, 0]) == pytest.approx(0.0, abs=1e-6)
    # Position 1 by hand: μ = (0.7, 0.2, 0.05, rest 0.05) over (4, 0, 1, rest); the learner's
    # π = softmax(3, 0, 0, 0, 0) = (e³, 1, 1, 1, 1) / (e³ + 4).
    z = math.exp(3) + 4
    pi4, pi0, pi1 = 1 / z, math.exp(3) / z, 1 / z
    want = 0.5 * (abs(0.7 - pi4) + abs(0.2 - pi0) + abs(0.05 - pi1) + abs(0.05 - (1 - pi4 - pi0 - pi1)))
    assert float(tv[0, 1]) == pytest.approx(want, abs=1e-6)


def _batch(seed: int, seqs: int = 3, length: int = 7, vocab: int = 11, k: int = 4) -> BatchInputs:
    generator = torch.Generator().manual_seed(seed)
    logits = 2 * torch.randn(seqs, length, vocab, generator=generator)
    sampled = torch.randint(vocab, (seqs, length), generator=generator)
    sampler_logits = logits + 0.5 * torch.randn(seqs, length, vocab, generator=generator)
    sampler_V = torch.log_softmax(sampler_logits, -1)
    top = sampler_V.topk(k, -1)
    mask = (torch.arange(length) < torch.randint(2, length + 1, (seqs, 1), generator=generator)).float()
    ids = top.indices.clone()
    ids[0, 1, -1] = -1  # a missing entry
    return BatchInputs(
        sampler_V.gather(-1, sampled[..., None]).squeeze(-1),
        torch.log_softmax(logits, -1).gather(-1, sampled[..., None]).squeeze(-1),
        mask,
        logits=logits,
        sampler_topk_ids=ids,
        sampler_topk_logprobs=top.values,
    )


def test_the_metrics_are_masked_means_and_maxima_of_the_hand_values() -> None:
    batch = _batch(0)
    metrics = batch.compute()
    values = []
    for b in range(batch.mask.shape[0]):  # type: ignore[union-attr]
        for t in range(batch.mask.shape[1]):  # type: ignore[union-attr]
            if batch.mask[b, t]:  # type: ignore[index]
                values.append(
                    _by_hand(
                        batch.logits[b, t].numpy(),  # type: ignore[index]
                        batch.sampler_topk_ids[b, t].numpy(),  # type: ignore[index]
                        batch.sampler_topk_logprobs[b, t].numpy(),  # type: ignore[index]
                    )
                )
    tvs, kls = np.array(values).T
    assert float(metrics["mismatch/topk_tv"]) == pytest.approx(tvs.mean(), rel=1e-5)
    assert float(metrics["mismatch/topk_tv_max"]) == pytest.approx(tvs.max(), rel=1e-5)
    assert float(metrics["mismatch/topk_kl"]) == pytest.approx(kls.mean(), rel=1e-4)
    assert 0 < tvs.mean() < 1


def test_merged_partials_stacked_steps_and_joined_calls_equal_the_direct_path() -> None:
    parts = [_batch(seed, seqs=2 + seed, length=5 + seed) for seed in range(3)]
    whole = concat(parts)  # one batch: the micro-batches along B, padded with mask 0
    direct = {key: float(v) for key, v in whole.compute().items()}
    merged = finalize(merge_partials([p.partials() for p in parts]))
    for key in TOPK_KEYS:
        assert float(merged[key]) == pytest.approx(direct[key], rel=1e-6), key
    # Several steps stacked into one call (the worker's path): each step its own values.
    stacked = compute(parts)
    for part, row in zip(parts, stacked, strict=True):
        alone = part.compute()
        for key in TOPK_KEYS:
            assert row[key] == pytest.approx(float(alone[key]), rel=1e-6), key


def test_without_top_k_or_without_logits_no_topk_metric_is_computed() -> None:
    batch = _batch(1)
    plain = stability_metrics(batch.sampler_logprobs, batch.learner_logprobs, batch.mask, logits=batch.logits)
    no_logits = stability_metrics(
        batch.sampler_logprobs,
        batch.learner_logprobs,
        batch.mask,
        sampler_topk_ids=batch.sampler_topk_ids,
        sampler_topk_logprobs=batch.sampler_topk_logprobs,
    )
    assert not any(key in plain or key in no_logits for key in TOPK_KEYS)
    with pytest.raises(ValueError, match="go together"):
        stability_metrics(
            batch.sampler_logprobs, batch.learner_logprobs, batch.mask, logits=batch.logits, sampler_topk_ids=batch.sampler_topk_ids
        )
    # A step whose tokens have no top-k entry at all: NaN, not 0.
    empty = stability_metrics(
        batch.sampler_logprobs,
        batch.learner_logprobs,
        batch.mask,
        logits=batch.logits,
        sampler_topk_ids=torch.full_like(batch.sampler_topk_ids, -1),  # type: ignore[arg-type]
        sampler_topk_logprobs=batch.sampler_topk_logprobs,
    )
    assert all(math.isnan(float(empty[key])) for key in TOPK_KEYS)

"""trainer_hooks.metrics: exact values, no host sync, leading dims, and gloo data parallelism."""

from __future__ import annotations

import math
import os
import tempfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer_hooks.metrics import (
    Partials,
    bernoulli_kl,
    finalize,
    grad_norm,
    merge_partials,
    nonfinite_count,
    stability_metrics,
    stability_partials,
)

LN2, LN5 = math.log(2.0), math.log(5.0)
NAN = math.nan


def hand_batch() -> dict[str, torch.Tensor]:
    """ℓ = [[ln 2, 0, −ln 2], [ln 5, −ln 2, pad]] so r = [[2, 1, 0.5], [5, 0.5]]; padding is NaN."""
    learner = torch.tensor([[-1.0, -2.0, -1.5], [-1.8, -1.5, NAN]])
    ell = torch.tensor([[LN2, 0.0, -LN2], [LN5, -LN2, NAN]])
    return {
        "sampler": learner - ell,
        "learner": learner,
        "mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
    }


def bkl(mu: float, pi: float) -> float:
    return mu * math.log(mu / pi) + (1 - mu) * math.log((1 - mu) / (1 - pi))


def test_hand_computed_values() -> None:
    b = hand_batch()
    out = stability_metrics(
        b["sampler"],
        b["learner"],
        b["mask"],
        rewards=torch.tensor([1.0, 0.0]),
        gate_mask=torch.tensor([[True, False, False], [False, True, True]]),
        sampler_version=torch.tensor([3, 5]),
        learner_version=7,
    )
    ratios = [2.0, 1.0, 0.5, 5.0, 0.5]
    ells = [LN2, 0.0, -LN2, LN5, -LN2]
    learner = [-1.0, -2.0, -1.5, -1.8, -1.5]
    sampler = [lp - e for lp, e in zip(learner, ells, strict=True)]
    drifts = [bkl(math.exp(s), math.exp(lp)) for s, lp in zip(sampler, learner, strict=True)]
    abs_sorted = sorted(abs(e) for e in ells)  # p99 at position 0.99 · 4 = 3.96
    expected = {
        "mismatch/kl": (4 - math.log(2.5)) / 5,  # Σ (r − 1 − ℓ)
        "mismatch/kl_k1": -math.log(2.5) / 5,
        "mismatch/kl_k2": 0.5 * (3 * LN2**2 + LN5**2) / 5,
        "mismatch/ratio_max": 5.0,
        "mismatch/ratio_min": 0.5,
        "mismatch/log_ratio_abs_mean": (3 * LN2 + LN5) / 5,
        "mismatch/log_ratio_p99": abs_sorted[3] + 0.96 * (abs_sorted[4] - abs_sorted[3]),
        "mismatch/seq_log_ratio_max": math.log(2.5),
        "mismatch/ess_frac": sum(ratios) ** 2 / (5 * sum(r * r for r in ratios)),
        "mismatch/bkl_seq_max": max(sum(drifts[:3]) / 3, sum(drifts[3:]) / 2),
        "mismatch/bkl_seq_mean": (sum(drifts[:3]) / 3 + sum(drifts[3:]) / 2) / 2,
        "policy/entropy_est": -sum(sampler) / 5,
        "reward/mean": 0.5,
        "reward/std": 0.5,
        "gate/frac": 2 / 5,  # the gated padding token does not count
        "staleness/lag_mean": 3.0,
        "staleness/lag_max": 4.0,
        "batch/seqs": 2.0,
        "batch/tokens": 5.0,
        "batch/len_mean": 2.5,
        "nonfinite/count": 0.0,
        "mismatch/tail_frac": 1 / 5,  # ln 5 ≥ 1
        "mismatch/tail_frac_2": 0.0,
        "mismatch/low_tail_frac": 0.0,
        "mismatch/log_ratio_abs_rare": NAN,  # μ ≥ 0.03 everywhere
        "mismatch/log_ratio_abs_unlikely": LN5,  # μ = e^(−1.8 − ln 5) = 0.033
        "mismatch/log_ratio_abs_likely": 3 * LN2 / 4,
    }
    assert set(out) == set(expected)
    for key, value in expected.items():
        assert out[key].item() == pytest.approx(value, rel=2e-6, abs=1e-7, nan_ok=True), key


@pytest.mark.parametrize("seqs,length", [(16, 40), (1, 1), (3, 2), (7, 300), (64, 33)])
def test_p99_is_torch_quantile_on_the_valid_tokens(seqs: int, length: int) -> None:
    generator = torch.Generator().manual_seed(seqs * 1000 + length)
    sampler = -torch.rand(seqs, length, generator=generator) * 3
    learner = sampler + 0.3 * torch.randn(seqs, length, generator=generator)
    lengths = torch.randint(0, length + 1, (seqs, 1), generator=generator)
    lengths[0] = max(1, int(lengths[0]))  # at least one valid token
    mask = torch.arange(length)[None, :] < lengths
    out = stability_metrics(sampler, learner, mask)
    expected = torch.quantile((learner - sampler).abs()[mask], 0.99)
    torch.testing.assert_close(out["mismatch/log_ratio_p99"], expected)
    empty = stability_metrics(sampler, learner, torch.zeros_like(mask))
    assert math.isnan(empty["mismatch/log_ratio_p99"].item())


def test_unbounded_frac_counts_negative_advantage_tokens_the_learner_likes_more() -> None:
    """A < 0 and r > 1 + ε: the tokens whose step PPO and importance sampling do not bound."""
    ratios = torch.tensor([[2.0, 1.1, 1.5, 100.0], [2.0, 3.0, 0.5, 0.5], [9.0, 9.0, 9.0, 9.0]])
    sampler = torch.full_like(ratios, math.log(0.01))
    learner = sampler + ratios.log()
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]])  # the r = 100 token is padding

    per_sequence = stability_metrics(sampler, learner, mask, advantages=torch.tensor([-1.0, 1.0, NAN]))
    assert per_sequence["mismatch/unbounded_frac"].item() == pytest.approx(2 / 9)  # 2.0 and 1.5; 1.1 ≤ 1.2

    per_token = torch.tensor([[-1.0, -1.0, 1.0, -1.0], [0.5, -0.5, -2.0, 1.0], [-1.0, 0.0, -1.0, -1.0]])
    out = stability_metrics(sampler, learner, mask, advantages=per_token)
    assert out["mismatch/unbounded_frac"].item() == pytest.approx(3 / 9)  # 2.0 of seq 0, 3.0 of seq 1, 9.0 of seq 2
    assert "mismatch/unbounded_frac" not in stability_metrics(sampler, learner, mask)


def test_both_tails_and_mismatch_by_sampler_probability_match_numpy() -> None:
    """Two-sided tail mass at |ℓ| ≥ 1 and 2, the low tail ℓ ≤ −1, and mean |ℓ| per bucket of
    μ (< 1e-3, 1e-3–0.1, ≥ 0.1), against numpy on the mask's tokens; padding never counts."""
    generator = torch.Generator().manual_seed(3)
    sampler = -torch.rand(6, 40, generator=generator, dtype=torch.float64) * 12  # μ from 6e-6 to 1
    ell = torch.randn(6, 40, generator=generator, dtype=torch.float64) * 1.5
    ell[0, :4] = torch.tensor([1.0, -1.0, 2.0, -2.0])  # the edges count
    learner = sampler + ell
    mask = torch.rand(6, 40, generator=generator) > 0.25
    sampler[~mask] = NAN  # padding may hold anything
    out = stability_metrics(sampler.float(), learner.float(), mask)

    e = (learner.float() - sampler.float()).double().numpy()[mask.numpy()]
    mu = sampler.float().double().numpy()[mask.numpy()]
    assert out["mismatch/tail_frac"].item() == pytest.approx(np.mean(np.abs(e) >= 1.0), abs=1e-7)
    assert out["mismatch/tail_frac_2"].item() == pytest.approx(np.mean(np.abs(e) >= 2.0), abs=1e-7)
    assert out["mismatch/low_tail_frac"].item() == pytest.approx(np.mean(e <= -1.0), abs=1e-7)
    assert 0 < out["mismatch/low_tail_frac"].item() < out["mismatch/tail_frac"].item()
    buckets = {
        "rare": mu < math.log(1e-3),
        "unlikely": (mu >= math.log(1e-3)) & (mu < math.log(0.1)),
        "likely": mu >= math.log(0.1),
    }
    for name, inside in buckets.items():
        assert inside.sum() > 10
        assert out[f"mismatch/log_ratio_abs_{name}"].item() == pytest.approx(np.abs(e[inside]).mean(), rel=1e-5)
    # A bucket without a token has no mean: NaN, not 0.
    likely_only = stability_metrics(torch.full((2, 3), -0.01), torch.full((2, 3), -0.02), None)
    assert math.isnan(likely_only["mismatch/log_ratio_abs_rare"].item())
    assert likely_only["mismatch/log_ratio_abs_likely"].item() == pytest.approx(0.01, rel=1e-4)


def test_sequence_gate_entropy_and_nonfinite() -> None:
    b = hand_batch()
    logits = torch.tensor(
        [[[0.0, 0.0], [0.0, math.log(3.0)], [5.0, -5.0]], [[1.0, 1.0], [0.0, 0.0], [NAN, NAN]]]
    )
    learner = b["learner"].clone()
    learner[0, 1] = -math.inf  # a non-finite valid token counts; NaN padding does not
    out = stability_metrics(
        b["sampler"],
        learner,
        b["mask"],
        gate_mask=torch.tensor([False, True]),
        logits=logits,
        advantages=torch.tensor([NAN, 1.0]),
    )
    assert out["gate/frac"].item() == 0.5
    p = 1 / (1 + math.exp(-10.0))  # softmax of (5, −5)
    entropies = [
        LN2,
        -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)),
        -(p * math.log(p) + (1 - p) * math.log(1 - p)),
        LN2,
        LN2,
    ]
    assert out["policy/entropy"].item() == pytest.approx(sum(entropies) / 5, rel=1e-6)
    assert "policy/entropy_est" not in out
    assert out["nonfinite/count"].item() == 2.0  # −inf log π and the NaN advantage
    assert out["mismatch/ratio_min"].item() == pytest.approx(math.exp(-30.0), rel=1e-5)  # ℓ clamped
    assert nonfinite_count(torch.tensor([1.0, NAN]), torch.tensor([[math.inf]])).item() == 2.0


def test_outputs_are_0dim_float32_on_the_input_device_without_grad() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    b = {k: v.to(device) for k, v in hand_batch().items()}
    learner = b["learner"].clone().requires_grad_(True)
    rewards = torch.ones(2, device=device)
    versions = torch.tensor([1, 2], device=device), torch.tensor(3, device=device)
    if device == "cuda":
        # Any host sync inside would raise here (the inputs are built before: a copy from
        # host memory is one).
        torch.cuda.set_sync_debug_mode("error")
    try:
        out = stability_metrics(
            b["sampler"],
            learner,
            b["mask"],
            rewards=rewards,
            sampler_version=versions[0],
            learner_version=versions[1],
        )
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode(0)
    assert len(out) == 26
    for key, value in out.items():
        assert isinstance(value, torch.Tensor), key
        assert value.shape == () and value.dtype == torch.float32, key
        assert value.device.type == device and not value.requires_grad, key
    assert out["mismatch/ratio_max"].item() == 5.0


def test_leading_dims_reduce_per_slice() -> None:
    generator = torch.Generator().manual_seed(5)
    sampler = -torch.rand(3, 6, 7, generator=generator) * 2
    learner = sampler + 0.2 * torch.randn(3, 6, 7, generator=generator)
    mask = torch.rand(3, 6, 7, generator=generator) > 0.3
    rewards = torch.rand(3, 6, generator=generator)
    for m in (mask, None):
        batched = stability_metrics(
            sampler,
            learner,
            m,
            rewards=rewards,
            sampler_version=torch.zeros(3, 6),
            learner_version=2,
        )
        for i in range(3):
            single = stability_metrics(
                sampler[i],
                learner[i],
                None if m is None else m[i],
                rewards=rewards[i],
                sampler_version=torch.zeros(6),
                learner_version=2,
            )
            for key, value in single.items():
                torch.testing.assert_close(batched[key][i], value, msg=key, equal_nan=True)


def test_bernoulli_kl_clamps_probabilities() -> None:
    d = bernoulli_kl(torch.tensor([math.log(0.3), 0.0]), torch.tensor([math.log(0.6), -100.0]))
    assert d[0].item() == pytest.approx(bkl(0.3, 0.6), rel=1e-5)
    assert d[1].item() == pytest.approx(bkl(1 - 1e-6, 1e-6), rel=1e-3)


def test_grad_norm_is_global_and_keeps_nonfinite() -> None:
    a = torch.nn.Parameter(torch.zeros(2))
    b = torch.nn.Parameter(torch.zeros(1, 1))
    frozen = torch.nn.Parameter(torch.zeros(3))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([[4.0]])
    assert grad_norm([a, b, frozen]).item() == 5.0
    b.grad = torch.tensor([[math.inf]])
    assert grad_norm([a, b]).item() == math.inf
    assert grad_norm([frozen]).item() == 0.0


# Data parallel: two gloo ranks hold different numbers of sequences and tokens.


def _sharded_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(11)
    b, t = 9, 12
    sampler = -torch.rand(b, t, generator=generator) * 3
    learner = sampler + 0.4 * torch.randn(b, t, generator=generator)
    mask = torch.arange(t)[None, :] < torch.randint(1, t + 1, (b, 1), generator=generator)
    return {
        "sampler": torch.where(mask, sampler, NAN),
        "learner": torch.where(mask, learner, NAN),
        "mask": mask,
        "rewards": torch.rand(b, generator=generator),
        "gate": torch.rand(b, t, generator=generator) > 0.8,
        "version": torch.randint(0, 5, (b,), generator=generator),
    }


_SHARDS = (slice(0, 3), slice(3, 9))


def _metrics_of(batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    return stability_metrics(
        batch["sampler"][rows],
        batch["learner"][rows],
        batch["mask"][rows],
        rewards=batch["rewards"][rows],
        gate_mask=batch["gate"][rows],
        sampler_version=batch["version"][rows],
        learner_version=6,
    )


def _rank_main(rank: int, init_file: str, out_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        out = _metrics_of(_sharded_batch(), _SHARDS[rank])
        if rank == 0:
            torch.save(out, out_path)
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_match_the_concatenated_batch() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        init_file, out_path = os.path.join(tmp, "init"), os.path.join(tmp, "out.pt")
        mp.spawn(_rank_main, args=(init_file, out_path), nprocs=2, join=True)
        merged = torch.load(out_path)
    batch = _sharded_batch()
    single = _metrics_of(batch, slice(None))
    shard_0 = _metrics_of(batch, _SHARDS[0])
    assert set(merged) == set(single)
    # The shards really differ, so a mean of per-rank means would be caught.
    assert shard_0["mismatch/kl"].item() != pytest.approx(single["mismatch/kl"].item(), rel=1e-3)
    for key in single:
        if key != "mismatch/log_ratio_p99":
            torch.testing.assert_close(merged[key], single[key], rtol=1e-5, atol=1e-6, msg=key, equal_nan=True)
    # p99 from merged histograms: within one log-spaced bin (~1 %) of the exact value.
    ratio = merged["mismatch/log_ratio_p99"] / single["mismatch/log_ratio_p99"]
    assert abs(math.log10(ratio.item())) <= (math.log10(30.0) + 7) / 2048


def test_merged_partials_are_the_metrics_of_the_concatenated_batches() -> None:
    """Micro-batches of other lengths: merged partials (also packed into one vector and
    back, as the Monitor copies them to the host) give stability_metrics of the batches
    concatenated along the batch dim, padded with mask 0 — p99 included, exactly."""
    generator = torch.Generator().manual_seed(7)
    shapes = [(3, 4), (1, 10), (4, 7)]
    micro = []
    for seqs, length in shapes:
        sampler = -torch.rand(seqs, length, generator=generator) * 3
        micro.append(
            {
                "sampler": sampler,
                "learner": sampler + 0.5 * torch.randn(seqs, length, generator=generator),
                "mask": torch.rand(seqs, length, generator=generator) > 0.3,
                "rewards": torch.rand(seqs, generator=generator),
                "advantages": torch.randn(seqs, generator=generator),
                "gate_mask": torch.rand(seqs, generator=generator) > 0.5,  # per sequence
                "logits": torch.randn(seqs, length, 5, generator=generator),
            }
        )
    length = max(length for _, length in shapes)

    def pad(t: torch.Tensor) -> torch.Tensor:
        if t.dim() < 2:
            return t
        return torch.nn.functional.pad(t, (0, 0) * (t.dim() - 2) + (0, length - t.shape[1]))

    whole = {key: torch.cat([pad(m[key]) for m in micro]) for key in micro[0]}

    def metrics_of(b: dict[str, torch.Tensor], fn):  # type: ignore[no-untyped-def]
        return fn(
            b["sampler"], b["learner"], b["mask"],
            rewards=b["rewards"], advantages=b["advantages"], gate_mask=b["gate_mask"],
            logits=b["logits"],
        )  # fmt: skip

    parts = [metrics_of(m, stability_partials) for m in micro]
    round_trip = [Partials.unpack(*p.pack()) for p in parts]
    expected = metrics_of(whole, stability_metrics)
    for merged in (finalize(merge_partials(parts)), finalize(merge_partials(round_trip))):
        assert set(merged) == set(expected)
        for key, value in expected.items():
            torch.testing.assert_close(merged[key], value, rtol=1e-6, atol=1e-7, msg=key, equal_nan=True)
    assert finalize(merge_partials(parts))["batch/seqs"].item() == 8.0
    assert 0 < expected["mismatch/unbounded_frac"].item() < 1  # the merge is checked on a real share


def test_the_answers_length_against_its_cap() -> None:
    """With max_length, a row's mask tokens are its answer: its length, the longest, the
    share cut at the cap (an empty row is no answer) and the cap itself."""
    from trainer_hooks.batched import compute, concat
    from trainer_hooks.metrics import BatchInputs

    lengths = [3, 5, 6, 0]
    mask = torch.tensor([[1.0 if t < n else 0.0 for t in range(6)] for n in lengths])
    logprobs = torch.full((4, 6), -1.0)
    out = stability_metrics(logprobs, logprobs, mask, max_length=5)
    assert out["response/length_mean"].item() == pytest.approx(14 / 3)
    assert out["response/length_max"].item() == 6
    assert out["response/truncated_frac"].item() == pytest.approx(2 / 3)
    assert out["response/length_cap"].item() == 5
    assert "response/truncated_frac" not in stability_metrics(logprobs, logprobs, mask)
    # Micro-batches of one step join to the whole; batches of two steps stack to each alone.
    halves = [BatchInputs(logprobs[:2], logprobs[:2], mask[:2], max_length=5), BatchInputs(logprobs[2:], logprobs[2:], mask[2:], max_length=5)]
    joined = concat(halves).compute()
    assert joined["response/truncated_frac"].item() == pytest.approx(2 / 3) and joined["response/length_max"].item() == 6
    each = compute(halves)
    assert [row["response/truncated_frac"] for row in each] == [pytest.approx(0.5), pytest.approx(1.0)]
    assert [row["response/length_max"] for row in each] == [5, 6]
    with pytest.raises(ValueError, match="max_length"):
        stability_metrics(logprobs, logprobs, mask, max_length=0)


def test_every_front_takes_exactly_the_batch_inputs_with_their_defaults() -> None:
    """`BatchInputs` is the one list of a step's inputs: `stability_metrics`,
    `stability_partials` and `Monitor.log_batch` are keyword fronts to it, and a field added
    there and not to a front (or a front's default drifting from the field's) fails here."""
    import dataclasses
    import inspect

    from trainer_hooks.metrics import BatchInputs, stability_partials
    from trainer_hooks.monitor import Monitor

    fields = {f.name: f.default for f in dataclasses.fields(BatchInputs)}
    not_metrics = {"token_ids", "seq_ids"}  # the step details' inputs: no metric reads them
    fronts = {
        stability_metrics: ({"quantile"}, not_metrics),
        stability_partials: ({"quantile"}, not_metrics),
        Monitor.log_batch: ({"self", "step", "metrics", "decode"}, set()),
    }
    for front, (own, left_out) in fronts.items():
        params = inspect.signature(front).parameters
        taken = {name: p.default for name, p in params.items() if name not in own}
        expected = {name: default for name, default in fields.items() if name not in left_out}
        assert taken.keys() == expected.keys(), front.__name__
        for name, default in taken.items():
            if name == "mask":  # a front asks for it (None: every token), the object defaults it
                assert default is inspect.Parameter.empty, front.__name__
            elif expected[name] is dataclasses.MISSING:
                assert default is inspect.Parameter.empty, (front.__name__, name)
            else:
                assert default == expected[name], (front.__name__, name)

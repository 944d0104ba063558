"""batched.compute: several steps' stability metrics in one call equal each step's alone."""

from __future__ import annotations

import math

import pytest
import torch

from trainer_hooks.batched import compute, concat
from trainer_hooks.metrics import BatchInputs, stability_metrics


def batch(seed: int, seqs: int, length: int, **extra: bool) -> dict[str, object]:
    generator = torch.Generator().manual_seed(seed)
    sampler = -torch.rand(seqs, length, generator=generator) * 3
    inputs: dict[str, object] = {
        "sampler_logprobs": sampler,
        "learner_logprobs": sampler + 0.3 * torch.randn(seqs, length, generator=generator),
        "mask": torch.rand(seqs, length, generator=generator) > 0.25,
        "rewards": torch.rand(seqs, generator=generator),
        "sampler_version": torch.randint(0, 5, (seqs,), generator=generator),
        "learner_version": 5 + seed,
    }
    if extra.get("token_gate"):
        inputs["gate_mask"] = torch.rand(seqs, length, generator=generator) > 0.8
        inputs["advantages"] = torch.randn(seqs, length, generator=generator)
    if extra.get("logits"):
        inputs["logits"] = torch.randn(seqs, length, 11, generator=generator)
    return inputs


def alone(inputs: dict[str, object]) -> dict[str, float]:
    args = dict(inputs)
    tensors = (args.pop("sampler_logprobs"), args.pop("learner_logprobs"), args.pop("mask"))
    return {k: v.item() for k, v in stability_metrics(*tensors, **args).items()}  # type: ignore[arg-type]


def test_ragged_batches_of_mixed_kinds_match_each_batch_alone() -> None:
    inputs = [
        batch(0, 6, 9),
        batch(1, 4, 13),  # fewer sequences, longer: padded both ways
        batch(2, 6, 9, token_gate=True),  # another kind of inputs: its own group
        batch(3, 7, 2),
        batch(4, 3, 5, logits=True),
        batch(5, 6, 9, token_gate=True),
        {**batch(6, 5, 8), "mask": None},  # no mask: every token counts
    ]
    results = compute([BatchInputs(**b) for b in inputs])  # type: ignore[arg-type]
    for index, (got, b) in enumerate(zip(results, inputs, strict=True)):
        expected = alone(b)
        assert got.keys() == expected.keys(), index
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7, nan_ok=True), (index, key)
    assert results[0]["staleness/lag_max"] == alone(inputs[0])["staleness/lag_max"]
    assert "policy/entropy" in results[4] and "gate/frac" in results[2]


def test_a_bad_batch_costs_only_its_own_metrics() -> None:
    good, other = batch(0, 4, 6), batch(1, 5, 6)
    bad = {**batch(2, 4, 6), "rewards": torch.rand(3)}  # wrong length: cannot broadcast
    warnings: list[str] = []
    results = compute(
        [BatchInputs(**b) for b in (good, bad, other)],  # type: ignore[arg-type]
        warn=lambda what, message: warnings.append(message),
    )
    assert results[1] == {} and len(warnings) == 1
    assert results[0]["mismatch/kl"] == pytest.approx(alone(good)["mismatch/kl"], rel=1e-6)
    assert results[2]["mismatch/kl"] == pytest.approx(alone(other)["mismatch/kl"], rel=1e-6)


def test_copies_do_not_follow_the_callers_buffers() -> None:
    inputs = batch(0, 4, 6)
    copied = BatchInputs(**inputs).copy()  # type: ignore[arg-type]
    inputs["learner_logprobs"].fill_(math.nan)  # type: ignore[union-attr]
    assert math.isfinite(compute([copied])[0]["mismatch/kl"])


def padded_concat(inputs: list[dict[str, object]]) -> dict[str, object]:
    """The batches concatenated along the batch dim, padded to the longest with mask 0."""
    length = max(b["learner_logprobs"].shape[1] for b in inputs)  # type: ignore[attr-defined]
    out: dict[str, object] = {}
    for key, first in inputs[0].items():
        if not isinstance(first, torch.Tensor):
            out[key] = first
            continue
        parts = []
        for b in inputs:
            value = b[key]
            assert isinstance(value, torch.Tensor)
            if value.dim() >= 2:
                value = torch.nn.functional.pad(
                    value, (0, 0) * (value.dim() - 2) + (0, length - value.shape[1])
                )
            parts.append(value)
        out[key] = torch.cat(parts)
    return out


def test_concat_of_micro_batches_has_the_metrics_of_the_whole_step() -> None:
    micro = [
        batch(0, 3, 5, token_gate=True),
        batch(0, 2, 11, token_gate=True),
        batch(0, 1, 2, token_gate=True),
    ]
    for b in micro:
        b["learner_version"] = 9
    joined = concat([BatchInputs(**b) for b in micro])  # type: ignore[arg-type]
    assert joined.learner_logprobs.shape == (6, 11)
    got = {k: v.item() for k, v in joined.compute().items()}
    expected = alone(padded_concat(micro))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-7, nan_ok=True), key
    assert got["batch/seqs"] == 6.0 and joined.learner_version == 9


def test_concat_keeps_each_micro_batch_learner_version_and_still_stacks() -> None:
    """Micro-batches trained at other versions: the lag is per sequence, and the joined
    batch stacks with other steps' batches in one compute() call."""
    micro = [batch(1, 2, 4), batch(2, 3, 6)]  # learner versions 6 and 7
    joined = concat([BatchInputs(**b) for b in micro])  # type: ignore[arg-type]
    assert isinstance(joined.learner_version, torch.Tensor)
    assert joined.learner_version.tolist() == [6, 6, 7, 7, 7]
    other = concat([BatchInputs(**b) for b in (batch(3, 4, 5), batch(4, 1, 5))])  # type: ignore[arg-type]
    results = compute([joined, other])
    whole = padded_concat(micro)
    sampler_version = whole["sampler_version"]
    assert isinstance(sampler_version, torch.Tensor)
    lag = torch.tensor([6, 6, 7, 7, 7]) - sampler_version
    assert results[0]["staleness/lag_max"] == lag.max().item()
    assert results[0]["staleness/lag_mean"] == pytest.approx(lag.double().mean().item())
    expected_other = alone(padded_concat([batch(3, 4, 5), batch(4, 1, 5)]))
    for key in ("mismatch/kl", "batch/seqs"):
        assert results[0][key] == pytest.approx(
            alone({**whole, "learner_version": 7})[key], rel=1e-6
        )
        assert results[1][key] == pytest.approx(expected_other[key], rel=1e-6)


def test_concat_refuses_micro_batches_of_other_kinds() -> None:
    with pytest.raises(ValueError, match="different kinds"):
        concat([BatchInputs(**batch(0, 2, 3)), BatchInputs(**batch(1, 2, 3, logits=True))])  # type: ignore[arg-type]

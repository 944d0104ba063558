"""Planted step details (docs/protocol.md, "Step details"): rows shaped like a run whose
sampler–learner mismatch widens over the steps, built from a seed so a test knows every count."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

_MAGNITUDES = [float(f"{10 ** (-4 + i / 5):.6g}") for i in range(26)]
EDGES = [*(-m for m in reversed(_MAGNITUDES)), *_MAGNITUDES]
"""The Monitor's signed-log edges: ±10^(−4 … 1) at five bins per decade and one bin
[−10⁻⁴, 10⁻⁴) around zero, 51 bins; values beyond ±10 count in the end bins."""

WORDS = (
    "The", " answer", " is", " 42", ".", " Let", " us", " check", ":", " 6", " ×", " 7", " =", " 42", "\n",
    " so", " the", " result", " holds", " because", " each", " step", " follows", " from", " the", " last",
)


def histogram(values: np.ndarray) -> list[int]:
    """Counts of `values` in the EDGES bins, values outside in the end bins (as the wire says)."""
    clipped = np.clip(values, EDGES[0], EDGES[-1])
    return [int(c) for c in np.histogram(clipped, bins=np.array(EDGES))[0]]


def step_ell(step: int, tokens: int, rng: np.random.Generator) -> np.ndarray:
    """ℓ of a step's tokens: a narrow core of numerical noise, and a heavy tail that widens with the step."""
    core = rng.normal(0.0, 2e-3 * (1 + step / 40), size=tokens)
    tail = rng.laplace(0.0, 0.05 * math.exp(step / 60), size=tokens // 20)
    spikes = rng.exponential(1.0 + step / 25, size=max(1, step // 10))
    return np.concatenate([core, tail, spikes])


def sample(rank: int, step: int, rng: np.random.Generator, *, worst_ell: float) -> dict[str, Any]:
    """One of a step's worst sequences: 24 tokens around its worst token (ℓ = worst_ell)."""
    length = 600 + 40 * rank
    start = 200 + rank
    shown = 24
    sampler = (-rng.exponential(0.8, size=shown)).tolist()
    ell = rng.normal(0.0, 0.05, size=shown)
    worst_at = 11
    ell[worst_at] = worst_ell
    sampler[worst_at] = -worst_ell - 0.4  # a token the sampler thought unlikely, the learner likely
    learner = [min(-1e-4, s + e) for s, e in zip(sampler, ell.tolist(), strict=True)]
    log_ratio = [lp - sp for lp, sp in zip(learner, sampler, strict=True)]
    tokens = [WORDS[(rank * 7 + i) % len(WORDS)] for i in range(shown)]
    tokens[worst_at] = f" WORST{rank}"
    return {
        "seq_id": f"s{step}-{rank}",
        "version": step - 2,
        "reward": 0.0,
        "advantage": -0.75,
        "length": length,
        "seq_log_ratio": round(sum(log_ratio) + 0.3 * rank, 6),
        "max_log_ratio": max(log_ratio),
        "start": start,
        "worst": start + worst_at,
        "tokens": tokens,
        "token_ids": [1000 + i for i in range(shown)],
        "log_ratio": log_ratio,
        "sampler_logprob": sampler,
        "learner_logprob": learner,
    }


def sequences(step: int, count: int, rng: np.random.Generator) -> dict[str, list[Any]]:
    """(length, Σℓ) of a step's sequences: Σℓ drifts with length, the drift growing with the step."""
    lengths = rng.integers(80, 4000, size=count)
    slope = -(0.4 + step / 100) / 1000
    sums = slope * lengths + rng.normal(0.0, 0.3, size=count)
    return {"length": [int(n) for n in lengths], "log_ratio": [float(s) for s in sums]}


def detail_rows(
    steps: range, *, seed: int = 0, samples_every: int = 1, tokens: int = 4000, sequences_per_step: int = 64
) -> list[dict[str, Any]]:
    """Rows with values (mismatch/tail_frac among them), both histograms, samples every
    `samples_every` steps (the worst with max ℓ = 3 + step / 50) and `sequences_per_step`
    (length, Σℓ) pairs."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in steps:
        ell = step_ell(step, tokens, rng)
        advantage_negative = rng.random(ell.size) < 0.5
        unbounded = ell[advantage_negative & (ell > 0)]
        row: dict[str, Any] = {
            "step": step,
            "time": time.time(),
            "values": {
                "reward/mean": 0.3 + 0.4 * math.tanh(step / 60),
                "mismatch/kl": float(np.mean(np.exp(-ell) - 1 + ell)),
                "mismatch/tail_frac": float(np.mean(np.abs(ell) >= 1)),
            },
            "histograms": {
                "mismatch/log_ratio": {"edges": EDGES, "counts": histogram(ell)},
                "mismatch/log_ratio_unbounded": {"edges": EDGES, "counts": histogram(unbounded)},
            },
            "sequences": sequences(step, sequences_per_step, rng),
        }
        if step % samples_every == 0:
            row["samples"] = [sample(rank, step, rng, worst_ell=3.0 + step / 50 - rank * 0.5) for rank in range(4)]
        rows.append(row)
    return rows

"""The alert corpus: real-learner runs over the settings people train with, drawn per seed.

`keel lm-corpus --seeds 100-111 --json fit.json` runs, for every seed, one run per entry
of MIX (PPO four times and importance sampling twice, because on this learner those are
the losses that collapse; CISPO, TIS, MIS and FlashREINFORCE once each: ten runs per
seed), each with its settings drawn from the seed:

- lag: half the time uniform in 0..16, half the time in 2..8, where runs collapse;
- sampler dtype bf16 or fp32;
- learning rate 1e-3 (1/4), 2e-3 (1/2) or 3e-3 (1/4) (AdamW);
- gradient clipping off (3/4) or at norm 1;
- task difficulty: 3 or 4 digits to sort (5 and more do not reach a reward of 0.5, so
  cannot collapse, within the 500 steps a corpus run has).

Every loss uses GRPO's group advantages (reward minus the mean of the prompt's 8
samples). The draw depends only on the seed, so one command regenerates a corpus
exactly on one machine (the learner itself is chaotic across floating-point kernels,
docs/alerts.md). Run seeds are `10 * seed + index`, so no two runs share one.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from learners.lm.learner import LMConfig

__all__ = [
    "CLIPS", "COLLAPSING_LAGS", "DIGITS", "LAGS", "LRS", "MIX", "REGIME_BATCHES", "REGIME_LRS", "REGIME_MIX",
    "REGIME_STEPS", "corpus_configs", "regime_configs",
]  # fmt: skip

MIX = ("ppo", "ppo", "ppo", "ppo", "importance_sampling", "importance_sampling",
       "cispo", "tis", "mis", "flash_reinforce")  # fmt: skip
LAGS = range(0, 17)
COLLAPSING_LAGS = range(2, 9)
LRS = ((1e-3, 1), (2e-3, 2), (3e-3, 1))
CLIPS = ((0.0, 3), (1.0, 1))
"""(max grad norm, weight); 0 is no clipping."""
DIGITS = (3, 4)
DTYPES = ("bf16", "fp32")


def _weighted(rng: random.Random, choices: Sequence[tuple[float, int]]) -> float:
    return rng.choices([value for value, _ in choices], weights=[weight for _, weight in choices])[0]


def corpus_configs(base: LMConfig, seeds: Sequence[int], mix: Sequence[str] = MIX) -> list[LMConfig]:
    """Per seed, one config per entry of `mix`, settings drawn from `random.Random(seed)`."""
    configs = []
    for seed in seeds:
        rng = random.Random(seed)
        for index, loss in enumerate(mix):
            lag = rng.choice(LAGS if rng.random() < 0.5 else COLLAPSING_LAGS)
            configs.append(
                replace(
                    base, loss=loss, lag=lag, sampler_dtype=rng.choice(DTYPES), lr=_weighted(rng, LRS),
                    clip=_weighted(rng, CLIPS), digits=rng.choice(DIGITS), seed=10 * seed + index,
                )  # fmt: skip
            )
    return configs


# -- the regime corpus (`keel lm-regimes`) ----------------------------------------------

REGIME_MIX = (
    "ppo", "importance_sampling", "gspo", "flash_reinforce", "dro",
    "cispo", "tis", "mis", "cispo_floor", None,
)  # fmt: skip
"""Per seed, one run per entry: the unbounded losses, the bounded ones, and (None) a loss
that ignores the ratio, reinforce or stable_proxy by the seed's parity. Every loss of
trainer_hooks.losses is in the corpus."""
REGIME_LRS = (5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3)
REGIME_DIGITS = (2, 3, 4, 5)
REGIME_BATCHES = ((16, 8), (8, 16), (32, 4), (8, 8))
"""(prompts, samples per prompt)."""
REGIME_CLIPS = (0.0, 0.5, 1.0, 2.0)
REGIME_DTYPES = ("bf16", "fp16", "fp32")
SMALL_SHARE = 0.05
"""Share of the runs on the small model (five times the tiny one's CPU per step), given at
most 3 digits: at 4 the small model does not reach a reward of 0.5 within a corpus run."""
REGIME_STEPS = 600
"""Scored until 150 steps before the end; a fall needs 100 steps after it to be judged."""


def regime_configs(base: LMConfig, seeds: Sequence[int]) -> list[LMConfig]:
    """The regime corpus: per seed, one config per entry of REGIME_MIX, every other axis
    drawn from `random.Random(seed)` (learning rate, task difficulty, model size, batch
    shape, clipping, lag 0–16, sampler dtype). Run seeds are `10 * seed + index`."""
    configs = []
    for seed in seeds:
        rng = random.Random(seed)
        for index, loss in enumerate(REGIME_MIX):
            small = rng.random() < SMALL_SHARE
            prompts, group = rng.choice(REGIME_BATCHES)
            configs.append(
                replace(
                    base, loss=loss or ("reinforce", "stable_proxy")[seed % 2],
                    lag=rng.choice(LAGS if rng.random() < 0.5 else range(2, 11)),
                    sampler_dtype=rng.choice(REGIME_DTYPES), lr=rng.choice(REGIME_LRS),
                    clip=rng.choice(REGIME_CLIPS),
                    digits=rng.choice(REGIME_DIGITS[:2] if small else REGIME_DIGITS),
                    size="small" if small else "tiny", prompts=prompts, group=group,
                    seed=10 * seed + index,
                )  # fmt: skip
            )
    return configs

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
    "ppo", "ppo", "importance_sampling", "gspo", "flash_reinforce", "dro",
    "cispo", "tis", "mis", None,
)  # fmt: skip
"""Per seed, one run per entry: PPO twice (on this learner the loss that collapses most), the
other unbounded losses, the bounded ones, and (None) by the seed modulo 3 CISPO with a floor,
REINFORCE or the stable proxy (ratio-free). Every loss of trainer_hooks.losses is in it."""
OTHER_LOSSES = ("cispo_floor", "reinforce", "stable_proxy")
REGIME_LRS = ((5e-4, 1), (1e-3, 2), (1.5e-3, 2), (2e-3, 2), (3e-3, 2), (5e-3, 1))
"""(learning rate, weight): 5e-3 rarely learns before it diverges, 5e-4 rarely falls."""
REGIME_DIGITS = ((2, 3), (3, 4), (4, 2), (5, 1))
"""(digits, weight): at 5 digits few runs reach a reward of 0.5 within a corpus run."""
REGIME_BATCHES = ((16, 8), (8, 16), (32, 4), (8, 8))
"""(prompts, samples per prompt)."""
REGIME_CLIPS = ((0.0, 6), (0.5, 1), (1.0, 1), (2.0, 2))
"""(max grad norm, weight): clipping at 1 or below rarely lets a run collapse."""
REGIME_DTYPES = ("bf16", "fp16", "fp32")
SMALL_SHARE = 0.05
"""Share of the runs on the small model (five times the tiny one's CPU per step), given at
most 3 digits: at 4 the small model does not reach a reward of 0.5 within a corpus run."""
REGIME_STEPS = 1000
"""Scored until 150 steps before the end; a fall needs 100 steps after it to be judged. At
600 steps most runs that learn are still climbing at the end (0 lasting collapses in 29)."""


def regime_configs(base: LMConfig, seeds: Sequence[int]) -> list[LMConfig]:
    """The regime corpus: per seed, one config per entry of REGIME_MIX, every other axis
    drawn from `random.Random(seed)` (learning rate, task difficulty, model size, batch
    shape, clipping, lag, sampler dtype), tilted towards the settings where runs learn and
    then fall, while every value of every axis keeps its runs. Run seeds are `10 * seed + index`."""
    configs = []
    for seed in seeds:
        rng = random.Random(seed)
        for index, loss in enumerate(REGIME_MIX):
            small = rng.random() < SMALL_SHARE
            prompts, group = rng.choice(REGIME_BATCHES)
            digits = int(_weighted(rng, REGIME_DIGITS[:2] if small else REGIME_DIGITS))
            configs.append(
                replace(
                    base, loss=loss or OTHER_LOSSES[seed % 3],
                    lag=rng.choice(LAGS if rng.random() < 0.25 else range(2, 13)),
                    sampler_dtype=rng.choice(REGIME_DTYPES), lr=_weighted(rng, REGIME_LRS),
                    clip=_weighted(rng, REGIME_CLIPS), digits=digits,
                    size="small" if small else "tiny", prompts=prompts, group=group,
                    seed=10 * seed + index,
                )  # fmt: skip
            )
    return configs
